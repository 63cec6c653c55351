"""HTTP input checks and limits of the Triton version Trireme reports (2.73; issue 32 items 7 and 11): raw binary
bodies, shape overflow and negative dims, the JSON nesting limit, the chunk cap, decompression bombs, reserved
forwarded headers and the JSON output-size guard. Every refusal keeps the server serving."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.conftest import ServerProcess, running_server, write_model

ECHO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if t.dtype != np.object_ and t.size == 1 and t.dtype.kind in "iu" and int(t.flat[0]) > 1000:
                t = np.zeros(int(t.flat[0]), np.float32)  # INT32 [1] above 1000: that many zeros back
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t)]))
        return out
"""


def _config(name: str, dtype: str, dims: str, out_dtype: str = "", out_dims: str = "") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f'input [ {{ name: "INPUT0" data_type: {dtype} dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: {out_dtype or dtype} dims: {out_dims or dims} }} ]\n'
    )


THREE_INPUTS = """name: "zero_3_fp32"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "INPUT2" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("http_hardening")
    write_model(repo, "zero_fp32", _config("zero_fp32", "TYPE_FP32", "[ -1 ]"), ECHO_PY)
    write_model(repo, "zero_bytes", _config("zero_bytes", "TYPE_STRING", "[ -1 ]"), ECHO_PY)
    write_model(repo, "zero_bytes_1", _config("zero_bytes_1", "TYPE_STRING", "[ 1 ]"), ECHO_PY)
    write_model(repo, "zero_fp16", _config("zero_fp16", "TYPE_FP16", "[ -1, -1 ]"), ECHO_PY)
    write_model(repo, "zero_3_fp32", THREE_INPUTS, ECHO_PY)
    write_model(repo, "big_out", _config("big_out", "TYPE_INT32", "[ 1 ]", "TYPE_FP32", "[ -1 ]"), ECHO_PY)
    args = ["--http-header-forward-pattern", "^(x-|sequence_id|priority|triton_)", "--http-max-input-size", "1048576"]
    with running_server([repo], tmp_path_factory.mktemp("http_hardening_log") / "server.log", args) as s:
        yield s


def url(server: ServerProcess, model: str) -> str:
    return f"http://{server.http_url}/v2/models/{model}/infer"


RAW = {"Inference-Header-Content-Length": "0"}


def _still_serves(server: ServerProcess) -> None:
    body = np.arange(8, dtype=np.float32).tobytes()
    r = requests.post(url(server, "zero_fp32"), data=body, headers=RAW, timeout=30)
    assert r.status_code == 200, r.text
    assert r.content[int(r.headers["Inference-Header-Content-Length"]) :] == body


def _error(r: requests.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    return str(r.json()["error"])


# ---- raw binary bodies (Triton 2.73 L0_http messages) -----------------------------------------------------------
def test_raw_binary_and_bytes_of_shape_one(server: ServerProcess) -> None:
    _still_serves(server)
    r = requests.post(url(server, "zero_bytes_1"), data=b"427", headers=RAW, timeout=30)
    assert r.status_code == 200, r.text
    assert r.content[int(r.headers["Inference-Header-Content-Length"]) + 4 :] == b"427"


def test_raw_bytes_needs_input_shape_one(server: ServerProcess) -> None:
    r = requests.post(url(server, "zero_bytes"), data=b"427", headers=RAW, timeout=30)
    assert _error(r, 400) == "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"


def test_raw_shape_with_two_variable_dims(server: ServerProcess) -> None:
    r = requests.post(url(server, "zero_fp16"), data=np.ones([2, 2], np.float16).tobytes(), headers=RAW, timeout=30)
    assert _error(r, 400) == (
        "The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized "
        "dimension"
    )


def test_raw_request_for_three_inputs(server: ServerProcess) -> None:
    r = requests.post(url(server, "zero_3_fp32"), data=np.arange(24, dtype=np.float32).tobytes(), headers=RAW)
    assert "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in" in _error(r, 400)


def test_chunked_raw_body_is_decoded(server: ServerProcess) -> None:
    body = np.arange(8, dtype=np.float32).tobytes()
    r = requests.post(url(server, "zero_fp32"), data=iter([body[:10], body[10:]]), headers=RAW, timeout=30)
    assert r.status_code == 200, r.text
    assert r.content[int(r.headers["Inference-Header-Content-Length"]) :] == body


# ---- shapes ---------------------------------------------------------------------------------------------------
def _json_infer(shape: list[int]) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]}


def test_shape_overflow(server: ServerProcess) -> None:
    r = requests.post(url(server, "zero_fp32"), json=_json_infer([2**4, 2**60 + 2]), timeout=30)
    assert "causes total element count to exceed maximum size of" in _error(r, 400)
    r = requests.post(url(server, "zero_fp32"), json=_json_infer([2**2, 2**60 + 2]), timeout=30)
    assert "byte size overflow for input" in _error(r, 400)
    _still_serves(server)


def test_negative_dimension(server: ServerProcess) -> None:
    r = requests.post(url(server, "zero_fp32"), json=_json_infer([2, -5]), timeout=30)
    assert "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer" in _error(r, 500)


# ---- JSON nesting ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("depth", "ok"), [(50, True), (120, False), (100_000, False)])
def test_json_nesting_depth_limit(server: ServerProcess, depth: int, ok: bool) -> None:
    data = "[" * depth + '"hello"' + "]" * depth
    body = '{"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ' + data + "}]}"
    r = requests.post(url(server, "zero_bytes"), data=body, headers={"Content-Type": "application/json"}, timeout=30)
    if ok:
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == ["hello"]
    else:
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in _error(r, 400)
    brackets_in_a_string = '{"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ["' + "[" * 500
    r = requests.post(url(server, "zero_bytes"), data=brackets_in_a_string + '"]}]}', timeout=30)
    assert r.status_code == 200, r.text  # brackets inside a string do not nest


def test_repository_json_nesting_limit(server: ServerProcess) -> None:
    body = '{"parameters": {"config": ' + "[" * 200 + "]" * 200 + "}}"
    r = requests.post(f"http://{server.http_url}/v2/repository/models/zero_fp32/load", data=body, timeout=30)
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in _error(r, 400)


# ---- chunks and compression -----------------------------------------------------------------------------------
def _send_raw(server: ServerProcess, head: bytes, body_parts: Iterator[bytes]) -> bytes:
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        out = b""  # the server closes the connection after its reply (Connection: close)
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_chunk_flood_is_refused(server: ServerProcess) -> None:
    """70,000 one-byte chunks (more than Triton's cap of 65536) are refused; the server keeps serving."""
    head = (
        f"POST /v2/models/zero_fp32/infer HTTP/1.1\r\nHost: {server.http_url}\r\nTransfer-Encoding: chunked\r\n"
        "Inference-Header-Content-Length: 0\r\nConnection: close\r\n\r\n"
    ).encode()
    flood = (b"1\r\n\x00\r\n" * 1000 for _ in range(70))
    reply = _send_raw(server, head, iter([*flood, b"0\r\n\r\n"]))
    status, _, rest = reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 400"), reply[:300]
    assert b"HTTP request body has more than 65536 chunks" in rest
    _still_serves(server)


def test_decompression_bomb_is_refused(server: ServerProcess) -> None:
    """8 KiB of gzip that would inflate to 64 MiB: refused past --http-max-input-size (1 MiB here)."""
    bomb = gzip.compress(b"\x00" * (64 << 20), compresslevel=9)
    assert len(bomb) < 100_000
    headers = {**RAW, "Content-Encoding": "gzip"}
    r = requests.post(url(server, "zero_fp32"), data=bomb, headers=headers, timeout=60)
    assert "Decompressed data size exceeds the maximum allowed value of 1048576 bytes" in _error(r, 400)
    small = gzip.compress(np.arange(8, dtype=np.float32).tobytes())
    assert requests.post(url(server, "zero_fp32"), data=small, headers=headers, timeout=30).status_code == 200
    _still_serves(server)


def test_both_content_length_and_chunked_is_refused_clearly(server: ServerProcess) -> None:
    head = (
        f"POST /v2/models/zero_fp32/infer HTTP/1.1\r\nHost: {server.http_url}\r\nContent-Length: 32\r\n"
        "Transfer-Encoding: chunked\r\nInference-Header-Content-Length: 0\r\nConnection: close\r\n\r\n"
    ).encode()
    reply = _send_raw(server, head, iter([b"20\r\n" + bytes(32) + b"\r\n0\r\n\r\n"]))
    assert reply.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), reply[:300]
    assert b"Transfer-Encoding can't be present with Content-Length" in reply
    _still_serves(server)
    line = [x for x in server.log().splitlines() if "refused a malformed HTTP request" in x]
    assert line and "Transfer-Encoding can't be present with Content-Length" in line[-1]


# ---- reserved parameters and forwarded headers ----------------------------------------------------------------
@pytest.mark.parametrize("header", ["sequence_id", "priority", "triton_enable_empty_final_response"])
def test_forwarded_header_may_not_set_a_reserved_parameter(server: ServerProcess, header: str) -> None:
    body = np.arange(8, dtype=np.float32).tobytes()
    r = requests.post(url(server, "zero_fp32"), data=body, headers={**RAW, header: "7"}, timeout=30)
    message = (
        f"HTTP header '{header}' matches --http-header-forward-pattern but \"{header}\" is a reserved parameter and "
        "cannot be specified."
    )
    assert _error(r, 400).lower() == message.lower()  # the HTTP parser may give a known header its usual case
    ok = requests.post(url(server, "zero_fp32"), data=body, headers={**RAW, "x-tenant": "a"}, timeout=30)
    assert ok.status_code == 200


def test_reserved_prefix_in_request_parameters(server: ServerProcess) -> None:
    payload = {**_json_infer([1]), "parameters": {"triton_anything": 1}}
    r = requests.post(url(server, "zero_fp32"), json=payload, timeout=30)
    assert "parameter keys starting with 'triton_' are reserved" in _error(r, 400)


# ---- output-size guard ----------------------------------------------------------------------------------------
def test_large_output_is_refused_as_json_but_sent_as_binary(server: ServerProcess) -> None:
    count = (64 << 20) // 4 + 1  # one element more than 64 MiB of FP32
    payload = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [count]}]}
    r = requests.post(url(server, "big_out"), json=payload, timeout=120)
    assert _error(r, 400) == (
        f"output 'OUTPUT0' holds {count * 4} bytes, more than the {64 << 20} that can be returned as JSON; request "
        "it as binary data (output parameter 'binary_data': true)"
    )
    payload["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    r = requests.post(url(server, "big_out"), json=payload, timeout=120)
    assert r.status_code == 200
    header = json.loads(r.content[: int(r.headers["Inference-Header-Content-Length"])])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == count * 4
    _still_serves(server)


def test_server_log_has_no_traceback(server: ServerProcess, tmp_path: Path) -> None:
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("ready", ['"yes"', "1", "[" * 150 + "]" * 150])
def test_repository_index_ready_must_be_a_boolean(server: ServerProcess, ready: str) -> None:
    """Triton 2.73 parses the whole (small) body, then checks 'ready': its message comes before any depth limit."""
    r = requests.post(f"http://{server.http_url}/v2/repository/index", data='{"ready": ' + ready + "}", timeout=30)
    assert _error(r, 400) == "Invalid value for 'ready': expected a boolean"
    deep = '{"ready": ' + "[" * 2000 + "]" * 2000 + "}"  # past what any parser takes: the depth limit answers
    r = requests.post(f"http://{server.http_url}/v2/repository/index", data=deep, timeout=30)
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in _error(r, 400)
    r = requests.post(f"http://{server.http_url}/v2/repository/index", data='{"ready": true}', timeout=30)
    assert r.status_code == 200 and all(row["state"] == "READY" for row in r.json())


def test_bytes_output_that_is_not_utf8_is_never_altered(server: ServerProcess) -> None:
    """A BYTES output that is not UTF-8 asked for as JSON is an error that says how to get it (Triton writes the
    raw bytes into JSON that no client parses; U+FFFD would be wrong data); as binary data it comes back intact."""
    import tritonclient.http as httpclient

    values = np.array([b"\xff\xfe raw", b"text"], dtype=np.object_)
    with httpclient.InferenceServerClient(server.http_url) as client:
        inp = httpclient.InferInput("INPUT0", [2], "BYTES")
        inp.set_data_from_numpy(values, binary_data=True)
        as_json = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        with pytest.raises(httpclient.InferenceServerException) as e:
            client.infer("zero_bytes", [inp], outputs=as_json)
        assert str(e.value.status()) == "400"
        assert e.value.message() == (
            "output 'OUTPUT0' holds BYTES that are not valid UTF-8 (at byte 0 of an element) and cannot be returned "
            "as JSON; request it as binary data (output parameter 'binary_data': true)"
        )
        as_binary = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        assert client.infer("zero_bytes", [inp], outputs=as_binary).as_numpy("OUTPUT0").tolist() == values.tolist()
    _still_serves(server)
