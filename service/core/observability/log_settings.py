"""Triton's log settings (LogSettings RPC) mapped onto Python logging of the server process."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from service.core.observability.log_output import FORMATS, set_format
from service.errors import ErrorCode, ServiceError

LogValue = bool | int | str


@dataclass(slots=True)
class LogSettings:
    """The six keys Triton reports; changing them adjusts the root logger's level."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, LogValue]:
        """Every key with its current value (the RPC always returns all six)."""
        return {
            "log_file": self.log_file,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
            "log_verbose_level": self.log_verbose_level,
            "log_format": self.log_format,
        }

    def update(self, changes: dict[str, LogValue]) -> None:
        """Apply changes (validated first, so a bad request changes nothing) and reconfigure logging."""
        for key, value in changes.items():
            if key == "log_file":
                raise ServiceError(ErrorCode.UNSUPPORTED, "log_file can not be changed via network")
            if key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise ServiceError(ErrorCode.INVALID_ARG, f"expect boolean for '{key}'")
            elif key == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ServiceError(ErrorCode.INVALID_ARG, "expect unsigned integer for 'log_verbose_level'")
            elif key == "log_format":
                if value not in FORMATS:
                    raise ServiceError(
                        ErrorCode.INVALID_ARG,
                        f"invalid argument for log_format, got: {value}. Supported formats: default, ISO8601, json",
                    )
            else:
                raise ServiceError(ErrorCode.INVALID_ARG, f"log setting '{key}' is not supported")
        for key, value in changes.items():
            setattr(self, key, value)
        if "log_format" in changes:
            set_format(self.log_format)  # the server's lines (service/core/observability/log_output.py)
        self.apply()

    def apply(self) -> None:
        """Set the root logger's level from the flags: the lowest enabled severity wins."""
        if self.log_verbose_level > 0:
            level = logging.DEBUG
        elif self.log_info:
            level = logging.INFO
        elif self.log_warning:
            level = logging.WARNING
        elif self.log_error:
            level = logging.ERROR
        else:
            level = logging.CRITICAL
        logging.getLogger().setLevel(level)
