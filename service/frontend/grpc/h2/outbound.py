"""The send side of an h2 connection: response HEADERS, DATA cut to the peer's frame size and windows (a writer
waits for WINDOW_UPDATE), trailers, unary responses gathered into one write, and the peer's SETTINGS that bound
what is sent."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import grpc

from service.frontend.grpc.h2 import frames as f
from service.frontend.grpc.h2.context import CallGone, H2Context
from service.frontend.grpc.h2.keepalive import Keepalive
from service.frontend.grpc.h2.messages import encode_message
from service.frontend.grpc.h2.stream import Stream

_CORK_BYTES: Final = 64 << 10  # a unary response up to this size leaves in one write with its trailers
_NOTHING = memoryview(b"")


class Outbound:
    def __init__(self, streams: dict[int, Stream], keepalive: Keepalive, max_send: int) -> None:
        self.t: Any = None  # the transport, once connected
        self.streams = streams  # the connection's open streams (shared, not copied)
        self.keepalive = keepalive
        self.max_send = max_send
        self.peer_window = 65535  # the peer's SETTINGS_INITIAL_WINDOW_SIZE: a new stream's send window
        self.peer_max_frame = 16384
        self.conn_send = 65535  # the connection's send window

    def open(self) -> bool:
        return self.t is not None and not self.t.is_closing()

    def send_headers(self, ctx: H2Context) -> None:
        if ctx.headers_sent or not self.open():
            return
        ctx.headers_sent = True
        ctx.wire_encoding = ctx.compression
        block = f.HEADERS_BY_ENCODING[ctx.compression or "identity"]
        if ctx.initial:
            block += f.metadata_block(ctx.initial)
        self._emit(ctx, f.headers_frames(ctx.sid, 0, block, self.peer_max_frame))
        self.keepalive.sent()

    async def send_message(self, ctx: H2Context, message: bytes) -> None:
        st = self.streams.get(ctx.sid)
        if st is None or st.ctx is not ctx or not self.open():
            raise CallGone("the call was reset or its connection closed")
        if len(message) > self.max_send:
            await ctx.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(message)} vs. {self.max_send})",
            )
        self.send_headers(ctx)
        prefix, body = encode_message(message, ctx.wire_encoding)
        view = memoryview(body)
        pending = prefix  # the prefix goes out ahead of the body's first bytes, in the same frame
        pos, end = 0, len(body)
        while pending or pos < end:
            n = min(len(pending) + end - pos, self.peer_max_frame, st.send_window, self.conn_send)
            if n <= 0:
                self._flush(ctx)
                await self._wait_window(st)
                if self.streams.get(ctx.sid) is not st:
                    raise CallGone("the call was reset or its connection closed")
                continue
            k = min(len(pending), n)
            head = f.head(f.DATA, 0, ctx.sid, n) + pending[:k]
            pending = pending[k:]
            self._put(ctx, head, view[pos : pos + n - k])  # a slice of the message: no copy of it here
            pos += n - k
            st.send_window -= n
            self.conn_send -= n
        self.keepalive.sent()

    def _emit(self, ctx: H2Context, data: bytes) -> None:
        self._put(ctx, data, _NOTHING)

    def _put(self, ctx: H2Context, head: bytes, payload: memoryview) -> None:
        """A frame's bytes (its head, then a slice of a message). Frames of a unary response are gathered and go
        out in one write with its trailers; larger responses leave at once, the message slices as they are
        (uvloop writes them from the message's own buffer)."""
        cork = ctx.cork
        if cork is not None:
            if len(cork) + len(head) + len(payload) <= _CORK_BYTES:
                cork += head
                cork += payload
                return
            self._flush(ctx)  # a large response: no gathering (it would copy it twice more)
            ctx.cork = None
        if payload:
            self.t.writelines((head, payload))
        else:
            self.t.write(head)

    def _flush(self, ctx: H2Context) -> None:
        if ctx.cork:
            self.t.write(ctx.cork)
            ctx.cork = bytearray()

    async def _wait_window(self, st: Stream) -> None:
        st.waiter = asyncio.get_running_loop().create_future()
        try:
            await st.waiter
        finally:
            st.waiter = None

    def send_trailers(self, ctx: H2Context, code: int, message: str) -> None:
        """The call's status (a trailers-only response when nothing was sent), with what its cork gathered."""
        if not self.open():
            return
        block = f.OK_TRAILERS if code == 0 else f.status_block(code, message)
        if ctx.trailing:
            block += f.metadata_block(ctx.trailing)
        if not ctx.headers_sent:
            block = f.RESPONSE_HEADERS + f.metadata_block(ctx.initial) + block
        trailers = f.headers_frames(ctx.sid, f.END_STREAM, block, self.peer_max_frame)
        cork, ctx.cork = ctx.cork, None
        if cork:
            cork += trailers
            self.t.write(cork)
        else:
            self.t.write(trailers)
        if not ctx.half_closed:  # the client may still be sending: it need not
            self.t.write(f.frame(f.RST_STREAM, 0, ctx.sid, f.U32.pack(f.NO_ERROR)))

    # ---- what the peer allows --------------------------------------------------------------------------------
    def settings(self, payload: bytes) -> None:
        """The peer's SETTINGS (length checked): window and frame size taken, acknowledged, writers woken."""
        for i in range(0, len(payload), 6):
            key, value = f.SETTING.unpack_from(payload, i)
            if key == f.S_INITIAL_WINDOW:
                delta, self.peer_window = value - self.peer_window, value
                for st in self.streams.values():
                    st.send_window += delta
            elif key == f.S_MAX_FRAME:
                self.peer_max_frame = value
        self.t.write(f.frame(f.SETTINGS, f.ACK, 0))
        self.unblock()

    def window_update(self, sid: int, inc: int) -> None:
        if sid == 0:
            self.conn_send += inc
            self.unblock()
        else:
            target = self.streams.get(sid)
            if target is not None:
                target.send_window += inc
                target.wake()

    def unblock(self) -> None:
        for st in self.streams.values():
            st.wake()
