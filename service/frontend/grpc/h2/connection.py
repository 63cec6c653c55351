"""One HTTP/2 connection of the h2 transport (RFC 7540) as an asyncio.Protocol: frames cut by reader.py, request
header blocks decoded by `hpack` (headers.py), gRPC messages cut from DATA with their length checked before the
body is buffered (messages.py), the receive windows credited as handlers read, responses sent by outbound.py,
RST_STREAM cancelling the call's task, GOAWAY on shutdown, keepalive and connection age (keepalive.py). Every
method runs on the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import grpc

from service.frontend.grpc.h2 import frames as f
from service.frontend.grpc.h2.context import H2Context
from service.frontend.grpc.h2.headers import HeaderDecoder, RequestHead
from service.frontend.grpc.h2.keepalive import Keepalive
from service.frontend.grpc.h2.messages import Inbound
from service.frontend.grpc.h2.outbound import Outbound
from service.frontend.grpc.h2.peer import peer_identities, peer_name
from service.frontend.grpc.h2.reader import FrameReader
from service.frontend.grpc.h2.roles import Host
from service.frontend.grpc.h2.runner import run_call
from service.frontend.grpc.h2.stream import Stream

log = logging.getLogger("trireme.grpc.h2")

STREAM_WINDOW: Final = 1 << 20  # what a request stream may send before its handler reads (announced in SETTINGS)
CONN_WINDOW: Final = 16 << 20  # the same for the whole connection (credited as received)


class H2Connection(asyncio.Protocol):
    def __init__(self, server: Host) -> None:
        self.server = server
        self.peer = ""
        self._t: Any = None
        self._streams: dict[int, Stream] = {}
        self._last_sid = 0
        self._headers = HeaderDecoder()
        self._conn_recv = 0
        self._closing = False
        self.keepalive = Keepalive(self, server.options)
        self._reader = FrameReader(self)
        self.out = Outbound(self._streams, self.keepalive, server.max_send)

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._t = self.out.t = transport
        self.peer = peer_name(transport)
        self.server.connections.add(self)
        settings = f.SETTING.pack(f.S_INITIAL_WINDOW, STREAM_WINDOW) + f.SETTING.pack(f.S_ENABLE_PUSH, 0)
        settings += f.SETTING.pack(f.S_MAX_FRAME, f.MAX_FRAME_IN)
        if self.server.max_streams >= 0:
            settings += f.SETTING.pack(f.S_MAX_STREAMS, self.server.max_streams)
        transport.write(
            f.frame(f.SETTINGS, 0, 0, settings) + f.frame(f.WINDOW_UPDATE, 0, 0, f.U32.pack(CONN_WINDOW - 65535))
        )
        self.keepalive.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.keepalive.stop()
        streams = list(self._streams.values())
        self._streams.clear()
        for st in streams:
            self._drop(st)
        self.server.connection_closed()

    def peer_identities(self) -> list[bytes] | None:
        return peer_identities(self._t)

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except Exception as exc:  # a bug, never the peer's bytes: that connection ends, the server serves on
            log.warning("HTTP/2 connection from %s closed after an internal error: %r", self.peer, exc)
            self.goaway(f.INTERNAL_ERROR, "internal error")

    def stopped(self) -> bool:
        """The connection is closing (or not made yet): no more frames are read, nothing more is written."""
        return self._t is None or self._t.is_closing()

    # ---- requests --------------------------------------------------------------------------------------------
    def headers(self, sid: int, flags: int, block: bytes) -> None:
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
        limit = self.server.max_streams
        if self._closing or 0 <= limit <= len(self._streams):  # after our GOAWAY, or beyond the limit announced
            self._t.write(f.frame(f.RST_STREAM, 0, sid, f.U32.pack(f.REFUSED_STREAM)))  # RFC 7540 section 5.1.2
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
        st = Stream(ctx, inbound, self.out.peer_window)
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

    def _expire(self, st: Stream) -> None:
        st.expired = True
        if st.ctx.task is not None and not st.ctx.task.done():
            st.ctx.task.cancel()

    def deadline_hit(self, ctx: H2Context) -> bool:
        st = self._streams.get(ctx.sid)
        return st is not None and st.ctx is ctx and st.expired

    def data(self, sid: int, flags: int, buf: memoryview, length: int, start: int, stop: int) -> None:
        """length: the whole frame's payload (padding counts for flow control; 0 for the later parts of a frame
        read in parts); content: buf[start:stop]."""
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
        st.inbound.feed(buf[start:stop])  # a view of the socket's bytes: feed copies it once
        if flags & f.END_STREAM:
            st.ctx.end_input()
        self._credit(st)

    def _credit(self, st: Stream) -> None:
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
        if st is not None and st.ctx is ctx and not self.stopped():
            st.inbound.held -= nbytes
            self._credit(st)

    # ---- responses (outbound.py) -----------------------------------------------------------------------------
    def send_headers(self, ctx: H2Context) -> None:
        self.out.send_headers(ctx)

    async def send_message(self, ctx: H2Context, message: bytes) -> None:
        await self.out.send_message(ctx, message)

    def send_trailers(self, ctx: H2Context, code: int, message: str) -> None:
        """End the call with its status (a trailers-only response when nothing was sent)."""
        st = self._streams.get(ctx.sid)
        if st is None or st.ctx is not ctx:
            return
        del self._streams[ctx.sid]
        if st.deadline_timer is not None:
            st.deadline_timer.cancel()
        self.out.send_trailers(ctx, code, message)
        ctx.finish(cancelled=False)
        self._after_stream()

    def _after_stream(self) -> None:
        if self._closing and not self._streams and self._t is not None:
            self._t.close()

    # ---- control frames --------------------------------------------------------------------------------------
    def control(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == f.SETTINGS:
            if flags & f.ACK:
                return
            if sid or len(payload) % 6:
                self.goaway(f.PROTOCOL_ERROR if sid else f.FRAME_SIZE_ERROR, "bad SETTINGS")
                return
            self.out.settings(payload)
        elif ftype == f.PING:
            if len(payload) != 8:
                self.goaway(f.FRAME_SIZE_ERROR, "PING payload must be 8 bytes")
            elif flags & f.ACK:
                self.keepalive.acked(payload)
            elif self.keepalive.ping_allowed(bool(self._streams)):
                self._t.write(f.frame(f.PING, f.ACK, 0, payload))
        elif ftype == f.WINDOW_UPDATE:
            self.out.window_update(sid, f.U32.unpack_from(payload)[0] & 0x7FFFFFFF if len(payload) == 4 else 0)
        elif ftype == f.RST_STREAM:
            gone = self._streams.pop(sid, None)
            if gone is not None:
                self._drop(gone)
            self._after_stream()
        elif ftype == f.GOAWAY:  # the client goes: finish what runs, then close
            self._closing = True
            self._after_stream()
        # PRIORITY and unknown frame types are ignored (RFC 7540 section 4.1)

    def _drop(self, st: Stream) -> None:
        """The client reset the stream or went away: the handler's task is cancelled, as on grpc.aio."""
        if st.deadline_timer is not None:
            st.deadline_timer.cancel()
        if st.ctx.task is not None and not st.ctx.task.done():
            st.ctx.task.cancel()
        st.wake()
        st.ctx.finish(cancelled=True)

    def _reset(self, st: Stream, code: int) -> None:
        self._streams.pop(st.ctx.sid, None)
        self._drop(st)
        self._t.write(f.frame(f.RST_STREAM, 0, st.ctx.sid, f.U32.pack(code)))

    def goaway(self, code: int, why: str) -> None:
        """A connection error: GOAWAY with the code, then close."""
        if not self.stopped():
            self._t.write(f.frame(f.GOAWAY, 0, 0, f.GOAWAY_HEAD.pack(self._last_sid, code) + why.encode()))
            self._t.close()

    def shutdown(self) -> None:
        """GOAWAY(NO_ERROR) with the last stream taken; the connection closes once the calls in flight end."""
        if not self.stopped():
            self._t.write(f.frame(f.GOAWAY, 0, 0, f.GOAWAY_HEAD.pack(self._last_sid, f.NO_ERROR)))
            self._closing = True
            self._after_stream()

    def write_raw(self, data: bytes) -> None:
        if not self.stopped():
            self._t.write(data)

    def abort_connection(self) -> None:
        if self._t is not None:
            self._t.abort()

    @property
    def active(self) -> bool:
        return bool(self._streams)
