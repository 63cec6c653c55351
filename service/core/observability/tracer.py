"""Request tracing: sampling by Triton's trace settings, per-request timestamps, and where finished traces go.

A traced request carries a `Trace` (`InferRequest.trace`); untraced requests carry None and cost one attribute
check per stage. Timestamps are monotonic ns (Triton's steady clock). Finished traces are written as Triton's
JSON trace file (mode `triton`) or handed to the OpenTelemetry exporter (mode `opentelemetry`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import orjson

from service.core.observability.trace_settings import OtelSettings, TraceSettings, apply_update
from service.errors import ErrorCode, ServiceError

log = logging.getLogger("trireme.trace")

# Triton's activity names for TENSORS-level records
TENSOR_QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"


def _write_file(path: str, records: list[dict[str, Any]]) -> None:
    try:
        with open(path, "wb") as f:
            f.write(orjson.dumps(records))
    except OSError as e:
        log.error("cannot write trace file '%s': %s", path, e)


class Trace:
    """The trace of one request (or of one ensemble step / BLS call, linked to its parent by parent_id)."""

    __slots__ = (
        "children",
        "id",
        "model_name",
        "model_version",
        "parent",
        "parent_id",
        "remote_parent",
        "request_id",
        "stamps",
        "tensors",
        "tracer",
        "with_tensors",
        "with_timestamps",
    )

    def __init__(
        self, tracer: Tracer, trace_id: int, model_name: str, settings: TraceSettings, parent: Trace | None = None
    ) -> None:
        self.tracer = tracer
        self.id = trace_id
        self.parent = parent
        self.parent_id = parent.id if parent is not None else 0
        self.model_name = model_name
        self.model_version = -1
        self.request_id = ""
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[dict[str, Any]] = []
        self.children: list[Trace] = []
        self.with_timestamps = "TIMESTAMPS" in settings.level or parent is not None
        self.with_tensors = "TENSORS" in settings.level
        self.remote_parent: str = ""  # W3C traceparent of the caller (OpenTelemetry mode)

    def stamp(self, name: str, ns: int = 0) -> None:
        """Record timestamp `name` (now, unless `ns` is given)."""
        self.stamps.append((name, ns or time.monotonic_ns()))

    def tensor(self, activity: str, name: str, datatype: str, shape: list[int], data: Any) -> None:
        """Record a tensor's contents (TENSORS level only); `data` is a numpy array or None."""
        if not self.with_tensors:
            return
        text = "" if data is None else ",".join(str(v) for v in data.reshape(-1).tolist())
        self.tensors.append(
            {
                "id": self.id,
                "activity": activity,
                "tensor": {"name": name, "data": text, "shape": ",".join(map(str, shape)), "dtype": datatype},
            }
        )

    def child(self, model_name: str) -> Trace:
        """A trace for a request this one causes (ensemble step, BLS call), linked by parent_id."""
        return self.tracer.open_child(self, model_name)

    def finish(self) -> None:
        """The request is answered: hand the trace to its destination (idempotent)."""
        self.tracer.finish(self)

    def records(self) -> list[dict[str, Any]]:
        """This trace in Triton's JSON trace-file form."""
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name, "model_version": self.model_version}
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent_id:
            head["parent_id"] = self.parent_id
        out = [head]
        if self.stamps:
            ordered = sorted(self.stamps, key=lambda stamp: stamp[1])  # compute stamps arrive after REQUEST_END
            out.append({"id": self.id, "timestamps": [{"name": n, "ns": ns} for n, ns in ordered]})
        out.extend(self.tensors)
        return out


class Tracer:
    """Sampling state, the global and per-model settings, and the sink for finished traces."""

    def __init__(
        self,
        settings: TraceSettings,
        otel: OtelSettings | None = None,
        known_model: Callable[[str], bool] = lambda name: True,
        make_exporter: Callable[[OtelSettings], Any] | None = None,
    ) -> None:
        self.global_settings = settings
        self.startup_settings = replace(settings)  # what clearing a global key restores (--trace-config)
        # builds the OpenTelemetry exporter on first use (mode opentelemetry); passed in (otel_export.OtelExporter)
        # because that module reads Trace trees from here
        self.make_exporter = make_exporter
        self.otel_settings = otel or OtelSettings()
        self._overrides: dict[str, dict[str, list[str]]] = {}
        self._model_settings: dict[str, TraceSettings] = {}
        self._counters: dict[int, int] = {}  # id(settings object) -> requests seen since the last sample
        self._ids = itertools.count(1)
        self._open: dict[int, Trace] = {}  # traces still running, by id (BLS children find their parent)
        self._done: list[dict[str, Any]] = []
        self._done_roots = 0  # finished top-level traces in _done (log_frequency counts those)
        self._file_index = 0
        self._writer: ThreadPoolExecutor | None = None  # trace files are written off the event loop
        self._lock = threading.Lock()
        self._otel: Any = None
        self.known_model = known_model  # per-model settings only for models of the repository
        self.enabled = False
        self._refresh()

    # ---- settings --------------------------------------------------------------------------------------
    def settings_for(self, model_name: str) -> TraceSettings:
        """The settings a request for `model_name` is sampled under."""
        return self._model_settings.get(model_name, self.global_settings)

    def setting(self, model_name: str = "", updates: dict[str, list[str] | None] | None = None) -> dict[str, Any]:
        """The trace extension: apply `updates` (None or [] clears a model's key), return the settings."""
        if model_name and not self.known_model(model_name):
            raise ServiceError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model_name}")
        if updates:
            if self.global_settings.mode == "opentelemetry":
                raise ServiceError(
                    ErrorCode.UNSUPPORTED, "trace settings can not be updated at run time in opentelemetry mode"
                )
            if model_name:
                self._update_model(model_name, updates)
            else:
                self._update_global(updates)
        settings = self.settings_for(model_name) if model_name else self.global_settings
        return settings.as_wire()

    def _update_global(self, updates: dict[str, list[str] | None]) -> None:
        startup = self.startup_settings.as_wire()
        changes: dict[str, list[str]] = {}
        for key, values in updates.items():
            if values:
                changes[key] = values
            elif key != "trace_file":  # clearing a global key restores what the server started with, as Triton
                changes[key] = startup[key]
        self.global_settings = apply_update(self.global_settings, changes, from_network=True)
        for name in list(self._overrides):
            self._model_settings[name] = apply_update(self.global_settings, self._overrides[name], from_network=True)
        self._refresh()

    def _update_model(self, model_name: str, updates: dict[str, list[str] | None]) -> None:
        overrides = dict(self._overrides.get(model_name, {}))
        for key, values in updates.items():
            if values:
                overrides[key] = values
            else:
                overrides.pop(key, None)
        settings = apply_update(self.global_settings, overrides, from_network=True)  # validates first
        if overrides:
            self._overrides[model_name] = overrides
            self._model_settings[model_name] = settings
        else:
            self._overrides.pop(model_name, None)
            self._model_settings.pop(model_name, None)
        self._refresh()

    def _refresh(self) -> None:
        scopes = [self.global_settings, *self._model_settings.values()]
        self.enabled = any(s.enabled for s in scopes) or (
            self.global_settings.mode == "opentelemetry" and self.global_settings.level != ("OFF",)
        )

    # ---- sampling --------------------------------------------------------------------------------------
    def sample(self, model_name: str, traceparent: str = "") -> Trace | None:
        """A new Trace when this request is to be traced, else None."""
        settings = self.settings_for(model_name)
        if settings.level == ("OFF",):
            return None
        propagated = bool(traceparent) and settings.mode == "opentelemetry"
        if not propagated:
            if settings.rate <= 0 or settings.count == 0:
                return None
            with self._lock:
                key = id(settings)
                seen = self._counters.get(key, 0) + 1
                if seen < settings.rate:
                    self._counters[key] = seen
                    return None
                self._counters[key] = 0
                if settings.count > 0:
                    settings.count -= 1
                    if settings.count == 0:
                        self._refresh()
        trace = Trace(self, next(self._ids), model_name, settings)
        trace.remote_parent = traceparent
        self._open[trace.id] = trace
        return trace

    def open_child(self, parent: Trace, model_name: str) -> Trace:
        """A child trace of `parent` (always traced once the parent is)."""
        child = Trace(self, next(self._ids), model_name, self.settings_for(parent.model_name), parent)
        child.with_tensors = parent.with_tensors
        parent.children.append(child)
        self._open[child.id] = child
        return child

    def find(self, trace_id: int) -> Trace | None:
        """A trace still in flight (BLS requests name their parent by id)."""
        return self._open.get(trace_id)

    # ---- output ----------------------------------------------------------------------------------------
    def finish(self, trace: Trace) -> None:
        """Collect a finished trace; write the file every `log_frequency` traces (0: at close)."""
        if self._open.pop(trace.id, None) is None:
            return
        settings = self.settings_for(trace.model_name)
        if settings.mode == "opentelemetry":
            if trace.parent is None:  # the whole tree leaves as spans once its root is done
                self._exporter().export(trace)
            return
        with self._lock:
            self._done.extend(trace.records())
            if trace.parent is None:
                self._done_roots += 1
            if settings.log_frequency and settings.file and self._done_roots >= settings.log_frequency:
                self._write(f"{settings.file}.{self._file_index}")
                self._file_index += 1

    def _write(self, path: str) -> None:
        """Hand the collected records to the writer thread (encoding thousands of traces takes milliseconds)."""
        records, self._done, self._done_roots = self._done, [], 0
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-writer")
        self._writer.submit(_write_file, path, records)

    def _exporter(self) -> Any:
        if self._otel is None:
            if self.make_exporter is None:
                raise ServiceError(ErrorCode.UNSUPPORTED, "opentelemetry tracing needs an exporter")
            self._otel = self.make_exporter(self.otel_settings)
        return self._otel

    def close(self) -> None:
        """Write what is left (Triton writes the trace file at exit when log_frequency is 0)."""
        with self._lock:
            settings = self.global_settings
            if self._done and settings.file:
                path = settings.file if not settings.log_frequency else f"{settings.file}.{self._file_index}"
                self._write(path)
        if self._writer is not None:
            self._writer.shutdown(wait=True)
        if self._otel is not None:
            self._otel.shutdown()
