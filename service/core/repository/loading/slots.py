"""--model-load-thread-count and --model-load-retry-count: at most N version loads run at once, and a version
that fails to load is tried again up to R more times (as Triton's load pool does: each try is a full load)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

log = logging.getLogger("trireme.repository")


class _Loaded(Protocol):
    state: str
    reason: str


T = TypeVar("T", bound=_Loaded)


class LoadSlots:
    """A bound on concurrent version loads, with retries of failed ones."""

    def __init__(self, thread_count: int = 4, retry_count: int = 0) -> None:
        self.retry_count = max(0, retry_count)
        self._slots = asyncio.Semaphore(max(1, thread_count))

    async def run(self, load: Callable[[], Awaitable[T]], what: str) -> T:
        """`load()` in a slot, retried while its result is not READY and retries are left."""
        async with self._slots:
            attempt = 0
            while True:
                loaded = await load()
                if loaded.state == "READY" or attempt >= self.retry_count:
                    return loaded
                attempt += 1
                log.warning(
                    "retrying the load of %s (retry %d of %d) after: %s", what, attempt, self.retry_count, loaded.reason
                )
