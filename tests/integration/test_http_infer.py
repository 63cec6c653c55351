"""Inference over HTTP/REST against a real server: tritonclient.http (sync and aio), plain `requests` JSON bodies
(the tutorial shapes), the binary tensor extension both ways, raw binary requests, BYTES, compression,
classification, request parameters, sequences, the input size limit and the generate extension."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
import subprocess
import sys
import time
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, running_server
from tests.integration.http_models import build_repo

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("http")
    repo = build_repo(tmp / "repo")
    if HAS_TORCH:  # the seed tutorial's TorchScript model, generated as the README says
        tool = [sys.executable, str(ROOT / "tools" / "make_example_models.py"), "--repository", str(repo)]
        subprocess.run(tool, check=True, capture_output=True)
    with running_server([repo], tmp / "server.log", ["--http-max-input-size", str(1 << 20)]) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def server_repo(server: ServerProcess) -> Path:
    return server.log_path.parent / "repo"


def url(server: ServerProcess, path: str) -> str:
    return f"http://{server.http_url}{path}"


def add_sub_inputs(binary: bool = True) -> list[httpclient.InferInput]:
    a = httpclient.InferInput("INPUT0", [4], "FP32")
    a.set_data_from_numpy(np.arange(4, dtype=np.float32), binary_data=binary)
    b = httpclient.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.full(4, 0.5, np.float32), binary_data=binary)
    return [a, b]


# ---- tutorial shapes with plain requests --------------------------------------------------------------------
def test_requests_json_linear_model_3x3(server: ServerProcess) -> None:
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    body = {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32", "data": x.tolist()}]}
    r = requests.post(url(server, "/v2/models/linear/versions/1/infer"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    out = r.json()
    assert out["model_name"] == "linear" and out["model_version"] == "1"
    assert out["outputs"][0]["name"] == "OUTPUT0" and out["outputs"][0]["shape"] == [3, 3]
    np.testing.assert_array_equal(np.array(out["outputs"][0]["data"], np.float32).reshape(3, 3), 2 * x + 1)
    # the same data flat, with an id that comes back
    body["inputs"][0]["data"] = x.ravel().tolist()
    body["id"] = "req-7"
    out = requests.post(url(server, "/v2/models/linear/infer"), json=body, timeout=30).json()
    assert out["id"] == "req-7"
    assert out["outputs"][0]["data"] == (2 * x + 1).ravel().tolist()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed: fc_model_pt cannot be generated")
def test_requests_json_fc_model_pt(server: ServerProcess) -> None:
    import torch

    tokens = [[3, 14, 15, 92, 65]]
    body = {"inputs": [{"name": "input__0", "shape": [1, 5], "datatype": "INT64", "data": tokens}]}
    r = requests.post(url(server, "/v2/models/fc_model_pt/versions/1/infer"), json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; Triton's pytorch_libtorch is TorchScript
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(server_repo(server) / "fc_model_pt" / "1" / "model.pt"))
    with torch.no_grad():
        expected0, expected1 = module(torch.tensor(tokens))
    assert outputs["output__0"]["shape"] == [1, 5, 4] and outputs["output__1"]["shape"] == [1, 5, 8]
    np.testing.assert_allclose(np.array(outputs["output__0"]["data"]), expected0.numpy().ravel(), rtol=1e-5)
    np.testing.assert_allclose(np.array(outputs["output__1"]["data"]), expected1.numpy().ravel(), rtol=1e-5)


# ---- tritonclient.http ----------------------------------------------------------------------------------------
def test_tritonclient_sync_binary_and_json(client: httpclient.InferenceServerClient) -> None:
    for binary in (True, False):
        result = client.infer("add_sub", add_sub_inputs(binary))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) + 0.5)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.arange(4, dtype=np.float32) - 0.5)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = client.infer("add_sub", add_sub_inputs(), outputs=outputs)
    response = result.get_response()
    by_name = {o["name"]: o for o in response["outputs"]}
    assert by_name["OUTPUT0"]["parameters"] == {"binary_data_size": 16} and "data" not in by_name["OUTPUT0"]
    assert by_name["OUTPUT1"]["data"] == [-0.5, 0.5, 1.5, 2.5]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) + 0.5)


def test_tritonclient_aio(server: ServerProcess) -> None:
    async def run() -> list[np.ndarray]:
        c = aiohttpclient.InferenceServerClient(server.http_url)
        try:
            assert await c.is_server_ready() and await c.is_model_ready("add_sub")
            results = await asyncio.gather(*(c.infer("add_sub", add_sub_inputs()) for _ in range(8)))
            return [r.as_numpy("OUTPUT0") for r in results]
        finally:
            await c.close()

    for out in asyncio.run(run()):
        np.testing.assert_array_equal(out, np.arange(4, dtype=np.float32) + 0.5)


def test_bytes_binary_and_json(client: httpclient.InferenceServerClient, server: ServerProcess) -> None:
    data = np.array([[b"hello", b"", "wörld".encode()]], dtype=object)
    for binary in (True, False):
        t = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
        t.set_data_from_numpy(data, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        result = client.infer("identity_bytes", [t], outputs=[out])
        got = [[v if isinstance(v, bytes) else v.encode() for v in row] for row in result.as_numpy("OUTPUT0")]
        assert got == data.tolist()  # (tritonclient hands JSON BYTES back as str)
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", "data": [["a", "bc"]]}]}
    out = requests.post(url(server, "/v2/models/identity_bytes/infer"), json=body, timeout=30).json()
    assert out["outputs"][0]["data"] == ["a", "bc"]


def test_one_mib_binary_both_ways(client: httpclient.InferenceServerClient) -> None:
    x = np.random.default_rng(0).random(1 << 17, dtype=np.float32)[None, :]  # 512 KiB under the 1 MiB limit
    t = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    result = client.infer("identity_fp32_any", [t], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_raw_binary_request_header_zero(server: ServerProcess) -> None:
    x = np.arange(6, dtype=np.float32)
    r = requests.post(
        url(server, "/v2/models/identity_fp32_any/infer"),
        data=x.tobytes(),
        headers={"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/octet-stream"
    length = int(r.headers["Inference-Header-Content-Length"])
    header = json.loads(r.content[:length])
    assert header["outputs"][0]["shape"] == [1, 6]
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(np.frombuffer(r.content[length:], np.float32), x)
    # a model with two inputs cannot take a raw request
    r = requests.post(
        url(server, "/v2/models/add_sub/infer"), data=x.tobytes(), headers={"Inference-Header-Content-Length": "0"}
    )
    assert r.status_code == 400 and "1 input" in r.json()["error"]


def test_compression_request_and_response(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    for algorithm in ("gzip", "deflate"):
        result = client.infer(
            "add_sub",
            add_sub_inputs(),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) + 0.5)
    x = np.ones((3, 3), np.float32)
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32", "data": x.tolist()}]})
    r = requests.post(
        url(server, "/v2/models/linear/infer"),
        data=gzip.compress(body.encode()),
        headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 200 and r.headers["Content-Encoding"] == "gzip"
    assert r.json()["outputs"][0]["data"] == [3.0] * 9  # requests decompressed it
    r = requests.post(
        url(server, "/v2/models/linear/infer"),
        data=zlib.compress(body.encode()),
        headers={"Content-Encoding": "deflate", "Accept-Encoding": "identity"},
        timeout=30,
    )
    assert r.status_code == 200 and "Content-Encoding" not in r.headers
    r = requests.post(
        url(server, "/v2/models/linear/infer"), data=body, headers={"Content-Encoding": "br-unknown"}, timeout=30
    )
    assert r.status_code == 501 and r.json() == {"error": "Unsupported compression type"}


def test_classification(client: httpclient.InferenceServerClient) -> None:
    out = httpclient.InferRequestedOutput("OUTPUT0", class_count=2)
    result = client.infer("add_sub", add_sub_inputs(), outputs=[out])
    assert result.as_numpy("OUTPUT0").tolist() == [b"3.500000:3", b"2.500000:2"]


def test_request_parameters_reach_the_model(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    t = httpclient.InferInput("INPUT0", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32))
    result = client.infer("params", [t], parameters={"flavour": "mint", "size": 3, "hot": False, "ratio": 0.5})
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"flavour": "mint", "size": 3, "hot": False, "ratio": 0.5}
    assert result.get_response()["parameters"] == {"echoed": True}
    body = {
        "parameters": {"triton_anything": True},
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [0]}],
    }
    r = requests.post(url(server, "/v2/models/params/infer"), json=body, timeout=30)
    assert r.status_code == 400 and "reserved for Triton usage" in r.json()["error"]


def test_sequence_parameters(client: httpclient.InferenceServerClient) -> None:
    def step(value: int, seq: int | str, start: bool = False, end: bool = False) -> int:
        t = httpclient.InferInput("INPUT0", [1], "INT32")
        t.set_data_from_numpy(np.array([value], np.int32))
        r = client.infer("counter", [t], sequence_id=seq, sequence_start=start, sequence_end=end)
        return int(r.as_numpy("OUTPUT0")[0])

    assert step(5, 42, start=True) == 5
    assert step(2, 42) == 7
    assert step(1, 42, end=True) == 8
    assert step(4, "seq-a", start=True, end=True) == 4
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(1, 77)


def test_max_input_size(server: ServerProcess) -> None:
    big = np.zeros(300_000, np.float32)  # JSON body well above the 1 MiB limit of this server
    body = {"inputs": [{"name": "INPUT0", "shape": [1, big.size], "datatype": "FP32", "data": big.tolist()}]}
    r = requests.post(url(server, "/v2/models/identity_fp32_any/infer"), json=body, timeout=30)
    assert r.status_code == 400
    size = len(json.dumps(body))  # requests sends json= compactly, as json.dumps does
    assert r.json()["error"] == (
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of 1048576 bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    # a gzip body that is small on the wire but large once decompressed is refused too
    r = requests.post(
        url(server, "/v2/models/identity_fp32_any/infer"),
        data=gzip.compress(json.dumps(body).encode()),
        headers={"Content-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"].startswith(
        "Decompressed data size exceeds the maximum allowed value of 1048576 bytes."
    )


# ---- decoupled models and the generate extension ---------------------------------------------------------------
def test_infer_on_decoupled_model_is_501(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a b"]}]}
    r = requests.post(url(server, "/v2/models/words/infer"), json=body, timeout=30)
    assert r.status_code == 501
    assert r.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}


def sse_events(response: requests.Response) -> list[dict[str, Any]]:
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            events.append(json.loads(line[len(b"data: ") :]))
    return events


def test_generate_stream_decoupled(server: ServerProcess) -> None:
    with requests.post(
        url(server, "/v2/models/words/generate_stream"), json={"text_input": "one two three"}, stream=True, timeout=30
    ) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        events = sse_events(r)
    assert [e["text_output"] for e in events] == ["ONE", "TWO", "THREE"]
    assert all(e["model_name"] == "words" and e["model_version"] == "1" for e in events)
    # an error response travels in-band and the stream goes on
    with requests.post(
        url(server, "/v2/models/words/generate_stream"), json={"text_input": "a fail b"}, stream=True, timeout=30
    ) as r:
        events = sse_events(r)
    assert events == [
        {"model_name": "words", "model_version": "1", "text_output": "A"},
        {"error": "the model failed"},
        {"model_name": "words", "model_version": "1", "text_output": "B"},
    ]


def test_generate_single_response(server: ServerProcess) -> None:
    r = requests.post(url(server, "/v2/models/words/generate"), json={"text_input": "solo"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"model_name": "words", "model_version": "1", "text_output": "SOLO"}
    r = requests.post(url(server, "/v2/models/words/generate"), json={"text_input": "two words"}, timeout=30)
    assert r.status_code == 500 and "exactly 1 response" in r.json()["error"]
    # a non-decoupled model through generate, with a request parameter beside the input
    body = {"INPUT0": [1.0, 2.0], "parameters": {"colour": "red"}}
    r = requests.post(url(server, "/v2/models/params/generate"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["PARAMS"]) == {"colour": "red"} and r.json()["echoed"] is True


def test_generate_stream_client_disconnect_cancels_the_request(server: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    with requests.post(
        url(server, "/v2/models/ticker/generate_stream"), json={"MARKER": str(marker)}, stream=True, timeout=30
    ) as r:
        ticks: list[int] = []
        for line in r.iter_lines():
            if line:
                ticks.append(json.loads(line[len(b"data: ") :])["TICK"])
            if len(ticks) == 3:
                break
    assert ticks == [0, 1, 2]
    deadline = time.monotonic() + 15
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the model never saw the request cancelled"
    assert 3 <= int(marker.read_text()) < 900  # it stopped early, soon after the client left
