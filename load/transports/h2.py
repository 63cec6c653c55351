"""A minimal HTTP/2 client for unary gRPC calls, cheap enough that the load generator is not the bottleneck.

gRPC's Python stack costs about 200 us of CPU per unary call on the 2-core development VM, twice what
perf_analyzer's C++ client needs; this transport costs about 45 us. It speaks just enough HTTP/2 for
unary calls over one cleartext connection (RFC 7540; no TLS, no server push, no priorities):
requests are a pre-encoded HEADERS block (HPACK static-table references and literals, so no encoder
state) plus DATA frames honouring the server's flow-control windows, frame size and stream limit.
Response headers are never decoded (so no HPACK decoder state is needed): a call succeeded when its
stream delivered a complete gRPC message and ended cleanly; a trailers-only answer or RST_STREAM is a
failure, whose message the caller can fetch by replaying the request through the grpc library.
The protocol object runs on an asyncio (uvloop when available) loop owned by `H2Transport`.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

# Frame types, flags, settings ids (RFC 7540 section 6).
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 5, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
S_ENABLE_PUSH, S_MAX_CONCURRENT, S_INITIAL_WINDOW, S_MAX_FRAME = 2, 3, 4, 5
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_WINDOW = 2**31 - 1
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")

# on_done(context, message bytes or None on failure, reason)
OnDone = Callable[[Any, "bytes | None", str], None]


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    n = len(payload)
    return bytes((n >> 16 & 255, n >> 8 & 255, n & 255, ftype, flags)) + _U32.pack(stream_id) + payload


def _hpack_string(value: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded (length with a 7-bit prefix integer)."""
    return _hpack_int(len(value), 7, 0) + value


def _hpack_int(value: int, bits: int, first: int) -> bytes:
    limit = (1 << bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def header_block(authority: str, path: str) -> bytes:
    """HPACK block of a gRPC request: static-table names, literal values, never indexed."""
    indexed = {":method POST": 3, ":scheme http": 6}
    block = bytes((0x80 | indexed[":method POST"], 0x80 | indexed[":scheme http"]))
    for name_index, value in ((4, path), (1, authority), (31, "application/grpc")):  # :path :authority content-type
        block += _hpack_int(name_index, 4, 0) + _hpack_string(value.encode())
    block += b"\x00" + _hpack_string(b"te") + _hpack_string(b"trailers")
    return block


class _Stream:
    __slots__ = ("body", "ctx", "data", "offset", "window")

    def __init__(self, ctx: Any, body: bytes, window: int) -> None:
        self.ctx = ctx
        self.body = body  # the framed gRPC message still to send, from `offset`
        self.offset = 0
        self.window = window
        self.data = bytearray()


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying unary calls to one method; all methods run on the loop thread."""

    def __init__(self, authority: str, path: str, on_done: OnDone) -> None:
        self._headers = header_block(authority, path)
        self._on_done = on_done
        self._buf = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._blocked: deque[int] = deque()  # streams waiting for send window
        self._queued: deque[tuple[Any, bytes]] = deque()  # calls waiting for a stream slot
        self._next_id = 1
        self._conn_window = 65535
        self._peer_window = 65535
        self._max_frame = 16384
        self._max_streams = 1 << 30
        self._unacked = 0
        self._cont_end: int | None = None  # stream id whose HEADERS awaits CONTINUATION (and ends it)
        self._transport: Any = None
        self.error: str | None = None
        self.closed = asyncio.get_running_loop().create_future()

    # ---- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:  # uvloop's transports are not asyncio.Transport
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = _SETTING.pack(S_ENABLE_PUSH, 0) + _SETTING.pack(S_INITIAL_WINDOW, MAX_WINDOW)
        transport.write(
            PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - 65535))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(f"connection lost: {exc}" if exc else "connection closed by the server")
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if end - pos < 9 + length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            start = pos + 9
            pos = start + length
            if ftype == DATA:
                self._unacked += length
                st = self._streams.get(sid)
                if st is not None:
                    if flags & PADDED:
                        st.data += buf[start + 1 : pos - buf[start]]
                    else:
                        st.data += buf[start:pos]
                if flags & END_STREAM:
                    self._finish(sid, "")
            elif ftype in (HEADERS, CONTINUATION):
                if ftype == HEADERS and not flags & END_HEADERS:
                    self._cont_end = sid if flags & END_STREAM else 0
                elif ftype == CONTINUATION and flags & END_HEADERS:
                    if self._cont_end:
                        self._finish(self._cont_end, "")
                    self._cont_end = None
                elif ftype == HEADERS and flags & END_STREAM:
                    self._finish(sid, "")
            else:
                self._control(ftype, flags, sid, bytes(buf[start:pos]))
        del buf[:pos]
        if self._unacked >= 1 << 20 and self._transport is not None:
            self._transport.write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._unacked)))
            self._unacked = 0

    # ---- frames other than DATA/HEADERS ------------------------------------------------------------------
    def _control(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        t = self._transport
        assert t is not None
        if ftype == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = _SETTING.unpack_from(payload, i)
                if key == S_INITIAL_WINDOW:
                    delta = value - self._peer_window
                    self._peer_window = value
                    for st in self._streams.values():
                        st.window += delta
                elif key == S_MAX_FRAME:
                    self._max_frame = value
                elif key == S_MAX_CONCURRENT:
                    self._max_streams = value
            t.write(frame(SETTINGS, ACK, 0))
            self._flush_blocked()
        elif ftype == PING and not flags & ACK:
            t.write(frame(PING, ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            inc = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self._conn_window += inc
            elif sid in self._streams:
                self._streams[sid].window += inc
            self._flush_blocked()
        elif ftype == RST_STREAM:
            code = _U32.unpack_from(payload)[0] if len(payload) >= 4 else 0
            self._finish(sid, f"stream reset by the server (HTTP/2 error {code})")
        elif ftype == GOAWAY:
            code = _U32.unpack_from(payload, 4)[0] if len(payload) >= 8 else 0
            self.error = f"server sent GOAWAY (HTTP/2 error {code}): {payload[8:].decode(errors='replace')}"
            self._fail_all(self.error)
            t.close()
        elif ftype == PUSH_PROMISE:
            self.error = "server push is not supported"
            t.close()

    # ---- sending ---------------------------------------------------------------------------------------
    def send(self, message: bytes, ctx: Any) -> None:
        """Start a unary call carrying one serialized protobuf message."""
        if self.error is not None or self._transport is None or self._transport.is_closing():
            self._on_done(ctx, None, self.error or "connection is closed")
            return
        if len(self._streams) >= self._max_streams:
            self._queued.append((ctx, message))
            return
        sid = self._next_id
        self._next_id += 2
        body = b"\x00" + _U32.pack(len(message)) + message
        st = _Stream(ctx, body, self._peer_window)
        self._streams[sid] = st
        n = len(body)
        if n <= self._max_frame and n <= st.window and n <= self._conn_window:
            st.window -= n
            self._conn_window -= n
            st.offset = n
            self._transport.write(frame(HEADERS, END_HEADERS, sid, self._headers) + frame(DATA, END_STREAM, sid, body))
            return
        self._transport.write(frame(HEADERS, END_HEADERS, sid, self._headers))
        self._push(sid, st)

    def _push(self, sid: int, st: _Stream) -> None:
        """Send as much of a stream's body as the windows allow; park it otherwise."""
        assert self._transport is not None
        while st.offset < len(st.body):
            n = min(len(st.body) - st.offset, self._max_frame, st.window, self._conn_window)
            if n <= 0:
                self._blocked.append(sid)
                return
            last = st.offset + n == len(st.body)
            self._transport.write(frame(DATA, END_STREAM if last else 0, sid, st.body[st.offset : st.offset + n]))
            st.offset += n
            st.window -= n
            self._conn_window -= n

    def _flush_blocked(self) -> None:
        for _ in range(len(self._blocked)):
            sid = self._blocked.popleft()
            st = self._streams.get(sid)
            if st is not None:
                self._push(sid, st)

    # ---- completion ------------------------------------------------------------------------------------
    def _finish(self, sid: int, failure: str) -> None:
        st = self._streams.pop(sid, None)
        if st is None:
            return
        data = st.data
        if not failure and (len(data) < 5 or _U32.unpack_from(data, 1)[0] != len(data) - 5):
            failure = "the call ended without a response message"
        self._on_done(st.ctx, None if failure else bytes(data[5:]), failure)
        if self._queued and len(self._streams) < self._max_streams:
            ctx, message = self._queued.popleft()
            self.send(message, ctx)

    def _fail_all(self, reason: str) -> None:
        streams, self._streams = self._streams, {}
        queued, self._queued = self._queued, deque()
        for st in streams.values():
            self._on_done(st.ctx, None, reason)
        for ctx, _message in queued:
            self._on_done(ctx, None, reason)

    def close(self) -> None:
        """Close the connection (in-flight calls fail)."""
        if self._transport is not None:
            self._transport.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running in a daemon thread, with a thread-safe `call` and an orderly `stop`."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="load-h2-loop")
        self._thread.start()
        self.thread_id = self._thread.ident

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any, timeout_s: float) -> Any:
        """Run a coroutine on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self.loop.close()
