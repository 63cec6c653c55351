"""The HTTP/2 rules a gRPC server must keep where clients such as tritonclient never go, checked with a bare HTTP/2
client over a socket on both grpcio and Trireme's own h2 transport (docs/grpc.md), which must answer alike:
an over-limit request refused from its 5-byte length prefix before its body is sent, client pings beyond the
strike limit answered by GOAWAY ENHANCE_YOUR_CALM "too_many_pings", an unknown method UNIMPLEMENTED, a
grpc-timeout that expires DEADLINE_EXCEEDED, a reset stream leaving the server serving, a request cut into frames
and socket writes anywhere (prefix, frame heads, padding) answered with its own bytes, a stream limit announced
and enforced; on h2, a compressed request's window given back by its size on the wire."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess

hpack = pytest.importorskip("hpack", reason="hpack is not installed (trireme[grpc-h2])")

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK, PADDED = 0x1, 0x4, 0x1, 0x8
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", sid) + payload


class Wire:
    """A bare HTTP/2 client connection: frames out, frames in."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.buf = b""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def close(self) -> None:
        self.sock.close()

    def open_windows(self) -> None:
        """The largest windows HTTP/2 allows, for the stream and the connection: answers may come whole."""
        self.send(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, (1 << 31) - 1)))
        self.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535)))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, sid: int, path: str, extra: list[tuple[str, str]] | None = None, end: bool = False) -> None:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost")]
        headers += [("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])]
        self.send(frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, self.enc.encode(headers)))

    def next_frame(self) -> tuple[int, int, int, bytes] | None:
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    ftype, flags = self.buf[3], self.buf[4]
                    sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                    payload, self.buf = self.buf[9 : 9 + n], self.buf[9 + n :]
                    return ftype, flags, sid, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def trailers(self, sid: int) -> dict[str, str]:
        """The headers of the stream's frame that ends it (PINGs answered, other frames skipped)."""
        while (f := self.next_frame()) is not None:
            ftype, flags, fsid, payload = f
            if ftype == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, payload))
            if ftype == HEADERS and fsid == sid:
                headers = dict(self.dec.decode(payload))
                if flags & END_STREAM:
                    return headers
        raise AssertionError("the connection closed before the stream ended")

    def goaway(self) -> tuple[int, bytes]:
        while (f := self.next_frame()) is not None:
            if f[0] == GOAWAY:
                return struct.unpack(">I", f[3][4:8])[0], f[3][8:]
        raise AssertionError("no GOAWAY before the connection closed")


@pytest.fixture
def wire(transport_server: ServerProcess) -> Iterator[Wire]:
    w = Wire(transport_server.port)
    yield w
    w.close()


@pytest.mark.parametrize("rpc", ["ModelInfer", "ModelStreamInfer"])
def test_over_limit_refused_from_the_prefix(wire: Wire, rpc: str) -> None:
    wire.request(1, f"/inference.GRPCInferenceService/{rpc}")
    wire.send(frame(DATA, 0, 1, struct.pack(">BI", 0, 3 << 30)))  # announces 3 GiB, sends none of it
    trailers = wire.trailers(1)
    assert trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert "Received message larger than max (3221225472 vs. 2147483647)" in trailers.get("grpc-message", "")


def test_unknown_method_unimplemented(wire: Wire) -> None:
    wire.request(1, "/inference.GRPCInferenceService/NoSuchRpc", end=True)
    assert wire.trailers(1)["grpc-status"] == "12"


def test_deadline_exceeded(wire: Wire) -> None:
    wire.request(1, "/inference.GRPCInferenceService/ModelStreamInfer", [("grpc-timeout", "300m")])
    assert wire.trailers(1)["grpc-status"] == "4"  # the stream stays open, the deadline ends it


def test_reset_stream_then_serving(wire: Wire) -> None:
    wire.request(1, "/inference.GRPCInferenceService/ModelStreamInfer")
    wire.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))  # CANCEL
    wire.request(3, "/inference.GRPCInferenceService/ServerLive")
    wire.send(frame(DATA, END_STREAM, 3, struct.pack(">BI", 0, 0)))
    assert wire.trailers(3)["grpc-status"] == "0"


def test_too_many_pings(wire: Wire) -> None:
    for k in range(4):  # no call in flight: every ping after the first strikes; the limit is 2 strikes
        wire.send(frame(PING, 0, 0, bytes(7) + bytes((k,))))
    code, debug = wire.goaway()
    assert code == 11 and b"too_many_pings" in debug  # ENHANCE_YOUR_CALM


def test_unanswered_keepalive_closes(start_server) -> None:  # type: ignore[no-untyped-def]
    """h2 only: --grpc-keepalive-time/-timeout with pings permitted without calls: a client that never answers the
    server's PINGs is disconnected after the timeout; the server keeps serving new connections. (grpcio sends the
    ping on time but, measured, keeps such a connection open past 30 s: grpc core closes it on its own, longer,
    ping timeout.)"""
    args = ["--grpc-transport", "h2", "--grpc-keepalive-time=300", "--grpc-keepalive-timeout=300"]
    server = start_server(args=[*args, "--grpc-keepalive-permit-without-calls=true"])
    w = Wire(server.port)
    try:
        pinged = False
        while (f := w.next_frame()) is not None:  # read only: PINGs are never answered
            pinged = pinged or (f[0] == PING and not f[1] & ACK)
        assert pinged  # the connection ended after the server's unanswered ping
    finally:
        w.close()
    again = Wire(server.port)
    try:
        again.request(1, "/inference.GRPCInferenceService/ServerLive")
        again.send(frame(DATA, END_STREAM, 1, struct.pack(">BI", 0, 0)))
        assert again.trailers(1)["grpc-status"] == "0"
    finally:
        again.close()


def _infer_body(values: np.ndarray) -> bytes:
    """A serialised ModelInfer request for identity_fp32_any with `values` (float32) as its INPUT0."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="identity_fp32_any")
    tensor = req.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend(values.shape)
    req.raw_input_contents.append(values.tobytes())
    return req.SerializeToString()


def _infer_message(n: int) -> bytes:
    """A length-prefixed ModelInfer request for identity_fp32_any with n float32 zeros."""
    body = _infer_body(np.zeros((1, n), dtype=np.float32))
    return struct.pack(">BI", 0, len(body)) + body


class Windows:
    """A sender's view of the server's flow-control windows for one stream and the connection."""

    def __init__(self) -> None:
        self.conn = self.stream = self.initial = 65535

    @property
    def room(self) -> int:
        return min(self.conn, self.stream)

    def spend(self, n: int) -> None:
        self.conn -= n
        self.stream -= n

    def wait(self, wire: Wire) -> None:
        """Read one frame from the server: WINDOW_UPDATEs and SETTINGS widen the windows, PINGs are answered
        (grpc core measures the bandwidth-delay product with them before it widens its windows)."""
        got = wire.next_frame()
        assert got is not None, "the connection closed while the request was sent"
        ftype, flags, sid, payload = got
        if ftype == PING and not flags & ACK:
            wire.send(frame(PING, ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            inc = struct.unpack(">I", payload)[0]
            if sid == 0:
                self.conn += inc
            else:
                self.stream += inc
        elif ftype == SETTINGS and not flags & ACK:
            for i in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[i : i + 6])
                if key == 4:  # SETTINGS_INITIAL_WINDOW_SIZE
                    self.stream, self.initial = self.stream + value - self.initial, value
            wire.send(frame(SETTINGS, ACK, 0))


def _send_body(wire: Wire, sid: int, message: bytes) -> None:
    """DATA frames within the server's flow-control windows, END_STREAM last."""
    windows, view = Windows(), memoryview(message)
    while view:
        n = min(len(view), 16384, windows.room)
        if n <= 0:
            windows.wait(wire)
            continue
        wire.send(frame(DATA, END_STREAM if n == len(view) else 0, sid, bytes(view[:n])))
        view = view[n:]
        windows.spend(n)


@pytest.mark.parametrize("transport_server", ["h2"], indirect=True)  # how h2 ends a call: grpc core's is its own
def test_answer_after_the_connection_failed_ends_quietly(transport_server: ServerProcess) -> None:
    """A call answered after its connection failed, while the transport still holds unsent bytes for a client that
    stopped reading (so the connection is closing but not yet lost), ends like a cancelled call: no handler error
    in the log, and the server serves on."""
    wire = Wire(transport_server.port)
    try:
        # The client opens its windows wide, asks for a 32 MiB answer and stops reading.
        wire.open_windows()
        wire.request(1, "/inference.GRPCInferenceService/ModelInfer")
        _send_body(wire, 1, _infer_message(8 << 20))
        time.sleep(2.0)  # the answer fills the socket buffers; the rest waits in the server's transport
        # A second call, then a protocol error (a stream id reused): GOAWAY while that call runs.
        wire.request(3, "/inference.GRPCInferenceService/ModelInfer")
        wire.send(frame(DATA, END_STREAM, 3, _infer_message(16)))
        wire.request(1, "/inference.GRPCInferenceService/ServerLive", end=True)
        time.sleep(2.0)
    finally:
        wire.close()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{transport_server.port}")
    try:
        assert client.is_server_live()
        assert client.infer("identity_fp32_any", [_fp32_input(4)]).as_numpy("OUTPUT0").shape == (1, 4)
    finally:
        client.close()
    assert "Traceback" not in transport_server.log(), transport_server.log()


def _fp32_input(n: int) -> grpcclient.InferInput:
    x = grpcclient.InferInput("INPUT0", [1, n], "FP32")
    x.set_data_from_numpy(np.ones((1, n), dtype=np.float32))
    return x


_LIVE = "/inference.GRPCInferenceService/ServerLive"
_BASE = [(":method", "POST"), (":scheme", "http"), (":path", _LIVE), (":authority", "localhost")]
_BASE += [("content-type", "application/grpc"), ("te", "trailers")]


def _without(*names: str) -> list[tuple[str, str]]:
    return [h for h in _BASE if h[0] not in names]


def _replaced(name: str, value: str) -> list[tuple[str, str]]:
    return [(n, value if n == name else v) for n, v in _BASE]


@pytest.mark.parametrize(
    ("headers", "expect"),
    [
        (_replaced(":method", "GET"), "reset"),
        (_without(":scheme"), "reset"),
        (_without(":path"), "reset"),
        (_without(":authority"), "reset"),
        (_without("te"), "reset"),
        (_replaced("te", "gzip"), "Error parsing 'te' metadata"),
        (_replaced(":scheme", "ftp"), "Error parsing ':scheme' metadata"),
        ([*_BASE, ("X-Upper", "1")], "Illegal header key: X-Upper"),
        ([*_BASE, (":foo", "1")], "Illegal header key: :foo"),
        ([*_without(":authority"), ("host", "localhost")], "ok"),  # host stands in for :authority
        (_without("content-type"), "ok"),  # grpc core takes any content-type
        (_replaced("content-type", "application/json"), "ok"),
    ],
)
def test_request_headers_checked_as_grpc_core_does(
    transport_server: ServerProcess, wire: Wire, headers: list[tuple[str, str]], expect: str
) -> None:
    """Both transports answer a malformed request head alike: grpc core resets a stream that is not a gRPC
    request (RST_STREAM INTERNAL_ERROR), ends a call with a bad te, :scheme or header name with INTERNAL and its
    message, and takes what it tolerates. The server serves on (checked on a new connection: after a refused head
    grpc core's HPACK table no longer follows the client's)."""
    wire.send(frame(HEADERS, END_HEADERS, 1, wire.enc.encode(headers)))
    wire.send(frame(DATA, END_STREAM, 1, struct.pack(">BI", 0, 0)))
    while (got := wire.next_frame()) is not None:
        ftype, flags, sid, payload = got
        if ftype == RST_STREAM and sid == 1:
            assert expect == "reset" and struct.unpack(">I", payload)[0] == 2  # INTERNAL_ERROR
            break
        if ftype == HEADERS and sid == 1 and flags & END_STREAM:
            trailers = dict(wire.dec.decode(payload))
            if expect == "ok":
                assert trailers["grpc-status"] == "0"
            else:
                assert trailers["grpc-status"] == "13" and trailers.get("grpc-message") == expect
            break
        if ftype == HEADERS and sid == 1:
            wire.dec.decode(payload)  # response headers: the HPACK state must follow
    else:
        raise AssertionError("the connection closed before the stream ended")
    again = Wire(transport_server.port)
    try:
        again.request(1, _LIVE)
        again.send(frame(DATA, END_STREAM, 1, struct.pack(">BI", 0, 0)))
        assert again.trailers(1)["grpc-status"] == "0"
    finally:
        again.close()


def _cut_request(wire: Wire, sid: int, message: bytes, padded: bool) -> None:
    """`message` as DATA frames of uneven sizes (1 byte, a cut prefix, full 16 KiB ones; padded ones if asked),
    their bytes sent in socket writes cut anywhere (inside frame heads too), within the server's windows."""
    sizes, writes = [1, 3, 2, 16384, 7, 9000, 16384, 100, 16384], [1, 8, 9, 10, 3, 40000, 13, 16393, 2]
    windows, pos, k, out = Windows(), 0, 0, bytearray()
    while pos < len(message):
        pad = 5 if padded and k % 3 == 2 else 0
        n = min(sizes[k % len(sizes)], len(message) - pos, 16384 - (pad + 1 if pad else 0))
        if n + pad + (1 if pad else 0) > windows.room:
            _send_cut(wire, out, writes)  # what is built goes first, then the windows are waited for
            windows.wait(wire)
            continue
        last = END_STREAM if pos + n == len(message) else 0
        body = message[pos : pos + n]
        payload = bytes((pad,)) + body + bytes(pad) if pad else body
        out += frame(DATA, last | (PADDED if pad else 0), sid, payload)
        windows.spend(len(payload))
        pos, k = pos + n, k + 1
    _send_cut(wire, out, writes)


def _send_cut(wire: Wire, out: bytearray, writes: list[int]) -> None:
    """All of `out`, in socket writes of the sizes `writes` cycles through (emptying `out`)."""
    w = 0
    while out:
        step = writes[w % len(writes)]
        wire.send(bytes(out[:step]))
        del out[:step]
        w += 1
        if w % 4 == 0:
            time.sleep(0.001)  # the server reads apart what was written apart


def test_request_cut_anywhere_answered_whole(transport_server: ServerProcess) -> None:
    """A 300 KiB ModelInfer request (over the 256 KiB from which both transports take the large-message paths) in
    frames and writes cut anywhere: the identity model answers the very same bytes. Padded DATA frames on h2 only:
    grpc core refuses DATA flags other than END_STREAM (RST_STREAM PROTOCOL_ERROR), RFC 7540 allows them."""
    from tritonclient.grpc import service_pb2

    wire = Wire(transport_server.port)
    try:
        wire.open_windows()
        values = np.random.default_rng(7).random((1, 75 << 10), dtype=np.float32)
        body = _infer_body(values)
        wire.request(1, "/inference.GRPCInferenceService/ModelInfer")
        padded = transport_server.transport == "h2"  # type: ignore[attr-defined]
        _cut_request(wire, 1, struct.pack(">BI", 0, len(body)) + body, padded)
        answer, trailers = bytearray(), None
        while trailers is None and (got := wire.next_frame()) is not None:
            ftype, flags, fsid, payload = got
            if ftype == PING and not flags & ACK:
                wire.send(frame(PING, ACK, 0, payload))
            elif ftype == DATA and fsid == 1:
                answer += payload
            elif ftype == HEADERS and fsid == 1:
                headers = dict(wire.dec.decode(payload))
                trailers = headers if flags & END_STREAM else None
        assert trailers is not None and trailers["grpc-status"] == "0", trailers
        assert struct.unpack(">BI", answer[:5]) == (0, len(answer) - 5)
        response = service_pb2.ModelInferResponse.FromString(bytes(answer[5:]))
        assert response.raw_output_contents[0] == values.tobytes()
    finally:
        wire.close()


@pytest.mark.parametrize("transport", ["grpcio", "h2"])
def test_streams_beyond_the_announced_limit_refused(transport: str) -> None:
    """grpc core's GRPC_ARG_MAX_CONCURRENT_STREAMS ("grpc.max_concurrent_streams"), which no flag sets (Triton does
    not set it: without it neither grpc core nor h2 announces or enforces a limit), on a bare server of each
    transport with a streaming method: the limit announced in SETTINGS, a stream beyond it refused with
    RST_STREAM REFUSED_STREAM (RFC 7540 section 5.1.2), a new one served once a stream has ended."""
    import asyncio
    import threading

    import grpc

    from service.frontend.grpc.h2.server import H2Server

    async def drain(requests, context):  # type: ignore[no-untyped-def]
        async for _ in requests:
            pass

    handlers = {"M": grpc.stream_stream_rpc_method_handler(drain)}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[object, int]:
        options = [("grpc.max_concurrent_streams", 2)]
        server = H2Server(options) if transport == "h2" else grpc.aio.server(options=options)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.S", handlers)])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    wire = Wire(port)
    try:
        while (got := wire.next_frame()) is not None and not (got[0] == SETTINGS and not got[1] & ACK):
            pass
        assert got is not None
        announced = dict(struct.unpack(">HI", got[3][i : i + 6]) for i in range(0, len(got[3]), 6))
        assert announced.get(3) == 2  # SETTINGS_MAX_CONCURRENT_STREAMS
        wire.send(frame(SETTINGS, ACK, 0))
        for sid in (1, 3, 5):
            wire.request(sid, "/t.S/M")
        while (got := wire.next_frame()) is not None and not (got[0] == RST_STREAM and got[2] == 5):
            assert got[0] != RST_STREAM, got  # streams 1 and 3 are served
        assert got is not None and struct.unpack(">I", got[3])[0] == 7  # REFUSED_STREAM
        wire.send(frame(DATA, END_STREAM, 1, b""))
        assert wire.trailers(1)["grpc-status"] == "0"
        wire.request(7, "/t.S/M", end=True)  # one stream ended: a new one is served
        assert wire.trailers(7)["grpc-status"] == "0"
    finally:
        wire.close()
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.parametrize("transport_server", ["h2"], indirect=True)  # grpc core sizes its windows its own way
def test_compressed_requests_give_back_only_their_window(transport_server: ServerProcess) -> None:
    """A stream's request window is given back as its handler reads, by what each message held on the wire: four
    gzip requests of 100 KiB of zeros (about 130 bytes each on the wire) read by ModelStreamInfer must not credit
    the client with their inflated size (which would let a client send far beyond the 1 MiB a stream may hold)."""
    import gzip

    wire = Wire(transport_server.port)
    try:
        wire.open_windows()
        packed = gzip.compress(_infer_body(np.zeros((1, 25 << 10), dtype=np.float32)))  # 100 KiB of zeros
        message = struct.pack(">BI", 1, len(packed)) + packed
        wire.request(1, "/inference.GRPCInferenceService/ModelStreamInfer", [("grpc-encoding", "gzip")])
        sent = 0
        for _ in range(4):
            wire.send(frame(DATA, 0, 1, message))
            sent += len(message)
        answers, credited, got_bytes = 0, 0, bytearray()
        while answers < 4 and (got := wire.next_frame()) is not None:
            ftype, flags, fsid, payload = got
            if ftype == PING and not flags & ACK:
                wire.send(frame(PING, ACK, 0, payload))
            elif ftype == WINDOW_UPDATE and fsid == 1:
                credited += struct.unpack(">I", payload)[0]
            elif ftype == DATA and fsid == 1:
                got_bytes += payload
                while len(got_bytes) >= 5 and len(got_bytes) >= 5 + struct.unpack(">I", got_bytes[1:5])[0]:
                    del got_bytes[: 5 + struct.unpack(">I", got_bytes[1:5])[0]]
                    answers += 1
            assert ftype != RST_STREAM and ftype != GOAWAY, got
        assert answers == 4
        wire.send(frame(DATA, END_STREAM, 1, b""))
        assert wire.trailers(1)["grpc-status"] == "0"
        assert credited <= sent, (credited, sent)
    finally:
        wire.close()
