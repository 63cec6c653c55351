"""A model's own readiness check (a Python model's is_model_ready()), asked through its instance on every
model-ready probe, as Triton 2.73's Python backend does."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from service.ipc import frames as ipc

log = logging.getLogger("trireme.instances")

# Triton gives a model's readiness function 5 s; a slower answer counts as not ready (the check keeps running
# in the instance, and the next probe waits for that same check instead of starting another)
READY_FN_TIMEOUT_S = 5.0


class ReadinessProbe:
    """Sends ReadyCheck to one instance and matches its ReadyReply; one check in flight at a time."""

    def __init__(self, send: Callable[[Any], None], name: str) -> None:
        self._send = send
        self._name = name
        self._ids = itertools.count(1)
        self._pending: tuple[int, asyncio.Future[bool]] | None = None
        self.has_fn = False  # the model defines a readiness function (from its Ready message)

    async def check(self, timeout_s: float = READY_FN_TIMEOUT_S) -> bool:
        """The model's answer; True when it has no readiness function, False after `timeout_s`."""
        if not self.has_fn:
            return True
        if self._pending is None:
            check_id = next(self._ids)
            future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._pending = (check_id, future)
            try:
                self._send(ipc.ReadyCheck(check_id))
            except Exception:  # the instance is going away: not ready
                self._pending = None
                return False
        future = self._pending[1]
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            log.warning("model instance '%s': readiness check did not answer in %s s: not ready", self._name, timeout_s)
            return False

    def on_reply(self, reply: ipc.ReadyReply) -> None:
        """The instance answered (called on the event loop)."""
        if self._pending is not None and self._pending[0] == reply.check_id:
            future = self._pending[1]
            self._pending = None
            if not future.done():
                future.set_result(reply.ready)

    def lost(self) -> None:
        """The instance died: a pending check answers not ready."""
        if self._pending is not None:
            future = self._pending[1]
            self._pending = None
            if not future.done():
                future.set_result(False)
