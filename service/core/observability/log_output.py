"""Where the server's log lines go and how they look: `--log-file` and `--log-format` (docs/logging.md).

Formats: `default`, Triton's `I1127 01:13:12.123456 1234 server.py:88] "message"` (level letter E/W/I, month and
day, UTC time to the microsecond, pid, file:line; the message JSON-escaped unless
TRITON_SERVER_ESCAPE_LOG_MESSAGES=0, as Triton); `ISO8601`, `2026-11-27T01:13:12Z I 1234 server.py:88] "message"`;
and, beyond Triton, `json`: one JSON object per line with `timestamp`, `level`, `pid`, `file`, `line`, `logger`,
`message`, and `request_id` / `model` where the record carries them (`log.info(..., extra={"model": name})`).
Without --log-file and --log-format (and until the log-settings API sets a format) lines keep Python's layout.

The log file is opened for appending; rotation is left to the system: SIGHUP reopens it (logrotate's
`postrotate kill -HUP`). Without a file the lines go to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TextIO

import orjson

FORMATS = ("default", "ISO8601", "json")
_LETTER = {logging.CRITICAL: "E", logging.ERROR: "E", logging.WARNING: "W"}
_EXTRA_FIELDS = ("request_id", "model")


class TritonFormatter(logging.Formatter):
    """Triton's line layouts (and the JSON one); the format can change while the server runs."""

    def __init__(self, fmt: str = "default") -> None:
        super().__init__()
        self.format_name = fmt
        self.escape = os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "") != "0"

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        seconds = int(record.created)
        micros = int((record.created - seconds) * 1_000_000)
        tm = time.gmtime(seconds)
        if self.format_name == "json":
            line: dict[str, object] = {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", tm) + f".{micros:06d}Z",
                "level": record.levelname,
                "pid": record.process,
                "file": record.filename,
                "line": record.lineno,
                "logger": record.name,
                "message": message,
            }
            for key in _EXTRA_FIELDS:
                value = record.__dict__.get(key)
                if value:
                    line[key] = value
            return orjson.dumps(line).decode()
        letter = _LETTER.get(record.levelno, "I")
        place = f"{record.process} {record.filename}:{record.lineno}] "
        text = orjson.dumps(message).decode() if self.escape else message
        if self.format_name == "ISO8601":
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", tm) + f" {letter} {place}{text}"
        return f"{letter}{time.strftime('%m%d %H:%M:%S', tm)}.{micros:06d} {place}{text}"


class ReopeningFileHandler(logging.StreamHandler[TextIO]):
    """Appends to a file; reopen() (on SIGHUP) starts a new file after the old one was rotated away."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(self._open())

    def _open(self) -> TextIO:
        return open(self.path, "a", encoding="utf-8", buffering=1)

    def reopen(self) -> None:
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            old.close()
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            self.stream.close()
        finally:
            self.release()
        super().close()


_formatter = TritonFormatter()
_handler: logging.Handler | None = None


def configure(log_file: str = "", fmt: str = "default") -> None:
    """Send the root logger's records to `log_file` (stderr when empty) in format `fmt`. Raises OSError when the
    file cannot be opened."""
    global _handler
    handler: logging.Handler = ReopeningFileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    _formatter.format_name = fmt
    handler.setFormatter(_formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    _handler = handler


def set_format(fmt: str) -> None:
    """Change the format of every line from now on (the log-settings API); lines get Triton's layouts from then
    on also when neither --log-file nor --log-format was given."""
    if _handler is None:
        configure("", fmt)
    _formatter.format_name = fmt


def reopen() -> None:
    """SIGHUP: reopen the log file (nothing without one)."""
    if isinstance(_handler, ReopeningFileHandler):
        _handler.reopen()
