"""pb_utils.Logger and model control from a model (load, unload, readiness)."""

from __future__ import annotations

import enum
import logging
import sys

from service.ipc import frames as ipc
from service.worker.pb_utils.errors import TritonModelException, incompatible_arguments
from service.worker.pb_utils.hooks import runtime

_log = logging.getLogger("trireme.model")


class LogLevel(enum.Enum):
    """pb_utils.Logger.LogLevel: an enum of its own, as Triton's (a plain int is not a level)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_Level = LogLevel  # for annotations inside Logger, whose own LogLevel attribute shadows the name
_PY_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)  # by LogLevel value


def _emit(level: int, message: str) -> None:
    """Send the line to the server (which filters and formats it under its current log settings, so changes
    made through the log-settings API apply at once), or log it here; with the model's file and line."""
    caller = sys._getframe(2)  # the model's frame: _emit <- Logger.<method> <- model code
    send = runtime.log
    if send is not None:
        send(level, message, caller.f_code.co_filename, caller.f_lineno)
    else:
        log_line(level, message, caller.f_code.co_filename, caller.f_lineno)


def log_line(level: int, message: str, file: str, line: int) -> None:
    """Log a model's line in this process, as the model's call site, when its level is enabled."""
    py_level = _PY_LEVELS[level] if 0 <= level < len(_PY_LEVELS) else logging.INFO
    if _log.isEnabledFor(py_level):
        _log.handle(_log.makeRecord(_log.name, py_level, file, line, message, (), None))


def _message(call: str, msg: object, *rest: object) -> str:
    if type(msg) is not str:  # Triton's bindings take a str and nothing else (None included)
        raise incompatible_arguments(call, "(message: str) -> None", (msg, *rest))
    return msg


class Logger:
    """Model logging through the worker's log (reaches the server's output)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: _Level = _Level.INFO) -> None:
        """Log at a Logger level."""
        if type(message) is not str or not isinstance(level, _Level):
            raise incompatible_arguments(
                "log()", "(message: str, level: Logger.LogLevel = Logger.LogLevel.INFO) -> None", (message, level)
            )
        _emit(level.value, message)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _emit(0, _message("log_info()", message))

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _emit(1, _message("log_warn()", message))

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _emit(2, _message("log_error()", message))

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at VERBOSE."""
        _emit(3, _message("log_verbose()", message))


def _control(failure: str, message: ipc.ModelControl) -> ipc.ModelControlReply:
    """Run a model-control request through the server; its error raises as Triton's stub raises it."""
    if runtime.bls is None:
        raise TritonModelException(f"{failure}: model control needs a model loaded by the server")
    reply: ipc.ModelControlReply = runtime.bls.control(message)
    if reply.error:
        raise TritonModelException(f"{failure}: {reply.error}")
    return reply


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model from a model, as the repository API's load with `config` and `files`
    ({"file:<version>/<name>": bytes}); needs explicit model control, as in Triton."""
    if type(model_name) is not str or type(config) is not str:
        raise incompatible_arguments(
            "load_model()", "(model_name: str, config: str = '', files: object = None) -> None", (model_name, config)
        )
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
        )
    contents = {str(k): bytes(v) for k, v in (files or {}).items()}
    _control("Failed to load model", ipc.ModelControl(0, "load", model_name, config, contents))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model from a model (with `unload_dependents`, an ensemble's composing models too)."""
    if type(model_name) is not str or type(unload_dependents) is not bool:
        raise incompatible_arguments(
            "unload_model()", "(model_name: str, unload_dependents: bool = False) -> None", (model_name,)
        )
    _control("Failed to unload model", ipc.ModelControl(0, "unload", model_name, unload_dependents=unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether a model (that version, or any) is ready."""
    if type(model_name) is not str or type(model_version) is not str:
        raise incompatible_arguments(
            "is_model_ready()", "(model_name: str, model_version: str = '') -> bool", (model_name, model_version)
        )
    if model_version and not (model_version.isdigit() and int(model_version) > 0):
        raise TritonModelException(
            f"failed to get model version from specified version string '{model_version}', version should be an "
            "integral value > 0"
        )
    reply = _control(
        "Failed to check model readiness", ipc.ModelControl(0, "ready", model_name, model_version=model_version)
    )
    return reply.ready
