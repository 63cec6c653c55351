"""Frames written to a stream transport during one event-loop iteration leave in one write at its end.

Under load one read from a socket carries several frames (a worker's responses, a front end's requests), and
handling them writes several frames to another socket, each a system call of its own and a wake-up of the reader
for every one the reader had not seen yet. Gathered, they cost one call, and the reader finds them together.
"""

from __future__ import annotations

import asyncio

# a frame this large goes out at once (after what is gathered): joining it would copy it on the loop
DIRECT_BYTES = 64 << 10


class GatheredWriter:
    """write() gathers frames; they are written to the transport, in order, at the end of this loop iteration.

    Every write to the transport must go through this object, or frames could leave out of order."""

    __slots__ = ("_loop", "_pending", "transport")

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        pending = self._pending
        if len(data) >= DIRECT_BYTES:
            if pending:
                self.flush()
            if not self.transport.is_closing():
                self.transport.write(data)
            return
        pending.append(data)
        if len(pending) == 1:
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is gathered now (nothing when the transport is closing: its reader is gone)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
