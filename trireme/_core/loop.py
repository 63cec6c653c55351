"""A private event loop on a thread: the core of a Python-API server runs there, so that the caller's thread
(plain code, or a notebook whose own event loop is running) is never needed to keep it serving."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


class LoopThread:
    """One uvloop event loop running forever on a daemon thread until close()."""

    def __init__(self, name: str) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def on_loop(self) -> bool:
        """True when called from the loop's own thread (where waiting for it would deadlock)."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop; its result through a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (from any thread but the loop's)."""
        if self.on_loop:
            coro.close()
            raise RuntimeError("a blocking call of the Python API was made on the server's own event loop")
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Call a plain function on the loop (the core is not thread-safe) and return what it returns."""
        if self.on_loop:
            return fn()

        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())

    def close(self) -> None:
        """Stop the loop, cancel what is left on it, and join the thread."""
        if not self._thread.is_alive():
            return

        async def finish() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):  # the loop is stopped regardless
            self.run(finish(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
