"""pb_utils.Logger and model control from a model (load, unload, readiness)."""

from __future__ import annotations

import logging

from service.worker.pb_utils.errors import TritonModelException
from service.worker.pb_utils.hooks import runtime

_log = logging.getLogger("trireme.model")


class Logger:
    """Model logging through the worker's log (reaches the server's output)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(msg: str, level: int = 0) -> None:
        """Log at a Logger level."""
        _log.log(Logger._LEVELS.get(level, logging.INFO), "%s", msg)

    @staticmethod
    def log_info(msg: str) -> None:
        """Log at INFO."""
        _log.info("%s", msg)

    @staticmethod
    def log_warn(msg: str) -> None:
        """Log at WARNING."""
        _log.warning("%s", msg)

    @staticmethod
    def log_error(msg: str) -> None:
        """Log at ERROR."""
        _log.error("%s", msg)

    @staticmethod
    def log_verbose(msg: str) -> None:
        """Log at VERBOSE."""
        _log.debug("%s", msg)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load a model from a model (explicit model control)."""
    if runtime.bls is None or not hasattr(runtime.bls, "load_model"):
        raise TritonModelException("model control from a model is not supported by this server build")
    runtime.bls.load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model from a model (explicit model control)."""
    if runtime.bls is None or not hasattr(runtime.bls, "unload_model"):
        raise TritonModelException("model control from a model is not supported by this server build")
    runtime.bls.unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether another model is ready."""
    if runtime.bls is None or not hasattr(runtime.bls, "is_model_ready"):
        raise TritonModelException("model readiness queries are not supported by this server build")
    return bool(runtime.bls.is_model_ready(model_name, model_version))
