"""HTTP/1.1 connection behaviour of the REST front end (service/frontend/http/h1.py) through raw sockets against a
real server: pipelining, HTTP/1.0 keep-alive, Expect: 100-continue, HEAD, response compression, limits on the
request head, a body answered early, and server-sent events in chunked encoding."""

from __future__ import annotations

import json
import socket
import zlib
from collections.abc import Iterator

import pytest
import requests

from tests.conftest import ServerProcess, running_server, write_model

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r,
                "INPUT0").as_numpy())]) for r in requests]
"""
CONFIG = """name: "ident"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("http_connections")
    write_model(repo, "ident", CONFIG, IDENTITY_PY)
    args = ["--http-max-input-size", "1048576"]
    with running_server([repo], tmp_path_factory.mktemp("http_connections_log") / "server.log", args) as s:
        yield s


def _body(values: list[float]) -> str:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]})


def _infer_request(server: ServerProcess, values: list[float], version: str = "1.1", extra: str = "") -> bytes:
    body = _body(values)
    return (
        f"POST /v2/models/ident/infer HTTP/{version}\r\nHost: {server.http_url}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n{body}"
    ).encode()


def _connect(server: ServerProcess) -> socket.socket:
    host, port = server.http_url.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _read_response(sock: socket.socket, buffer: bytearray) -> tuple[bytes, dict[str, str], bytes]:
    """One Content-Length response from the socket (the rest stays in buffer): status line, headers, body."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed; got {bytes(buffer)[:200]!r}"
        buffer += chunk
    head, _, _ = bytes(buffer).partition(b"\r\n\r\n")
    del buffer[: len(head) + 4]
    status, *lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode().strip() for k, _, v in (line.partition(b":") for line in lines)}
    length = int(headers.get("content-length", "0"))
    while len(buffer) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a body"
        buffer += chunk
    body = bytes(buffer[:length])
    del buffer[:length]
    return status, headers, body


def _outputs(body: bytes) -> list[float]:
    return list(json.loads(body)["outputs"][0]["data"])


def test_pipelined_requests_are_answered_in_order(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(b"".join(_infer_request(server, [float(i), float(i + 1)]) for i in range(5)))
        buffer = bytearray()
        for i in range(5):
            status, _, body = _read_response(sock, buffer)
            assert status == b"HTTP/1.1 200 OK"
            assert _outputs(body) == [float(i), float(i + 1)]


def test_http10_keep_alive_only_when_asked(server: ServerProcess) -> None:
    with _connect(server) as sock:
        buffer = bytearray()
        for _ in range(2):  # the same connection serves both
            sock.sendall(_infer_request(server, [1.0], "1.0", "Connection: keep-alive\r\n"))
            status, headers, body = _read_response(sock, buffer)
            assert status == b"HTTP/1.1 200 OK" and headers["connection"].lower() == "keep-alive"
            assert _outputs(body) == [1.0]
    with _connect(server) as sock:
        sock.sendall(_infer_request(server, [2.0], "1.0"))
        status, headers, body = _read_response(sock, bytearray())
        assert _outputs(body) == [2.0] and headers["connection"].lower() == "close"
        assert sock.recv(10) == b""  # closed after the answer


def test_expect_100_continue(server: ServerProcess) -> None:
    request = _infer_request(server, [3.0], extra="Expect: 100-continue\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    with _connect(server) as sock:
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        status, _, answer = _read_response(sock, bytearray())
        assert status == b"HTTP/1.1 200 OK" and _outputs(answer) == [3.0]


def test_head_and_body_sent_apart(server: ServerProcess) -> None:
    """A small body that comes after its head (as libcurl sends it), or in pieces, is answered once it is all
    there, on a connection that stays open; a client that leaves before its body ends costs nothing else."""
    with _connect(server) as sock:
        buffer = bytearray()
        for i, cut in enumerate(("head", "middle")):
            request = _infer_request(server, [float(i), 7.0])
            at = request.index(b"\r\n\r\n") + 4 if cut == "head" else len(request) - 5
            sock.sendall(request[:at])
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):  # nothing is answered before the body is complete
                sock.recv(1)
            sock.settimeout(30)
            sock.sendall(request[at:])
            status, _, body = _read_response(sock, buffer)
            assert status == b"HTTP/1.1 200 OK" and _outputs(body) == [float(i), 7.0]
    with _connect(server) as sock:
        sock.sendall(_infer_request(server, [1.0])[:-3])  # and then goes away
    answer = requests.post(f"http://{server.http_url}/v2/models/ident/infer", data=_body([8.0]), timeout=30)
    assert _outputs(answer.content) == [8.0]


def test_head_has_no_body_and_keeps_the_connection(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(f"HEAD /v2/nothing HTTP/1.1\r\nHost: {server.http_url}\r\n\r\n".encode())
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        assert buffer.startswith(b"HTTP/1.1 404 Not Found") and buffer.endswith(b"\r\n\r\n")
        sock.sendall(_infer_request(server, [4.0]))
        assert _outputs(_read_response(sock, bytearray())[2]) == [4.0]


@pytest.mark.parametrize("coding", ["deflate", "gzip"])
def test_response_compression(server: ServerProcess, coding: str) -> None:
    payload = {"inputs": [{"name": "INPUT0", "shape": [64], "datatype": "FP32", "data": [5.0] * 64}]}
    url = f"http://{server.http_url}/v2/models/ident/infer"
    r = requests.post(url, json=payload, headers={"Accept-Encoding": coding}, timeout=30)
    assert r.status_code == 200 and r.headers["Content-Encoding"] == coding
    assert r.json()["outputs"][0]["data"] == [5.0] * 64  # requests inflates it
    raw = requests.post(url, json=payload, headers={"Accept-Encoding": coding}, timeout=30, stream=True).raw.read()
    wbits = 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
    assert json.loads(zlib.decompress(raw, wbits))["outputs"][0]["data"] == [5.0] * 64


def test_oversized_request_head_is_refused(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(
            f"GET /v2/health/ready HTTP/1.1\r\nHost: {server.http_url}\r\nX-Big: {'a' * (70 << 10)}\r\n\r\n".encode()
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 Bad Request") and b"larger than 65536 bytes" in reply
    assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=30).status_code == 200


def test_body_over_the_limit_is_answered_before_it_ends(server: ServerProcess) -> None:
    """A Content-Length body over --http-max-input-size (1 MiB) gets its 400 while the client still has most of it
    to send; the connection then closes."""
    declared = 4 << 20
    head = (
        f"POST /v2/models/ident/infer HTTP/1.1\r\nHost: {server.http_url}\r\nInference-Header-Content-Length: 0\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode()
    with _connect(server) as sock:
        sock.sendall(head + bytes(3 << 19))  # 1.5 MiB of the 4
        status, headers, answer = _read_response(sock, bytearray())
    assert status == b"HTTP/1.1 400 Bad Request" and headers["connection"] == "close"
    error = json.loads(answer)["error"]
    assert f"request JSON size of {declared} bytes exceeds the maximum allowed input size of 1048576 bytes" in error


def test_generate_stream_is_chunked(server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(
            f"POST /v2/models/ident/generate_stream HTTP/1.1\r\nHost: {server.http_url}\r\n"
            'Content-Length: 17\r\n\r\n{"INPUT0": [6.0]}'.encode()
        )
        reply = b""
        while not reply.endswith(b"\r\n0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
    head, _, chunks = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding: chunked" in head
    assert b"text/event-stream; charset=utf-8" in head
    size, _, rest = chunks.partition(b"\r\n")
    event = rest[: int(size, 16)]
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:])["OUTPUT0"] == 6.0
