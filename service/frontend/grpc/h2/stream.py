"""One request stream's state on an h2 connection: its call, its inbound message cutter, its flow-control windows
both ways and its deadline timer."""

from __future__ import annotations

import asyncio

from service.frontend.grpc.h2.context import H2Context
from service.frontend.grpc.h2.messages import Inbound


class Stream:
    __slots__ = ("ctx", "deadline_timer", "expired", "inbound", "send_window", "uncredited", "waiter")

    def __init__(self, ctx: H2Context, inbound: Inbound, send_window: int) -> None:
        self.ctx = ctx
        self.inbound = inbound
        self.send_window = send_window
        self.uncredited = 0  # DATA bytes received and not yet given back with a WINDOW_UPDATE
        self.waiter: asyncio.Future[None] | None = None  # a writer waiting for send window
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.expired = False

    def wake(self) -> None:
        """Wake a writer waiting for send window (the window grew, or the stream ended)."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
