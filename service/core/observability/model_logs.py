"""Lines models log through pb_utils.Logger in worker processes (ipc.ModelLog), logged by the server.

As under Triton, whose Python stub sends every Logger line to the server, the worker filters nothing: the server
logs each line under its current log settings (each severity's flag, the verbose level, format and file), so a
change made through the log-settings API applies to every worker's next line at once. The record carries the
model's file and line, as Triton's log lines do.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from service.core.observability.log_settings import LogSettings
from service.ipc import frames as ipc

_log = logging.getLogger("trireme.model")  # the logger models log to (pb_utils.Logger), in every process
_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)  # by pb_utils.Logger.LogLevel value


def attach(worker: Any, settings: LogSettings) -> None:
    """Log the worker's ModelLog lines here (RepositoryOptions.attach_worker)."""
    worker.message_handlers[ipc.ModelLog] = partial(on_model_log, settings)


def enabled(settings: LogSettings, level: int) -> bool:
    """Whether a Logger line of this level is logged now: each severity has its own flag, as in Triton (verbose
    lines need a verbose level of 1 or more, whatever log_info says)."""
    if level == 0:
        return settings.log_info
    if level == 1:
        return settings.log_warning
    if level == 2:
        return settings.log_error
    return settings.log_verbose_level >= 1


def on_model_log(settings: LogSettings, line: ipc.ModelLog) -> None:
    """Log one model line when its severity is enabled now."""
    if enabled(settings, line.level):
        level = _LEVELS[line.level] if 0 <= line.level < len(_LEVELS) else logging.INFO
        _log.handle(_log.makeRecord(_log.name, level, line.file, line.line, line.message, (), None))


def log_here(settings: LogSettings, level: int, message: str, file: str, line: int) -> None:
    """pb_utils.runtime.log for in-process instances: the same check, without a frame."""
    on_model_log(settings, ipc.ModelLog(level, message, file, line))
