"""HTTP/1.1 connections on the server's uvloop loop: an asyncio Protocol over httptools (the llhttp parser).

What it does for every handler: keep-alive (HTTP/1.1 by default, HTTP/1.0 when asked), pipelined requests
answered in order, `Expect: 100-continue`, bodies streamed to the handler as they arrive (Content-Length or
chunked, with the number of chunks counted; a body of up to SMALL_BODY bytes is all there when its handler
starts, so a client that sends the head and the body apart costs no extra wake-up of the handler), limits on
the request head, a parse error answered 400 with the parser's reason (a body that stops parsing after its
handler started fails that handler's read: it answers 400 at once), chunked streamed responses (server-sent
events), write flow control, and a graceful stop.
Measured against aiohttp's server and Granian in docs/http.md ("Library choice").
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import unquote

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from service.frontend.http.heads import response_head, stream_head
from service.frontend.http.message import Body, BodyError, Request, Response, Stream

log = logging.getLogger("trireme.http")

Handler = Callable[[Request], Awaitable[Response | Stream]]

MAX_HEAD_BYTES = 64 << 10  # request line + headers
MAX_HEADERS = 128
SMALL_BODY = 64 << 10  # a request whose body is at most this long starts its handler once the body is all here
LINGER_S = 10.0  # after answering a request whose body is still coming: read (and drop) it this long, then close
_PIPELINE_HIGH = 16  # parsed requests waiting for their turn before the socket is paused


class _ParseFailed:
    """Queued in place of a request the parser refused: answered 400 in its turn, then the connection closes."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs their handlers one after the other, writes the answers."""

    def __init__(self, server: H1Server) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._queue: deque[tuple[Request, bool] | _ParseFailed] = deque()
        self._task: asyncio.Task[None] | None = None
        self._reading: Request | None = None  # the request whose body the parser is in
        self._loop = asyncio.get_running_loop()
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []  # as the parser gives them; decoded once the head is complete
        self._head_bytes = 0
        self._paused: set[str] = set()
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._discard = False  # dropping the rest of an answered request's body, then closing
        self._broken = False  # a parse error: no more requests from this connection
        self._stream_chunked = True
        self._streamed = False  # the running handler opened a stream
        self._linger: asyncio.TimerHandle | None = None
        self._start_when_complete = False  # the last request queued runs once its (small) body has arrived

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's TCP transport (sets TCP_NODELAY itself)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        if self._reading is not None:
            self._reading.body.fail(ConnectionResetError("client closed the connection"))
        self._wake_drain(ConnectionResetError("client closed the connection"))
        if self._linger is not None:
            self._linger.cancel()

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._parse_error("Upgrade is not supported")
        except httptools.HttpParserError as e:
            # an error raised in a callback (the head limits) comes back as "User callback error", ours as context
            cause = e.__context__ if isinstance(e.__context__, httptools.HttpParserError) else e
            self._parse_error(" ".join(str(cause).split()))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain(None)

    # ---- parser callbacks (httptools) ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # runs once per header line: the limits are checked here, inline (no call per header)
        size = self._head_bytes = self._head_bytes + len(name) + len(value)
        if size > MAX_HEAD_BYTES:
            raise httptools.HttpParserError(f"Request head larger than {MAX_HEAD_BYTES} bytes")
        headers = self._headers
        if len(headers) >= MAX_HEADERS:
            raise httptools.HttpParserError(f"Too many headers (more than {MAX_HEADERS})")
        headers.append((name, value))

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError(f"Request head larger than {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        parser = self._parser
        raw = self._url.decode("utf-8", "surrogateescape")
        path = raw.split("?", 1)[0]
        headers = CIMultiDictProxy(
            CIMultiDict([(n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in self._headers])
        )
        path = unquote(path) if "%" in path else path
        request = Request(parser.get_method().decode(), path, headers, Body(self), self)
        if self._discard:  # after an early answer nothing more is served on this connection
            return
        self._reading = request
        expect = headers.get("Expect")
        if expect is not None and expect.lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._queue.append((request, parser.should_keep_alive()))
        if len(self._queue) > _PIPELINE_HIGH:
            self._pause("pipeline")
        length = headers.get("Content-Length")
        if (
            expect is None
            and "Transfer-Encoding" not in headers
            and (length is None or (len(length) <= 6 and length.isdigit() and int(length) <= SMALL_BODY))
        ):
            # a small body: its handler starts once it has all of it (at on_message_complete, usually in this
            # same read), instead of starting now and waiting for the body's next piece
            self._start_when_complete = True
        elif self._task is None:
            self._task = self._loop.create_task(self._run())

    def on_body(self, data: bytes) -> None:
        if self._reading is not None and not self._discard:
            self._reading.body.feed(data)

    def on_chunk_complete(self) -> None:
        if self._reading is not None:
            self._reading.body.chunks += 1

    def on_message_complete(self) -> None:
        if self._discard:
            self._close()
            return
        if self._reading is not None:
            self._reading.body.finish()
            self._reading = None
        if self._start_when_complete:
            self._start_when_complete = False
            if self._task is None:
                self._task = self._loop.create_task(self._run())

    def _parse_error(self, reason: str) -> None:
        self._broken = True  # what else arrives is read and dropped (closing with unread data would reset)
        reading, self._reading = self._reading, None
        if reading is not None and not self._discard:  # its handler is running or queued: its read fails
            reading.body.fail(BodyError(reason))
            log.warning("refused a malformed HTTP request body: %s", reason)
            if self._start_when_complete:  # its handler was waiting for the whole body: it answers the error
                self._start_when_complete = False
                if self._task is None:
                    self._task = self._loop.create_task(self._run())
            return
        if self._discard:
            self._close()
            return
        log.warning("refused a malformed HTTP request: %s", reason)
        self._queue.append(_ParseFailed(reason))
        if self._task is None:
            self._task = self._loop.create_task(self._run())

    # ---- handlers, one after the other -------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while self._queue and self._transport is not None:
                item = self._queue[0]
                if isinstance(item, _ParseFailed):
                    body = f"400, message: {item.reason}".encode()
                    self._send(Response(400, body, "text/plain; charset=utf-8"), keep_alive=False)
                    self._half_close()
                    return
                request, keep_alive = item
                self._streamed = False
                result = await self._server.handler(request)
                self._queue.popleft()
                if "pipeline" in self._paused and len(self._queue) <= _PIPELINE_HIGH // 4:
                    self._resume("pipeline")
                complete = request.body.done or request.body.error is not None
                if not complete or self._broken or self._server.stopping:
                    keep_alive = False
                if isinstance(result, Response):
                    if self._streamed:  # failed after its stream began: the answer cannot be changed now
                        self._close()
                        return
                    self._send(result, keep_alive, request.method == "HEAD")
                if not keep_alive:
                    if self._broken:
                        self._half_close()
                    elif complete:
                        self._close()
                    else:
                        self._linger_then_close()
                    return
        finally:
            self._task = None

    def _send(self, response: Response, keep_alive: bool, head_only: bool = False) -> None:
        transport = self._transport
        if transport is None:
            return
        body = response.body
        if not keep_alive:
            connection = b"Connection: close\r\n"
        elif self._parser.get_http_version() == "1.0":
            connection = b"Connection: keep-alive\r\n"
        else:
            connection = b""
        head = response_head(response.status, response.content_type, response.headers, len(body), connection)
        if head_only:
            transport.write(head)
        elif len(body) < 65536:
            transport.write(head + body)
        else:  # no copy of a large body
            transport.writelines([head, body])

    def _linger_then_close(self) -> None:
        """Answered before the body arrived: read and drop the rest (so the client sees the answer instead of a
        reset), close at its end or after LINGER_S."""
        self._discard = True
        if self._reading is not None:
            self._reading.body.fail(BodyError("the request was answered"))
            self._reading = None
        self._resume("body")
        self._linger = asyncio.get_running_loop().call_later(LINGER_S, self._close)

    def _half_close(self) -> None:
        """After the answer to a malformed request: end our side, drop what the client still sends, close at its
        end or after LINGER_S."""
        transport = self._transport
        if transport is None:
            return
        if not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()
        self._linger = asyncio.get_running_loop().call_later(LINGER_S, self._close)

    # ---- streamed responses (message.Connection) ---------------------------------------------------------------
    def start_stream(self, status: int, content_type: str) -> None:
        self._streamed = True
        self._stream_chunked = self._parser.get_http_version() != "1.0"
        coding = b"Transfer-Encoding: chunked\r\n" if self._stream_chunked else b"Connection: close\r\n"
        self._write(stream_head(status, content_type, coding))

    def write(self, data: bytes) -> None:
        if self._stream_chunked:
            self._write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self._write(data)

    def end_stream(self) -> None:
        if self._stream_chunked:
            self._write(b"0\r\n\r\n")
        else:
            self._close()

    def _write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        self._transport.write(data)

    async def drain(self) -> None:
        if self._transport is None:
            raise ConnectionResetError("Cannot write to closing transport")
        if self._write_paused:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def _wake_drain(self, error: Exception | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    # ---- reading pauses (message.Connection) -------------------------------------------------------------------
    def pause_reading(self) -> None:
        self._pause("body")

    def resume_reading(self) -> None:
        self._resume("body")

    def _pause(self, reason: str) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused.add(reason)

    def _resume(self, reason: str) -> None:
        self._paused.discard(reason)
        if not self._paused and self._transport is not None:
            self._transport.resume_reading()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def close_when_idle(self) -> None:
        if self._task is None and not self._start_when_complete:
            self._close()


class H1Server:
    """The listener: one _Connection per client."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections: set[_Connection] = set()
        self.stopping = False
        self._server: asyncio.base_events.Server | None = None

    async def start(self, sock: socket.socket, ssl_context: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=sock, ssl=ssl_context, backlog=1024)

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting; idle connections close now, busy ones after their answer or at timeout_s."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + timeout_s
        while True:
            for conn in list(self.connections):
                conn.close_when_idle()
            if not self.connections or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn._close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
