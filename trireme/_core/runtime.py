"""A running core for the Python API: Trireme's own Server (service/server.py) with its models loaded, on a
LoopThread, and the front ends started around it from Python (tritonfrontend)."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from service.config.flags import ServerConfig, parse_args
from service.core.engine import Engine
from service.errors import ErrorCode, ServiceError
from service.server import Server as CoreServer
from trireme._core.loop import LoopThread

T = TypeVar("T")
log = logging.getLogger("trireme.python")
_ids = itertools.count(1)

# What the Python API always sets: client shared memory on (tritonfrontend has no switch for it), the front ends
# in this process (started one by one from Python, never by the core itself).
BASE_FLAGS = ["--allow-client-shm=true", "--frontend-processes=1"]


def parse_flags(flags: list[str]) -> ServerConfig:
    """ServerConfig from `trireme serve` flags; ServiceError(INVALID_ARG) instead of argparse's exit."""
    try:
        return parse_args([*BASE_FLAGS, *flags])
    except SystemExit as e:
        raise ServiceError(ErrorCode.INVALID_ARG, f"invalid server options: {e.code}") from None


class CoreRuntime:
    """The core of one Python-API server: started once, stopped once."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.thread = LoopThread(f"trireme-server-{next(_ids)}")
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self.core: CoreServer | None = None
        try:
            self.core = self.thread.call(lambda: CoreServer(config))
        except BaseException:
            self.thread.close()
            raise

    @property
    def engine(self) -> Engine:
        assert self.core is not None
        return self.core.engine

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the core's loop and wait for it."""
        return self.thread.run(coro, timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Call a function on the core's loop."""
        return self.thread.call(fn)

    def start(self) -> None:
        """Load the models; ServiceError when one failed to load and exit-on-error is set (nothing is left)."""
        assert self.core is not None
        try:
            ok = self.run(self.core.load_models())
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)  # a server left running (a notebook kernel shutting down) still stops in order
        if not ok:
            failed = [f"{r.name}: {r.reason}" for r in self.engine.repository_index() if r.state not in ("READY", "")]
            self.stop()
            raise ServiceError(ErrorCode.INTERNAL, "failed to load all models: " + "; ".join(failed))

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Something started on the loop (a front end) that stop() must stop first."""
        self._closers.append(closer)

    def remove_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        with contextlib.suppress(ValueError):
            self._closers.remove(closer)

    def stop(self) -> None:
        """Stop the front ends started from Python, then the core (workers, arenas, shm registry), then the loop."""
        core, self.core = self.core, None
        if core is None:
            return
        atexit.unregister(self.stop)
        closers, self._closers = self._closers, []

        async def shutdown() -> None:
            for closer in reversed(closers):
                try:
                    await closer()
                except Exception as e:  # one front end's failure must not keep the workers running
                    log.warning("stopping a front end failed: %s", e)
            await core.stop()

        try:
            self.run(shutdown())
        finally:
            self.thread.close()
