"""Trace settings as Triton keeps them: one global set, per-model overrides, and their validation.

Settings are strings on the wire (the trace extension's `{"trace_rate": "1000", "trace_level": ["TIMESTAMPS"]}`)
and typed here. A model's override holds only the keys it set; clearing a key (an empty value) falls back to the
global value again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from service.errors import ErrorCode, ServiceError

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
log = logging.getLogger("trireme.trace")
KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")


@dataclass(slots=True)
class TraceSettings:
    """One complete set of trace settings (Triton's defaults)."""

    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1  # traces left to collect; -1 = no limit
    log_frequency: int = 0  # 0: write the file at exit; N: write every N traces to <file>.<index>
    file: str = ""
    mode: str = "triton"

    @property
    def enabled(self) -> bool:
        """Whether requests are sampled at all under these settings."""
        return self.level != ("OFF",) and self.rate > 0 and self.count != 0

    def as_wire(self) -> dict[str, list[str]]:
        """The settings as the trace extension returns them (every value a list of strings)."""
        return {
            "trace_file": [self.file],
            "trace_level": list(self.level),
            "trace_rate": [str(self.rate)],
            "trace_count": [str(self.count)],
            "log_frequency": [str(self.log_frequency)],
            "trace_mode": [self.mode],
        }


@dataclass(slots=True)
class OtelSettings:
    """`--trace-config opentelemetry,<key>=<value>` settings (not changeable at run time, as in Triton)."""

    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "triton-inference-server"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512


def _int(key: str, values: list[str], minimum: int) -> int:
    if len(values) != 1:
        raise ServiceError(ErrorCode.INVALID_ARG, f"expecting a single value for '{key}'")
    text = values[0].strip()
    if not text.lstrip("-").isascii() or not text.lstrip("-").isdigit():
        raise ServiceError(ErrorCode.INVALID_ARG, f"Unable to parse '{key}', got: {values[0]}")
    value = int(text)
    if value < minimum:
        raise ServiceError(ErrorCode.INVALID_ARG, f"'{key}' must be >= {minimum}, got: {value}")
    return value


def parse_level(values: list[str]) -> tuple[str, ...]:
    """TIMESTAMPS and/or TENSORS, or OFF alone."""
    levels = []
    for value in values:
        level = value.strip().upper()
        if level not in LEVELS:
            raise ServiceError(ErrorCode.INVALID_ARG, f"unsupported trace level '{value}'")
        if level not in levels:
            levels.append(level)
    if not levels or (len(levels) > 1 and "OFF" in levels):
        levels = [level for level in levels if level != "OFF"] or ["OFF"]
    return tuple(levels)


def apply_update(base: TraceSettings, updates: dict[str, list[str]], *, from_network: bool) -> TraceSettings:
    """`base` with the given keys changed; raises ServiceError (INVALID_ARG / UNSUPPORTED) for bad values."""
    result = replace(base)
    for key, values in updates.items():
        if key == "trace_level":
            result.level = parse_level(values)
        elif key == "trace_rate":
            result.rate = _int(key, values, 0)
        elif key == "trace_count":
            result.count = _int(key, values, -1)
        elif key == "log_frequency":
            result.log_frequency = _int(key, values, 0)
        elif key == "trace_file":
            if from_network:
                raise ServiceError(
                    ErrorCode.UNSUPPORTED, "trace file location can not be updated through network protocol"
                )
            result.file = values[0] if values else ""
        elif key == "trace_mode":
            if from_network:
                raise ServiceError(ErrorCode.UNSUPPORTED, "trace mode can not be updated through network protocol")
            mode = values[0] if values else ""
            if mode not in MODES:
                raise ServiceError(ErrorCode.INVALID_ARG, f"unsupported trace mode '{mode}'")
            result.mode = mode
        else:
            raise ServiceError(ErrorCode.INVALID_ARG, f"unknown trace setting '{key}'")
    return result


_CLI_KEYS = {
    "level": "trace_level",
    "rate": "trace_rate",
    "count": "trace_count",
    "mode": "trace_mode",
    "file": "trace_file",
    "log-frequency": "log_frequency",
    "log_frequency": "log_frequency",
}


def parse_trace_config(entries: list[str], warn: bool = False) -> tuple[TraceSettings, OtelSettings]:
    """Settings from `--trace-config [triton|opentelemetry,]<key>=<value>` entries; raises ValueError for a
    malformed entry or value. A key Triton's parser skips without a word (a global `log_frequency`, a triton-mode
    key other than file/log-frequency) is skipped here too, so a Triton command line starts; with `warn`, each
    gets one warning naming what it probably meant."""
    settings = TraceSettings()
    otel = OtelSettings()
    levels: list[str] = []
    resource_given = False
    for entry in entries:
        scope, _, setting = entry.partition(",") if entry.split(",", 1)[0] in MODES else ("", "", entry)
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"--trace-config expects [mode,]<setting>=<value>, got '{entry}'")
        if scope == "opentelemetry" and key not in ("file", "log-frequency", "log_frequency"):
            resource_given = _otel_setting(otel, key, value, resource_given)
            continue
        known = ("level", "rate", "count", "mode") if scope == "" else ("file", "log-frequency", "log_frequency")
        if key not in known:
            if warn:
                _warn_ignored(scope, key, value)
            continue
        if key == "level":
            levels.append(value)
            continue
        try:
            settings = apply_update(settings, {_CLI_KEYS[key]: [value]}, from_network=False)
        except ServiceError as e:
            raise ValueError(e.message) from None
    if levels:
        try:
            settings.level = parse_level(levels)
        except ServiceError as e:
            raise ValueError(e.message) from None
    return settings, otel


def _warn_ignored(scope: str, key: str, value: str) -> None:
    where = "global" if scope == "" else scope
    hint = ""
    if key in ("file", "log-frequency", "log_frequency") and scope == "":
        hint = f"; did you mean 'triton,{key.replace('_', '-')}={value}'?"
    log.warning(
        "ignoring --trace-config %s setting '%s=%s' (Triton ignores it too; %s keys: %s)%s",
        where,
        key,
        value,
        where,
        "level, rate, count, mode" if scope == "" else "file, log-frequency",
        hint,
    )


def _otel_setting(otel: OtelSettings, key: str, value: str, resource_given: bool) -> bool:
    if key == "url":
        otel.url = value
    elif key == "resource":
        name, sep, attr = value.partition("=")
        if not sep:
            raise ValueError(f"opentelemetry resource expects <key>=<value>, got '{value}'")
        if not resource_given:
            otel.resource = {"service.name": "triton-inference-server"}
        otel.resource[name] = attr
        return True
    elif key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"opentelemetry {key} must be a number, got '{value}'")
        setattr(otel, key if key != "bsp_schedule_delay" else "bsp_schedule_delay_ms", int(value))
    else:
        raise ValueError(f"unknown opentelemetry trace setting '{key}'")
    return resource_given
