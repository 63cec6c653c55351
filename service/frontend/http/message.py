"""What an HTTP handler sees and gives back, independent of the connection code (`h1.py`).

A `Request` carries the method, the decoded path, the headers (case-insensitive), the path's `match_info` and a
`Body` the connection fills as the bytes arrive; a handler returns a `Response` (status, body, headers) or, for
server-sent events, the `Stream` it opened with `Request.open_stream`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from multidict import CIMultiDictProxy

JSON = "application/json"


class BodyError(Exception):
    """The request body stopped parsing after its handler started (the parser's reason), or the client left."""


class Connection(Protocol):
    """What a Body and a Stream need from the connection that owns them."""

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def start_stream(self, status: int, content_type: str) -> None: ...
    def end_stream(self) -> None: ...


class Body:
    """The request body as it arrives: the connection feeds pieces, the handler reads them in order.

    Reading pauses the socket while more than HIGH_WATER bytes wait unread (a slow handler does not make the
    server buffer a whole large upload twice); `chunks` counts the `Transfer-Encoding: chunked` chunks seen."""

    HIGH_WATER = 4 << 20

    __slots__ = ("_conn", "_paused", "_pieces", "_waiter", "_waiting", "chunks", "done", "error")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._pieces: deque[bytes] = deque()
        self._waiting = 0  # bytes fed and not read yet
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.done = False  # the whole body has arrived
        self.error: BaseException | None = None
        self.chunks = 0

    def feed(self, data: bytes) -> None:
        self._pieces.append(data)
        self._waiting += len(data)
        if self._waiting > self.HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes | None:
        """The next piece of the body; None at its end. Raises BodyError when it stopped parsing."""
        while not self._pieces:
            if self.error is not None:
                raise self.error
            if self.done:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._pieces.popleft()
        self._waiting -= len(data)
        if self._paused and self._waiting <= self.HIGH_WATER // 4:
            self._paused = False
            self._conn.resume_reading()
        return data

    def whole(self) -> bytes | None:
        """The body when it has fully arrived in one piece (the usual small request), without waiting."""
        if self.done and self.error is None and len(self._pieces) <= 1:
            data = self._pieces.popleft() if self._pieces else b""
            self._waiting = 0
            return data
        return None


class Request:
    """One HTTP request as the handlers see it."""

    __slots__ = ("_conn", "body", "headers", "match_info", "method", "path")

    def __init__(self, method: str, path: str, headers: CIMultiDictProxy[str], body: Body, conn: Connection) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.match_info: dict[str, str] = {}
        self.body = body
        self._conn = conn

    async def open_stream(self, status: int, content_type: str) -> Stream:
        """Send the head of a streamed response (chunked); the handler then writes to it and returns it."""
        self._conn.start_stream(status, content_type)
        return Stream(self._conn)


class Stream:
    """A response sent piece by piece (server-sent events)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def write(self, data: bytes) -> None:
        self._conn.write(data)
        await self._conn.drain()

    def close(self) -> None:
        self._conn.end_stream()


@dataclass(slots=True)
class Response:
    """A whole response: status, body and its content type, extra headers."""

    status: int = 200
    body: bytes = b""
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def json_bytes_response(body: bytes, status: int = 200) -> Response:
    """A response whose body is JSON text already."""
    return Response(status, body, JSON)
