"""Variant `h2`: the HTTP/2 state machine of python-hyper's `h2` library (hyperframe frames, hpack headers, its
stream states, flow-control windows and settings negotiation), driven as its docs show: bytes in with
`receive_data`, events out, bytes to send from `data_to_send`. h2 answers SETTINGS and PING itself and emits
WINDOW_UPDATE as the request bodies are acknowledged; this module adds the gRPC calls, response flow control
(DATA held back while the client's windows are short), RST_STREAM cancelling a call, GOAWAY on shutdown and on
protocol errors. Same gaps as the `own` variant for production (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes

from tests.bench.h2echo import rpc
from tests.bench.h2echo.own import CONN_WINDOW, MAX_MESSAGE, RESOURCE_EXHAUSTED, STREAM_WINDOW

RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
OK_TRAILERS = [(b"grpc-status", b"0")]


class _Stream:
    __slots__ = ("body", "checked", "method", "out", "task")

    def __init__(self, method: rpc.Method | None) -> None:
        self.method = method
        self.body = bytearray()
        self.checked = False  # the gRPC length prefix was checked against MAX_MESSAGE
        self.task: asyncio.Task[Any] | None = None
        self.out = b""  # response DATA not yet sent (flow control)


class LibConnection(asyncio.Protocol):
    """One client connection on an h2 H2Connection (server side, header names and values as bytes)."""

    def __init__(self, methods: dict[bytes, rpc.Method], live: set[LibConnection]) -> None:
        self._methods = methods
        self._live = live
        self._h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self._streams: dict[int, _Stream] = {}
        self._closing = False
        self._t: Any = None

    def connection_made(self, transport: Any) -> None:
        self._t = transport
        self._live.add(self)
        self._h2.initiate_connection()  # its SETTINGS carry h2's defaults: the wider window must come after them
        self._h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW})
        self._h2.increment_flow_control_window(CONN_WINDOW - 65535)
        transport.write(self._h2.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        for st in self._streams.values():
            if st.task is not None:
                st.task.cancel()
        self._streams.clear()

    def data_received(self, data: bytes) -> None:
        h2 = self._h2
        try:
            events = h2.receive_data(data)
        except ProtocolError as exc:  # h2 queues the GOAWAY itself, except for a bad connection preface
            out = h2.data_to_send() or self._goaway_for(exc)
            self._t.write(out)
            self._t.close()
            return
        for ev in events:
            if isinstance(ev, DataReceived):
                st = self._streams.get(ev.stream_id)
                if st is not None:
                    st.body += ev.data
                    if not st.checked and len(st.body) >= 5:
                        st.checked = True
                        if int.from_bytes(st.body[1:5]) > MAX_MESSAGE:  # refused before the body is buffered
                            self._reply(ev.stream_id, st, None, RESOURCE_EXHAUSTED, "Received message larger than max")
                h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, RequestReceived):
                path, ctype = b"", b""
                for name, value in ev.headers:
                    if name == b":path":
                        path = value
                    elif name == b"content-type":
                        ctype = value
                st = _Stream(self._methods.get(path))
                self._streams[ev.stream_id] = st
                if self._closing:
                    h2.reset_stream(ev.stream_id, 7)  # REFUSED_STREAM
                    del self._streams[ev.stream_id]
                elif not ctype.startswith(b"application/grpc"):
                    self._reply(ev.stream_id, st, None, rpc.INTERNAL, f"invalid content-type {ctype!r}")
            elif isinstance(ev, StreamEnded):
                sid = ev.stream_id
                st = self._streams.get(sid)
                if st is not None:
                    st.task = rpc.call(st.method, st.body, partial(self._reply, sid, st))
            elif isinstance(ev, StreamReset):
                st = self._streams.pop(ev.stream_id, None)
                if st is not None and st.task is not None:
                    st.task.cancel()
            elif isinstance(ev, (WindowUpdated, RemoteSettingsChanged)):
                self._unblock()
            elif isinstance(ev, ConnectionTerminated):
                self._closing = True
        out = h2.data_to_send()
        if out:
            self._t.write(out)
        self._after_stream()

    def _goaway_for(self, exc: ProtocolError) -> bytes:
        self._h2.close_connection(error_code=exc.error_code)
        return self._h2.data_to_send()

    def _reply(self, sid: int, st: _Stream, message: bytes | None, code: int, text: str) -> None:
        if self._streams.get(sid) is not st or self._t is None or self._t.is_closing():
            return
        h2 = self._h2
        try:
            if message is None:
                del self._streams[sid]
                trailers = [(b"grpc-status", str(code).encode()), (b"grpc-message", rpc.percent(text))]
                h2.send_headers(sid, RESPONSE_HEADERS + trailers, end_stream=True)
            else:
                h2.send_headers(sid, RESPONSE_HEADERS)
                st.out = rpc.frame_message(message)
                self._push(sid, st)
        except StreamClosedError:
            self._streams.pop(sid, None)
        self._t.write(h2.data_to_send())
        self._after_stream()

    def _push(self, sid: int, st: _Stream) -> None:
        """Send what the windows allow of a response's DATA, then its trailers."""
        h2 = self._h2
        while st.out:
            n = min(len(st.out), h2.local_flow_control_window(sid), h2.max_outbound_frame_size)
            if n <= 0:
                return  # WindowUpdated resumes it
            h2.send_data(sid, st.out[:n])
            st.out = st.out[n:]
        h2.send_headers(sid, OK_TRAILERS, end_stream=True)
        del self._streams[sid]

    def _unblock(self) -> None:
        for sid, st in list(self._streams.items()):
            if st.out:
                try:
                    self._push(sid, st)
                except StreamClosedError:
                    self._streams.pop(sid, None)

    def _after_stream(self) -> None:
        if self._closing and not self._streams and not self._t.is_closing():
            self._t.write(self._h2.data_to_send())
            self._t.close()

    def shutdown(self) -> None:
        """Server shutdown: GOAWAY(NO_ERROR); close once the calls in flight end."""
        if self._t is not None and not self._t.is_closing():
            self._h2.close_connection()
            self._t.write(self._h2.data_to_send())
            self._closing = True
            self._after_stream()
