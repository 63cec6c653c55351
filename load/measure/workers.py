"""Load spread over worker processes, so the Python client itself is not the bottleneck.

Each worker process owns its own gRPC channel and a `LocalEngine`; the parent sends it commands over a
pipe (`level`, `take`, `stop`) and merges what it returns. Concurrency slots are dealt out as evenly as
possible, a request rate is divided evenly (constant schedules staggered), and sequence ids interleave.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from load.measure.modes import Collected, LoadSpec

_START_TIMEOUT_S = 60.0
_REPLY_TIMEOUT_S = 60.0


def share(level: float, mode: str, index: int, count: int) -> float:
    """The part of a load level that worker `index` of `count` carries."""
    if mode == "concurrency":
        whole = int(level)
        return float(whole // count + (1 if index < whole % count else 0))
    return level / count


def _worker_main(conn: Connection, url: str, streams: list[list[bytes]], spec: LoadSpec) -> None:
    """Worker process entry: serve commands until `stop` or the parent goes away."""
    from load.measure.modes import LocalEngine
    from load.transports.client import InferenceClient

    client = InferenceClient(url)
    engine = LocalEngine(client, streams, spec)
    conn.send(("ready", None))
    try:
        while True:
            try:
                cmd, arg = conn.recv()
            except EOFError:
                break
            if cmd == "level":
                engine.set_level(share(arg, spec.mode, spec.process_index, spec.process_count))
                conn.send(("ok", None))
            elif cmd == "take":
                c = engine.take()
                payload = (c.records.tobytes(), c.send_ns, c.recv_ns, c.completed, c.sent, c.cpu_ns, c.error)
                conn.send(("taken", payload))
            elif cmd == "stop":
                engine.stop_load()
                conn.send(("ok", None))
                break
    finally:
        engine.stop_load()
        client.close()
        conn.close()


class ProcessEngine:
    """The `LocalEngine` interface over `count` worker processes (spawned, not forked: gRPC is not fork-safe)."""

    def __init__(self, url: str, streams: Sequence[Sequence[bytes]], spec: LoadSpec, count: int) -> None:
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._error: str | None = None
        plain = [list(s) for s in streams]
        try:
            for i in range(count):
                parent, child = ctx.Pipe()
                wspec = replace(spec, process_index=i, process_count=count)
                proc = ctx.Process(target=_worker_main, args=(child, url, plain, wspec), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            for conn in self._conns:
                self._reply(conn, _START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _reply(self, conn: Connection, timeout_s: float = _REPLY_TIMEOUT_S) -> Any:
        if not conn.poll(timeout_s):
            raise RuntimeError("a load worker process did not answer")
        try:
            _kind, payload = conn.recv()
        except EOFError:
            raise RuntimeError("a load worker process exited unexpectedly") from None
        return payload

    def set_level(self, level: float) -> None:
        """Every worker switches to its share of `level`."""
        for conn in self._conns:
            conn.send(("level", level))
        for conn in self._conns:
            self._reply(conn)

    def take(self) -> Collected:
        """Merged records and summed counters from every worker."""
        for conn in self._conns:
            conn.send(("take", None))
        parts: list[np.ndarray] = []
        out = Collected(np.empty((0, 3), dtype=np.int64))
        for conn in self._conns:
            raw, send_ns, recv_ns, completed, sent, cpu_ns, error = self._reply(conn)
            parts.append(np.frombuffer(raw, dtype=np.int64).reshape(-1, 3))
            out.send_ns += send_ns
            out.recv_ns += recv_ns
            out.completed += completed
            out.sent += sent
            out.cpu_ns += cpu_ns
            if error and self._error is None:
                self._error = error
        out.records = np.concatenate(parts) if parts else out.records
        out.error = self._error
        return out

    def error(self) -> str | None:
        """The first failure any worker reported (seen at the last take)."""
        return self._error

    def stop_load(self) -> None:
        """Stop all load (workers stay up for another level)."""
        self.set_level(0)

    def close(self) -> None:
        """Stop and reap every worker process (terminating any that do not exit in time)."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop", None))
        for proc in self._procs:
            proc.join(15.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
