"""One HTTP/2 connection of the h2 transport (RFC 7540) as an asyncio.Protocol: frames cut with struct and slices,
request header blocks decoded by `hpack` (headers.py), gRPC messages cut from DATA with their length checked
before the body is buffered (messages.py), flow control both ways, RST_STREAM cancelling the call's task, GOAWAY
on shutdown, keepalive and connection age (keepalive.py). Every method runs on the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from service.frontend.grpc.h2 import frames as f
from service.frontend.grpc.h2.context import CallGone, H2Context
from service.frontend.grpc.h2.headers import HeaderDecoder, RequestHead
from service.frontend.grpc.h2.keepalive import Keepalive
from service.frontend.grpc.h2.messages import Inbound, encode_message
from service.frontend.grpc.h2.peer import peer_identities, peer_name
from service.frontend.grpc.h2.roles import Host
from service.frontend.grpc.h2.runner import run_call

log = logging.getLogger("trireme.grpc.h2")

STREAM_WINDOW = 1 << 20  # what a request stream may send before its handler reads (announced in SETTINGS)
CONN_WINDOW = 16 << 20  # the same for the whole connection (credited as received)
_CORK_BYTES = 64 << 10  # a unary response up to this size leaves in one write with its trailers


class _Stream:
    __slots__ = ("ctx", "deadline_timer", "expired", "inbound", "send_window", "uncredited", "waiter")

    def __init__(self, ctx: H2Context, inbound: Inbound, send_window: int) -> None:
        self.ctx = ctx
        self.inbound = inbound
        self.send_window = send_window
        self.uncredited = 0  # DATA bytes received and not yet given back with a WINDOW_UPDATE
        self.waiter: asyncio.Future[None] | None = None  # a writer waiting for send window
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.expired = False


class H2Connection(asyncio.Protocol):
    def __init__(self, server: Host) -> None:
        self.server = server
        self.peer = ""
        self._t: Any = None
        self._buf = bytearray()
        self._preface = True
        self._streams: dict[int, _Stream] = {}
        self._last_sid = 0
        self._headers = HeaderDecoder()
        self._cont: tuple[int, int, bytearray] | None = None  # (stream, HEADERS flags, block so far)
        self._peer_window = 65535
        self._peer_max_frame = 16384
        self._conn_send = 65535
        self._conn_recv = 0
        self._closing = False
        self.keepalive = Keepalive(self, server.options)

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._t = transport
        self.peer = peer_name(transport)
        self.server.connections.add(self)
        settings = f.SETTING.pack(f.S_INITIAL_WINDOW, STREAM_WINDOW) + f.SETTING.pack(f.S_ENABLE_PUSH, 0)
        transport.write(
            f.frame(f.SETTINGS, 0, 0, settings) + f.frame(f.WINDOW_UPDATE, 0, 0, f.U32.pack(CONN_WINDOW - 65535))
        )
        self.keepalive.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.keepalive.stop()
        streams, self._streams = self._streams, {}
        for st in streams.values():
            self._drop(st)
        self.server.connection_closed()

    def peer_identities(self) -> list[bytes] | None:
        return peer_identities(self._t)

    def data_received(self, data: bytes) -> None:
        try:
            self._read(data)
        except Exception as exc:  # a bug, never the peer's bytes: that connection ends, the server serves on
            log.warning("HTTP/2 connection from %s closed after an internal error: %r", self.peer, exc)
            self.goaway(f.INTERNAL_ERROR, "internal error")

    def _read(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        if self._preface:
            if end < 24:
                return
            if buf[:24] != f.PREFACE:
                self.goaway(f.PROTOCOL_ERROR, "bad connection preface")
                return
            self._preface, pos = False, 24
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if length > f.MAX_FRAME_IN:
                self.goaway(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                return
            if end - pos < 9 + length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = f.U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            start = pos + 9
            pos = start + length
            if self._cont is not None and ftype != f.CONTINUATION:
                self.goaway(f.PROTOCOL_ERROR, "expected CONTINUATION")
                return
            if ftype == f.DATA:
                bounds = f.payload_bounds(buf, flags, start, pos, priority=False)
                if bounds is None:
                    self.goaway(f.PROTOCOL_ERROR, "DATA shorter than its padding")
                    return
                self._data(sid, flags, buf, pos - start, *bounds)
            elif ftype == f.HEADERS:
                bounds = f.payload_bounds(buf, flags, start, pos, priority=True)
                if bounds is None:
                    self.goaway(f.PROTOCOL_ERROR, "HEADERS shorter than its padding and priority")
                    return
                start, stop = bounds
                if flags & f.END_HEADERS:
                    self._on_headers(sid, flags, bytes(buf[start:stop]))
                else:
                    self._cont = (sid, flags, bytearray(buf[start:stop]))
            elif ftype == f.CONTINUATION:
                if self._cont is None or self._cont[0] != sid:
                    self.goaway(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
                    return
                self._cont[2].extend(buf[start:pos])
                if flags & f.END_HEADERS:
                    csid, cflags, block = self._cont
                    self._cont = None
                    self._on_headers(csid, cflags, bytes(block))
            else:
                self._control(ftype, flags, sid, bytes(buf[start:pos]))
            if self._t is None or self._t.is_closing():
                return
        del buf[:pos]

    # ---- requests --------------------------------------------------------------------------------------------
    def _on_headers(self, sid: int, flags: int, block: bytes) -> None:
        try:
            head = self._headers.decode(block)  # every block is decoded: HPACK state must follow the peer
        except Exception as exc:  # hpack's errors: the connection's compression state is lost
            self.goaway(f.COMPRESSION_ERROR, f"HPACK: {exc}")
            return
        st = self._streams.get(sid)
        if st is not None:  # request trailers
            if flags & f.END_STREAM:
                st.ctx.end_input()
            return
        if sid <= self._last_sid or not sid & 1:
            self.goaway(f.PROTOCOL_ERROR, "stream id not new or not a client stream")
            return
        self._last_sid = sid
        if self._closing:  # after our GOAWAY: refuse new calls
            self._t.write(f.frame(f.RST_STREAM, 0, sid, f.U32.pack(f.REFUSED_STREAM)))
            return
        if head.reset:  # not a gRPC request (no POST, a pseudo-header or te missing): grpc core resets it
            self._t.write(f.frame(f.RST_STREAM, 0, sid, f.U32.pack(f.INTERNAL_ERROR)))
            return
        self._start(sid, head, bool(flags & f.END_STREAM))

    def _start(self, sid: int, head: RequestHead, ended: bool) -> None:
        server = self.server
        handler = server.handler(head.path) if not head.error else None
        deadline = None if head.timeout is None else time.monotonic() + head.timeout
        ctx = H2Context(
            self,
            sid,
            head.metadata,
            deadline,
            handler.request_deserializer if handler is not None else None,
            handler.response_serializer if handler is not None else None,
        )
        inbound = Inbound(ctx, head.encoding, server.max_receive)
        st = _Stream(ctx, inbound, self._peer_window)
        self._streams[sid] = st
        ctx.compression = server.response_encoding(head.accept_encoding)
        if head.error:
            self.send_trailers(ctx, grpc.StatusCode.INTERNAL.value[0], head.error)
            return
        if handler is None:
            self.send_trailers(ctx, grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            return
        if head.encoding_error:
            self.send_trailers(ctx, grpc.StatusCode.UNIMPLEMENTED.value[0], head.encoding_error)
            return
        if not handler.response_streaming:
            ctx.cork = bytearray()
        if ended:
            ctx.end_input()
        ctx.task = asyncio.get_running_loop().create_task(run_call(ctx, handler))
        if deadline is not None:
            st.deadline_timer = asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + (head.timeout or 0.0), self._expire, st
            )

    def _expire(self, st: _Stream) -> None:
        st.expired = True
        if st.ctx.task is not None and not st.ctx.task.done():
            st.ctx.task.cancel()

    def deadline_hit(self, ctx: H2Context) -> bool:
        st = self._streams.get(ctx.sid)
        return st is not None and st.ctx is ctx and st.expired

    def _data(self, sid: int, flags: int, buf: bytearray, length: int, start: int, stop: int) -> None:
        """length: the whole frame's payload (padding counts for flow control); content: buf[start:stop]."""
        self._conn_recv += length
        if self._conn_recv > CONN_WINDOW:
            self.goaway(f.FLOW_CONTROL_ERROR, "connection window exceeded")
            return
        if self._conn_recv >= CONN_WINDOW // 2:
            self._t.write(f.frame(f.WINDOW_UPDATE, 0, 0, f.U32.pack(self._conn_recv)))
            self._conn_recv = 0
        st = self._streams.get(sid)
        if st is None:  # reset or answered already: the data only counted for the connection
            return
        st.uncredited += length
        if st.uncredited > STREAM_WINDOW:
            self._reset(st, f.FLOW_CONTROL_ERROR)
            return
        view = memoryview(buf)  # no copy here: feed copies once (released before data_received resizes buf)
        st.inbound.feed(view[start:stop])
        del view
        if flags & f.END_STREAM:
            st.ctx.end_input()
        self._credit(st)

    def _credit(self, st: _Stream) -> None:
        """Give the client back its stream window, except for messages its handler has not read yet: a client
        sending faster than the handler reads stops once STREAM_WINDOW bytes wait (bounded memory)."""
        held = st.inbound.held
        give = st.uncredited - held
        if give >= STREAM_WINDOW // 4 or (give > 0 and st.uncredited >= STREAM_WINDOW // 2):
            st.uncredited -= give
            self._t.write(f.frame(f.WINDOW_UPDATE, 0, st.ctx.sid, f.U32.pack(give)))

    def consumed(self, ctx: H2Context, nbytes: int) -> None:
        """The handler read a message of nbytes on the wire: its window may be credited."""
        st = self._streams.get(ctx.sid)
        if st is not None and st.ctx is ctx and self._t is not None and not self._t.is_closing():
            st.inbound.held -= nbytes
            self._credit(st)

    # ---- responses -------------------------------------------------------------------------------------------
    def send_headers(self, ctx: H2Context) -> None:
        if ctx.headers_sent or self._t is None or self._t.is_closing():
            return
        ctx.headers_sent = True
        ctx.wire_encoding = ctx.compression
        block = f.HEADERS_BY_ENCODING[ctx.compression or "identity"]
        if ctx.initial:
            block += f.metadata_block(ctx.initial)
        self._emit(ctx, f.headers_frames(ctx.sid, 0, block, self._peer_max_frame))
        self.keepalive.sent()

    async def send_message(self, ctx: H2Context, message: bytes) -> None:
        st = self._streams.get(ctx.sid)
        if st is None or st.ctx is not ctx or self._t is None or self._t.is_closing():
            raise CallGone("the call was reset or its connection closed")
        if len(message) > self.server.max_send:
            await ctx.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(message)} vs. {self.server.max_send})",
            )
        self.send_headers(ctx)
        data = encode_message(message, ctx.wire_encoding)
        view = memoryview(data)
        while view:
            n = min(len(view), self._peer_max_frame, st.send_window, self._conn_send)
            if n <= 0:
                self._flush(ctx)
                await self._wait_window(st)
                if self._streams.get(ctx.sid) is not st:
                    raise CallGone("the call was reset or its connection closed")
                continue
            self._emit(ctx, f.frame(f.DATA, 0, ctx.sid, view[:n]))
            view = view[n:]
            st.send_window -= n
            self._conn_send -= n
        self.keepalive.sent()

    def _emit(self, ctx: H2Context, data: bytes) -> None:
        """Frames of a unary response are gathered and go out in one write with its trailers; big ones at once."""
        cork = ctx.cork
        if cork is None:
            self._t.write(data)
        elif len(cork) + len(data) <= _CORK_BYTES:
            cork += data
        else:  # a large response: no gathering (it would copy it twice more)
            self._flush(ctx)
            ctx.cork = None
            self._t.write(data)

    def _flush(self, ctx: H2Context) -> None:
        if ctx.cork:
            self._t.write(ctx.cork)
            ctx.cork = bytearray()

    async def _wait_window(self, st: _Stream) -> None:
        st.waiter = asyncio.get_running_loop().create_future()
        try:
            await st.waiter
        finally:
            st.waiter = None

    def _wake(self, st: _Stream) -> None:
        if st.waiter is not None and not st.waiter.done():
            st.waiter.set_result(None)

    def send_trailers(self, ctx: H2Context, code: int, message: str) -> None:
        """End the call with its status (a trailers-only response when nothing was sent)."""
        st = self._streams.get(ctx.sid)
        if st is None or st.ctx is not ctx:
            return
        del self._streams[ctx.sid]
        if st.deadline_timer is not None:
            st.deadline_timer.cancel()
        if self._t is not None and not self._t.is_closing():
            block = f.OK_TRAILERS if code == 0 else f.status_block(code, message)
            if ctx.trailing:
                block += f.metadata_block(ctx.trailing)
            if not ctx.headers_sent:
                block = f.RESPONSE_HEADERS + f.metadata_block(ctx.initial) + block
            trailers = f.headers_frames(ctx.sid, f.END_STREAM, block, self._peer_max_frame)
            cork, ctx.cork = ctx.cork, None
            if cork:
                cork += trailers
                self._t.write(cork)
            else:
                self._t.write(trailers)
            if not ctx.half_closed:  # the client may still be sending: it need not
                self._t.write(f.frame(f.RST_STREAM, 0, ctx.sid, f.U32.pack(f.NO_ERROR)))
        ctx.finish(cancelled=False)
        self._after_stream()

    def _after_stream(self) -> None:
        if self._closing and not self._streams and self._t is not None:
            self._t.close()

    # ---- control frames --------------------------------------------------------------------------------------
    def _control(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == f.SETTINGS:
            if flags & f.ACK:
                return
            if sid or len(payload) % 6:
                self.goaway(f.PROTOCOL_ERROR if sid else f.FRAME_SIZE_ERROR, "bad SETTINGS")
                return
            for i in range(0, len(payload), 6):
                key, value = f.SETTING.unpack_from(payload, i)
                if key == f.S_INITIAL_WINDOW:
                    delta, self._peer_window = value - self._peer_window, value
                    for st in self._streams.values():
                        st.send_window += delta
                elif key == f.S_MAX_FRAME:
                    self._peer_max_frame = value
            self._t.write(f.frame(f.SETTINGS, f.ACK, 0))
            self._unblock()
        elif ftype == f.PING:
            if len(payload) != 8:
                self.goaway(f.FRAME_SIZE_ERROR, "PING payload must be 8 bytes")
            elif flags & f.ACK:
                self.keepalive.acked(payload)
            elif self.keepalive.ping_allowed(bool(self._streams)):
                self._t.write(f.frame(f.PING, f.ACK, 0, payload))
        elif ftype == f.WINDOW_UPDATE:
            inc = f.U32.unpack_from(payload)[0] & 0x7FFFFFFF if len(payload) == 4 else 0
            if sid == 0:
                self._conn_send += inc
                self._unblock()
            else:
                target = self._streams.get(sid)
                if target is not None:
                    target.send_window += inc
                    self._wake(target)
        elif ftype == f.RST_STREAM:
            gone = self._streams.pop(sid, None)
            if gone is not None:
                self._drop(gone)
            self._after_stream()
        elif ftype == f.GOAWAY:  # the client goes: finish what runs, then close
            self._closing = True
            self._after_stream()
        # PRIORITY and unknown frame types are ignored (RFC 7540 section 4.1)

    def _unblock(self) -> None:
        for st in self._streams.values():
            self._wake(st)

    def _drop(self, st: _Stream) -> None:
        """The client reset the stream or went away: the handler's task is cancelled, as on grpc.aio."""
        if st.deadline_timer is not None:
            st.deadline_timer.cancel()
        if st.ctx.task is not None and not st.ctx.task.done():
            st.ctx.task.cancel()
        self._wake(st)
        st.ctx.finish(cancelled=True)

    def _reset(self, st: _Stream, code: int) -> None:
        self._streams.pop(st.ctx.sid, None)
        self._drop(st)
        self._t.write(f.frame(f.RST_STREAM, 0, st.ctx.sid, f.U32.pack(code)))

    def goaway(self, code: int, why: str) -> None:
        """A connection error: GOAWAY with the code, then close."""
        if self._t is not None and not self._t.is_closing():
            self._t.write(f.frame(f.GOAWAY, 0, 0, f.GOAWAY_HEAD.pack(self._last_sid, code) + why.encode()))
            self._t.close()

    def shutdown(self) -> None:
        """GOAWAY(NO_ERROR) with the last stream taken; the connection closes once the calls in flight end."""
        if self._t is not None and not self._t.is_closing():
            self._t.write(f.frame(f.GOAWAY, 0, 0, f.GOAWAY_HEAD.pack(self._last_sid, f.NO_ERROR)))
            self._closing = True
            self._after_stream()

    def write_raw(self, data: bytes) -> None:
        if self._t is not None and not self._t.is_closing():
            self._t.write(data)

    def abort_connection(self) -> None:
        if self._t is not None:
            self._t.abort()

    @property
    def active(self) -> bool:
        return bool(self._streams)
