"""Keepalive and connection age on an h2 connection, read from the same grpc core channel options grpcio gets
(config/access.py): the server's pings (grpc.keepalive_time_ms, keepalive_timeout_ms,
keepalive_permit_without_calls, grpc.http2.max_pings_without_data), the policy on client pings
(grpc.http2.min_ping_interval_without_data_ms, grpc.http2.max_ping_strikes: GOAWAY ENHANCE_YOUR_CALM
"too_many_pings", as grpc core), and grpc.max_connection_age_ms / _grace_ms."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

from service.frontend.grpc.h2 import frames as f
from service.frontend.grpc.h2.roles import Link

_IDLE_PING_INTERVAL = 7200.0  # grpc core: pings while no call runs (and none permitted) need 2 hours between


class Keepalive:
    def __init__(self, conn: Link, options: Mapping[str, Any]) -> None:
        self.conn = conn
        self.time_s = float(options.get("grpc.keepalive_time_ms", 7_200_000)) / 1000
        self.timeout_s = float(options.get("grpc.keepalive_timeout_ms", 20_000)) / 1000
        self.permit = bool(options.get("grpc.keepalive_permit_without_calls", 0))
        self.min_recv_s = float(options.get("grpc.http2.min_ping_interval_without_data_ms", 300_000)) / 1000
        self.max_strikes = int(options.get("grpc.http2.max_ping_strikes", 2))
        self.max_pings = int(options.get("grpc.http2.max_pings_without_data", 2))  # 0: no limit
        self._pings_sent = 0  # since the server last sent headers or data
        age = options.get("grpc.max_connection_age_ms")
        grace = options.get("grpc.max_connection_age_grace_ms")
        self.age_s = None if age is None or age >= 2**31 - 1 else float(age) / 1000
        self.grace_s = None if grace is None or grace >= 2**31 - 1 else float(grace) / 1000
        self._timers: list[asyncio.TimerHandle] = []
        self._ping_timer: asyncio.TimerHandle | None = None
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._payload = b""
        self._last_ping_recv = float("-inf")
        self._strikes = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ping_timer = loop.call_later(self.time_s, self._ping)
        if self.age_s is not None:
            self._timers.append(loop.call_later(self.age_s, self._aged))

    def stop(self) -> None:
        for t in (*self._timers, self._ping_timer, self._timeout_timer):
            if t is not None:
                t.cancel()

    # ---- the server's pings ----------------------------------------------------------------------------------
    def _ping(self) -> None:
        loop = asyncio.get_running_loop()
        if not (self.conn.active or self.permit) or (self.max_pings and self._pings_sent >= self.max_pings):
            self._ping_timer = loop.call_later(self.time_s, self._ping)
            return
        self._payload = os.urandom(8)
        self._pings_sent += 1
        self.conn.write_raw(f.frame(f.PING, 0, 0, self._payload))
        self._timeout_timer = loop.call_later(self.timeout_s, self.conn.abort_connection)

    def acked(self, payload: bytes) -> None:
        if payload == self._payload and self._timeout_timer is not None:
            self._timeout_timer.cancel()
            self._timeout_timer = None
            self._ping_timer = asyncio.get_running_loop().call_later(self.time_s, self._ping)

    # ---- the client's pings ----------------------------------------------------------------------------------
    def ping_allowed(self, active: bool) -> bool:
        """A client PING arrived: False (and GOAWAY sent) once it struck too often (grpc core's abuse policy)."""
        now = time.monotonic()
        interval = self.min_recv_s if (active or self.permit) else _IDLE_PING_INTERVAL
        if now < self._last_ping_recv + interval:
            self._strikes += 1
        self._last_ping_recv = now
        if self.max_strikes and self._strikes > self.max_strikes:
            self.conn.goaway(f.ENHANCE_YOUR_CALM, "too_many_pings")
            return False
        return True

    def sent(self) -> None:
        """The server sent headers or data: the client's ping count starts again (grpc core does so)."""
        self._last_ping_recv = float("-inf")
        self._strikes = 0
        self._pings_sent = 0

    # ---- connection age --------------------------------------------------------------------------------------
    def _aged(self) -> None:
        self.conn.shutdown()
        if self.grace_s is not None:
            self._timers.append(asyncio.get_running_loop().call_later(self.grace_s, self.conn.abort_connection))
