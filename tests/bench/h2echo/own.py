"""Variant `own`: HTTP/2 framing of our own (RFC 7540): frames cut with struct and slices, HPACK decoded by the
`hpack` library with decoded header blocks cached by their raw bytes, responses from pre-encoded header and
trailer blocks. Enough HTTP/2 for grpc core clients (tritonclient, perf_analyzer) on cleartext unary calls:
SETTINGS and their ACK, flow control both ways (WINDOW_UPDATE for request bodies on the connection and each
stream; responses held back while the client's windows are short), PING ACK, RST_STREAM (cancels the call),
GOAWAY (sent on shutdown and on protocol errors; a client's GOAWAY closes the connection once its calls finish),
CONTINUATION, padding, and the gRPC length prefix checked against the size limit before the body is buffered.
Not there (what a production server would add, docs/benchmarks.md): TLS, compression, streaming RPCs, deadlines,
keepalive and ping policy, connection age, header validation beyond :path and content-type, priorities.
"""

from __future__ import annotations

import asyncio
import struct
from functools import partial
from typing import Any, ClassVar

from hpack import Decoder, HPACKError
from hpack.table import HeaderTable
from mypy_extensions import mypyc_attr

from load.transports.h2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from tests.bench.h2echo import rpc

PRIORITY_FLAG = 0x20
S_HEADER_TABLE, S_INITIAL_WINDOW, S_MAX_FRAME = 1, 4, 5
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, CANCEL, COMPRESSION_ERROR = 0, 1, 3, 6, 8, 9
MAX_FRAME_IN = 16384  # we keep the default SETTINGS_MAX_FRAME_SIZE for what we receive
STREAM_WINDOW = 1 << 20  # what each request stream may send before we acknowledge (we announce it in SETTINGS)
CONN_WINDOW = 16 << 20  # the same for the whole connection
MAX_MESSAGE = 2**31 - 1  # as echo_server.py's grpc.max_receive_message_length
RESOURCE_EXHAUSTED = 8
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")
_HEADER_BLOCKS_CACHED = 256


@mypyc_attr(native_class=False)  # (for a mypyc build: a subclass of a Python class)
class _CountingTable(HeaderTable):
    """hpack's header table with a generation number that moves whenever an entry is added (a dynamic table
    size update shows as a change of `maxsize`, which _decode compares too)."""

    generation = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.generation += 1
        super().add(name, value)


class _Stream:
    __slots__ = ("body", "checked", "method", "out", "recv", "send_window", "task", "trailers")

    def __init__(self, method: rpc.Method | None, send_window: int) -> None:
        self.method = method
        self.body = bytearray()
        self.checked = False  # the gRPC length prefix was checked against MAX_MESSAGE
        self.recv = 0  # DATA bytes received since our last WINDOW_UPDATE for the stream
        self.send_window = send_window
        self.task: asyncio.Task[Any] | None = None
        self.out = b""  # response DATA payload not yet sent (flow control)
        self.trailers = b""


class OwnConnection(asyncio.Protocol):
    """One client connection; every method runs on the event loop."""

    cache_misses_total: ClassVar[int] = 0  # header blocks hpack decoded on closed connections (the rest: cache hits)
    coalesce: ClassVar[bool] = False  # variant own_coalesced: answers written once per loop iteration, not each

    def __init__(self, methods: dict[bytes, rpc.Method], live: set[OwnConnection]) -> None:
        self._methods = methods
        self._live = live
        self._buf = bytearray()
        self._preface = True
        self._streams: dict[int, _Stream] = {}
        self._last_sid = 0
        self._decoder = Decoder()
        self._decoder.header_table = _CountingTable()
        self._cache: dict[bytes, tuple[rpc.Method | None, str]] = {}
        self.cache_misses = 0
        self._cont: tuple[int, int, bytearray] | None = None  # (stream, HEADERS flags, block so far)
        self._peer_window = 65535  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self._peer_max_frame = 16384
        self._conn_send = 65535
        self._conn_recv = 0  # DATA bytes since our last connection WINDOW_UPDATE
        self._blocked: list[int] = []
        self._closing = False
        self._pending: list[bytes] = []  # answers waiting for _flush (coalesce)
        self._t: Any = None

    # ---- asyncio.Protocol ------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._t = transport
        self._live.add(self)
        settings = _SETTING.pack(S_INITIAL_WINDOW, STREAM_WINDOW)
        transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONN_WINDOW - 65535)))

    def connection_lost(self, exc: Exception | None) -> None:
        OwnConnection.cache_misses_total += self.cache_misses
        self._live.discard(self)
        for st in self._streams.values():
            if st.task is not None:
                st.task.cancel()
        self._streams.clear()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        if self._preface:
            if end < 24:
                return
            if buf[:24] != PREFACE:
                self._goaway(PROTOCOL_ERROR, "bad connection preface")
                return
            self._preface, pos = False, 24
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if length > MAX_FRAME_IN:
                self._goaway(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                return
            if end - pos < 9 + length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            start = pos + 9
            pos = start + length
            if self._cont is not None and ftype != CONTINUATION:
                self._goaway(PROTOCOL_ERROR, "expected CONTINUATION")
                return
            if ftype == DATA:
                self._data(sid, flags, buf, start, pos)
            elif ftype == HEADERS:
                if flags & PADDED:
                    start, pos_end = start + 1, pos - buf[start]
                else:
                    pos_end = pos
                if flags & PRIORITY_FLAG:
                    start += 5
                if flags & END_HEADERS:
                    self._headers(sid, flags, bytes(buf[start:pos_end]))
                else:
                    self._cont = (sid, flags, bytearray(buf[start:pos_end]))
            elif ftype == CONTINUATION:
                if self._cont is None or self._cont[0] != sid:
                    self._goaway(PROTOCOL_ERROR, "unexpected CONTINUATION")
                    return
                self._cont[2].extend(buf[start:pos])
                if flags & END_HEADERS:
                    csid, cflags, block = self._cont
                    self._cont = None
                    self._headers(csid, cflags, bytes(block))
            else:
                self._control(ftype, flags, sid, bytes(buf[start:pos]))
            if self._t is None or self._t.is_closing():
                return
        del buf[:pos]

    # ---- requests --------------------------------------------------------------------------------------------
    def _decode(self, block: bytes) -> tuple[rpc.Method | None, str]:
        """(method, error) of a request header block, from the cache when that is sound.

        Decoding a block depends on the connection's HPACK dynamic table, and may change it (literals "with
        incremental indexing" add entries, a dynamic table size update may evict some). A block's decoded headers
        can be replayed from a cache keyed by its raw bytes only (1) while the table is exactly as it was when the
        block was decoded and (2) if decoding it changed nothing in the table: the same bytes then decode to the
        same headers and leave the same state, so skipping the decode is invisible. Hence a block whose decode
        moved the table (an entry added: the generation moved; or a new table size) is never cached, and every
        such change empties the cache (an indexed reference such as 0xbe names another entry once an entry was
        added before it); a size update to the current size changes nothing and may be skipped. grpc core clients
        index their headers on a connection's first call and then send the very same bytes for each call to that
        method, so every later call is a cache hit. Blocks with per-call values (a grpc-timeout) miss and decode
        normally."""
        hit = self._cache.get(block)
        if hit is not None:
            return hit
        self.cache_misses += 1
        table = self._decoder.header_table
        before = (table.generation, table.maxsize)  # type: ignore[attr-defined]
        headers = self._decoder.decode(block, raw=True)
        path, ctype = b"", b""
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"content-type":
                ctype = value
        error = "" if ctype.startswith(b"application/grpc") else f"invalid content-type {ctype!r}"
        info = (self._methods.get(path), error)
        if (table.generation, table.maxsize) != before:  # type: ignore[attr-defined]
            self._cache.clear()
        else:
            if len(self._cache) >= _HEADER_BLOCKS_CACHED:
                self._cache.clear()
            self._cache[block] = info
        return info

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        try:
            method, error = self._decode(block)  # every block is decoded: HPACK state must follow the peer
        except HPACKError as exc:
            self._goaway(COMPRESSION_ERROR, f"HPACK: {exc}")
            return
        st = self._streams.get(sid)
        if st is not None:  # trailers of a request
            if flags & END_STREAM:
                self._end(sid, st)
            return
        if sid <= self._last_sid or not sid & 1:
            self._goaway(PROTOCOL_ERROR, "stream id not new or not a client stream")
            return
        self._last_sid = sid
        if self._closing:  # after our GOAWAY: refuse new calls
            self._t.write(frame(RST_STREAM, 0, sid, _U32.pack(7)))  # REFUSED_STREAM
            return
        st = _Stream(method, self._peer_window)
        self._streams[sid] = st
        if error:
            self._reply(sid, st, None, rpc.INTERNAL, error)
        elif flags & END_STREAM:
            self._end(sid, st)

    def _data(self, sid: int, flags: int, buf: bytearray, start: int, pos: int) -> None:
        length = pos - start
        self._conn_recv += length
        if self._conn_recv > CONN_WINDOW:
            self._goaway(FLOW_CONTROL_ERROR, "connection window exceeded")
            return
        if self._conn_recv >= CONN_WINDOW // 2:
            self._t.write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._conn_recv)))
            self._conn_recv = 0
        st = self._streams.get(sid)
        if st is None:  # reset or answered already: the data only counted for the connection
            return
        st.recv += length
        if st.recv > STREAM_WINDOW:
            self._reset(sid, st, FLOW_CONTROL_ERROR)
            return
        if flags & PADDED:
            st.body += buf[start + 1 : pos - buf[start]]
        else:
            st.body += buf[start:pos]
        if not st.checked and len(st.body) >= 5:
            st.checked = True
            if _U32.unpack_from(st.body, 1)[0] > MAX_MESSAGE:  # refused before the body is buffered
                self._reply(sid, st, None, RESOURCE_EXHAUSTED, "Received message larger than max")
                self._t.write(frame(RST_STREAM, 0, sid, _U32.pack(NO_ERROR)))
                return
        if flags & END_STREAM:
            self._end(sid, st)
        elif st.recv >= STREAM_WINDOW // 2:
            self._t.write(frame(WINDOW_UPDATE, 0, sid, _U32.pack(st.recv)))
            st.recv = 0

    def _end(self, sid: int, st: _Stream) -> None:
        """The request is complete: run the call."""
        st.task = rpc.call(st.method, st.body, partial(self._reply, sid, st))

    # ---- responses -------------------------------------------------------------------------------------------
    def _reply(self, sid: int, st: _Stream, message: bytes | None, code: int, text: str) -> None:
        if self._streams.get(sid) is not st or self._t is None or self._t.is_closing():
            return  # reset meanwhile, or the connection is gone
        if message is None:
            del self._streams[sid]
            self._t.write(frame(HEADERS, END_HEADERS | END_STREAM, sid, rpc.status_block(code, text, True)))
            self._after_stream()
            return
        body = rpc.frame_message(message)
        n = len(body)
        if n <= self._peer_max_frame and n <= st.send_window and n <= self._conn_send:
            st.send_window -= n
            self._conn_send -= n
            del self._streams[sid]
            answer = (
                frame(HEADERS, END_HEADERS, sid, rpc.RESPONSE_HEADERS)
                + frame(DATA, 0, sid, body)
                + frame(HEADERS, END_HEADERS | END_STREAM, sid, rpc.OK_TRAILERS)
            )
            if self.coalesce:  # one write for the answers finished in the same loop iteration
                self._pending.append(answer)
                if len(self._pending) == 1:
                    asyncio.get_running_loop().call_soon(self._flush)
            else:
                self._t.write(answer)
            self._after_stream()
            return
        self._t.write(frame(HEADERS, END_HEADERS, sid, rpc.RESPONSE_HEADERS))
        st.out, st.trailers = body, rpc.OK_TRAILERS
        self._push(sid, st)

    def _push(self, sid: int, st: _Stream) -> None:
        """Send what the windows allow of a response's DATA, then its trailers; park the stream otherwise."""
        while st.out:
            n = min(len(st.out), self._peer_max_frame, st.send_window, self._conn_send)
            if n <= 0:
                self._blocked.append(sid)
                return
            self._t.write(frame(DATA, 0, sid, st.out[:n]))
            st.out = st.out[n:]
            st.send_window -= n
            self._conn_send -= n
        self._t.write(frame(HEADERS, END_HEADERS | END_STREAM, sid, st.trailers))
        self._streams.pop(sid, None)
        self._after_stream()

    def _unblock(self) -> None:
        blocked, self._blocked = self._blocked, []
        for sid in blocked:
            st = self._streams.get(sid)
            if st is not None and st.out:
                self._push(sid, st)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and self._t is not None and not self._t.is_closing():
            self._t.write(b"".join(pending))

    def _after_stream(self) -> None:
        if self._closing and not self._streams:
            self._flush()
            self._t.close()

    # ---- control frames --------------------------------------------------------------------------------------
    def _control(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == SETTINGS:
            if flags & ACK:
                return
            if sid or len(payload) % 6:
                self._goaway(FRAME_SIZE_ERROR if sid == 0 else PROTOCOL_ERROR, "bad SETTINGS")
                return
            for i in range(0, len(payload), 6):
                key, value = _SETTING.unpack_from(payload, i)
                if key == S_INITIAL_WINDOW:
                    delta, self._peer_window = value - self._peer_window, value
                    for st in self._streams.values():
                        st.send_window += delta
                elif key == S_MAX_FRAME:
                    self._peer_max_frame = value
                # S_HEADER_TABLE: our blocks never use the dynamic table, so the client's size does not matter
            self._t.write(frame(SETTINGS, ACK, 0))
            self._unblock()
        elif ftype == PING:
            if len(payload) != 8:
                self._goaway(FRAME_SIZE_ERROR, "PING payload must be 8 bytes")
            elif not flags & ACK:
                self._t.write(frame(PING, ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            inc = _U32.unpack_from(payload)[0] & 0x7FFFFFFF if len(payload) == 4 else 0
            if sid == 0:
                self._conn_send += inc
            elif sid in self._streams:
                self._streams[sid].send_window += inc
            self._unblock()
        elif ftype == RST_STREAM:
            gone = self._streams.pop(sid, None)
            if gone is not None and gone.task is not None:
                gone.task.cancel()  # the handler sees CancelledError, as on grpc.aio
            self._after_stream()
        elif ftype == GOAWAY:  # the client goes: finish what runs, then close
            self._closing = True
            self._after_stream()
        # PRIORITY and unknown frame types are ignored (RFC 7540 section 4.1)

    def _reset(self, sid: int, st: _Stream, code: int) -> None:
        self._streams.pop(sid, None)
        if st.task is not None:
            st.task.cancel()
        self._t.write(frame(RST_STREAM, 0, sid, _U32.pack(code)))

    def _goaway(self, code: int, why: str) -> None:
        """A connection error: GOAWAY with the code, then close."""
        if self._t is not None and not self._t.is_closing():
            self._t.write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._last_sid, code) + why.encode()))
            self._t.close()

    def shutdown(self) -> None:
        """Server shutdown: GOAWAY(NO_ERROR) with the last stream we took; close once the calls in flight end."""
        if self._t is not None and not self._t.is_closing():
            self._t.write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self._last_sid, NO_ERROR)))
            self._closing = True
            self._after_stream()
