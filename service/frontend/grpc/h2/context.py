"""One call on the h2 transport as its handler sees it: the grpc.aio.ServicerContext methods Trireme's servicers
use (read/write for ModelStreamInfer, abort, invocation_metadata, peer) and the rest of the public surface a
handler may reach (codes and details, metadata out, deadline, cancellation, done callbacks, compression)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import grpc
from mypy_extensions import mypyc_attr

from service.frontend.grpc.h2.roles import Link

EOF_MESSAGE: Any = grpc.aio.EOF  # type: ignore[attr-defined]


@mypyc_attr(native_class=False)  # compiled, a class may not derive from ConnectionResetError natively
class CallGone(ConnectionResetError):
    """A response written after the client reset the stream or the connection closed: the call ends silently, as
    a cancelled one (grpc.aio drops such writes too)."""


_COMPRESSION = {grpc.Compression.Gzip: "gzip", grpc.Compression.Deflate: "deflate", grpc.Compression.NoCompression: ""}


class H2Context:
    """A call's state (its stream's inbound messages and outbound status) and its ServicerContext."""

    def __init__(
        self,
        conn: Link,
        sid: int,
        metadata: tuple[tuple[str, str | bytes], ...],
        deadline: float | None,
        deserialize: Callable[[bytes], Any] | None,
        serialize: Callable[[Any], bytes] | None,
    ) -> None:
        self.conn = conn
        self.sid = sid
        self.metadata = metadata
        self.deadline = deadline  # time.monotonic() seconds
        self.deserialize = deserialize
        self.serialize = serialize
        # complete request messages (decompressed), not yet read, with their size on the wire (the window they hold)
        self.inbox: deque[tuple[bytes, int]] = deque()
        self._waiter: asyncio.Future[None] | None = None  # a read() waiting for input
        self.cork: bytearray | None = None  # unary responses: frames gathered for one write (connection.py)
        self.half_closed = False  # END_STREAM from the client
        self.failed: tuple[grpc.StatusCode, str] | None = (
            None  # an inbound error (size, compression) to end the call with
        )
        self.task: asyncio.Task[Any] | None = None
        self.status: grpc.StatusCode | None = None
        self.message = ""
        self.trailing: tuple[tuple[str, Any], ...] = ()
        self.initial: tuple[tuple[str, Any], ...] = ()
        self.headers_sent = False
        self.finished = False
        self.is_cancelled = False
        self.compression = ""  # per-call response compression (set_compression)
        self.wire_encoding = ""  # the grpc-encoding its response headers announced
        self._callbacks: list[Callable[[Any], None]] = []

    # ---- inbound, fed by the connection ----------------------------------------------------------------------
    def push(self, message: bytes, wire_bytes: int) -> None:
        self.inbox.append((message, wire_bytes))
        self._wake()

    def end_input(self) -> None:
        self.half_closed = True
        self._wake()

    def fail_input(self, code: grpc.StatusCode, message: str) -> None:
        """A request message the call cannot take (over the size limit, undecodable): as grpc core, the call ends
        with that status at once and its handler is cancelled, whether or not it is reading."""
        self.failed = (code, message)
        self._wake()
        self.conn.send_trailers(self, code.value[0], message)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def finish(self, cancelled: bool) -> None:
        """The call is over (answered, reset by the client or the connection lost): run the done callbacks."""
        if self.finished:
            return
        self.finished = True
        self.is_cancelled = cancelled
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            with contextlib.suppress(Exception):  # a callback's failure is not the call's
                cb(self)

    # ---- grpc.aio.ServicerContext ----------------------------------------------------------------------------
    async def read(self) -> Any:
        while True:
            if self.inbox:
                raw, wire_bytes = self.inbox.popleft()
                self.conn.consumed(self, wire_bytes)  # a compressed message gives back what it held, not more
                return self.deserialize(raw) if self.deserialize is not None else raw
            if self.failed is not None:
                await self.abort(*self.failed)
            if self.half_closed:
                return EOF_MESSAGE
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def write(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else self.serialize(message)  # type: ignore[misc]
        await self.conn.send_message(self, data)

    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, Any]]) -> None:
        if self.headers_sent:
            raise RuntimeError("initial metadata was sent already")
        self.initial = tuple(initial_metadata)
        self.conn.send_headers(self)

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, Any]] = ()
    ) -> NoReturn:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort with OK is not allowed")
        self.status, self.message = code, details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    async def abort_with_status(self, status: Any) -> NoReturn:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.status = code

    def set_details(self, details: str) -> None:
        self.message = details

    def code(self) -> grpc.StatusCode | None:
        return self.status

    def details(self) -> str:
        return self.message

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, Any]]) -> None:
        self.trailing = tuple(trailing_metadata)

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self.trailing

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.metadata

    def peer(self) -> str:
        return self.conn.peer

    def peer_identities(self) -> list[bytes] | None:
        return self.conn.peer_identities()

    def peer_identity_key(self) -> str | None:
        return "x509_common_name" if self.conn.peer_identities() else None

    def auth_context(self) -> dict[str, list[bytes]]:
        ids = self.conn.peer_identities()
        return {"x509_common_name": ids} if ids else {}

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def cancelled(self) -> bool:
        return self.is_cancelled

    def done(self) -> bool:
        return self.finished

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self.finished:
            callback(self)
        else:
            self._callbacks.append(callback)

    def set_compression(self, compression: grpc.Compression) -> None:
        self.compression = _COMPRESSION.get(compression, "")

    def disable_next_message_compression(self) -> None:
        pass  # responses are compressed per call or not at all (as grpc.aio measured, docs/grpc.md)
