"""Opt-in per-request stage timestamps for the hot path (TRIREME_STAGE_TRACE=<file>); nothing runs when unset.

Each traced request gets a list of (stage, time.monotonic_ns()) pairs; CLOCK_MONOTONIC is shared by every
process on the machine, so the worker's stamps (sent back in ipc.ExecDone.stamps) line up with the server's.
One JSON line per request is appended to the file; tests/bench/breakdown.py turns them into a table.
The hot path checks `RECORDER is None` (one global lookup) when tracing is off.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import IO

ENV = "TRIREME_STAGE_TRACE"


class Recorder:
    """Appends one JSON line per finished request to a file (buffered, flushed every 256 lines and at exit)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = None  # opened on first write (workers import this module but never write)
        self._lock = threading.Lock()
        self._lines = 0

    def write(self, stamps: list[tuple[str, int]]) -> None:
        """Record one request's stamps."""
        line = json.dumps(stamps, separators=(",", ":"))
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", buffering=1 << 16)  # noqa: SIM115 - closed at exit
                atexit.register(self.close)
            self._file.write(line + "\n")
            self._lines += 1
            if self._lines % 256 == 0:
                self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            if self._file is not None and not self._file.closed:
                self._file.close()


def _make() -> Recorder | None:
    path = os.environ.get(ENV, "")
    return Recorder(path) if path else None


# Set once at import from the environment, never changed afterwards.
RECORDER: Recorder | None = _make()


def now() -> int:
    """The clock every stamp uses."""
    return time.monotonic_ns()
