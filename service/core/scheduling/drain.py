"""Waiting, with a bound, until a scheduler has nothing left in flight (unload, reload, stop)."""

from __future__ import annotations

import asyncio


class DrainSignal:
    """`wait` blocks until the owner calls `empty` (its count of work in flight reached zero) or a timeout."""

    __slots__ = ("waiter",)

    def __init__(self) -> None:
        # what `wait` blocks on; None while nobody waits (owners may test it to skip `empty` per request)
        self.waiter: asyncio.Future[None] | None = None

    async def wait(self, busy: bool, timeout_s: float) -> bool:
        """True at once when not `busy`, else once `empty` is called; False after timeout_s."""
        if not busy:
            return True
        if self.waiter is None or self.waiter.done():
            self.waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self.waiter), timeout_s)
        except TimeoutError:
            return False
        return True

    def empty(self) -> None:
        """Nothing is in flight any more: wake whoever waits."""
        future, self.waiter = self.waiter, None
        if future is not None and not future.done():
            future.set_result(None)
