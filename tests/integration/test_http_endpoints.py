"""Every non-inference HTTP/REST endpoint against a real server (explicit model control, a restricted API group):
health, metadata, config, statistics, repository index/load/unload, system/CUDA shared memory (with an inference
through shm), logging, trace; every error status with Triton's `{"error": ...}` body."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server
from tests.integration.http_models import build_repo

ADMIN = {"admin-key": "s3cret"}  # --http-restricted-api=model-repository:admin-key=s3cret


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("http")
    args = [
        "--model-control-mode=explicit",
        "--load-model=*",
        "--http-restricted-api=model-repository:admin-key=s3cret",
    ]
    with running_server([build_repo(tmp / "repo")], tmp / "server.log", args) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def get(server: ServerProcess, path: str, **kw: Any) -> requests.Response:
    return requests.get(f"http://{server.http_url}{path}", timeout=30, **kw)


def post(server: ServerProcess, path: str, **kw: Any) -> requests.Response:
    return requests.post(f"http://{server.http_url}{path}", timeout=60, **kw)


def test_banner_lists_both_endpoints(server: ServerProcess) -> None:
    log = server.log()
    assert f"Started GRPCInferenceService at 127.0.0.1:{server.port}" in log
    assert f"Started HTTPService at 127.0.0.1:{server.http_port}" in log


def test_health_and_server_metadata(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        r = get(server, path)
        assert r.status_code == 200 and r.content == b""
    assert client.is_server_live() and client.is_server_ready()
    meta = get(server, "/v2").json()
    assert meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"]
    assert client.get_server_metadata()["extensions"] == meta["extensions"]


def test_model_metadata_ready_and_config(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("identity_bytes")
    assert meta == {
        "name": "identity_bytes",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [-1, -1]}],
    }
    assert get(server, "/v2/models/identity_bytes/versions/1").json() == meta
    assert get(server, "/v2/models/linear/versions/1/ready").status_code == 200
    assert client.is_model_ready("linear", "1") and not client.is_model_ready("linear", "7")
    config = client.get_model_config("identity_fp32_any")
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [-1]
    assert config["input"][0]["data_type"] == "TYPE_FP32" and config["instance_group"][0]["kind"] == "KIND_CPU"
    assert get(server, "/v2/models/words/config").json()["model_transaction_policy"] == {"decoupled": True}


def test_statistics_json_has_every_key(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("linear")["model_stats"][0]["inference_stats"]["success"]["count"]
    body = {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32", "data": [0] * 9}]}
    for _ in range(3):
        assert post(server, "/v2/models/linear/infer", json=body).status_code == 200
    stats = get(server, "/v2/models/linear/versions/1/stats").json()["model_stats"][0]
    assert stats["name"] == "linear" and stats["version"] == "1"
    assert stats["inference_stats"]["success"]["count"] == before + 3
    for key in (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ):
        assert set(stats["inference_stats"][key]) == {"count", "ns"}
    assert isinstance(stats["inference_count"], int) and isinstance(stats["execution_count"], int)
    everything = get(server, "/v2/models/stats").json()["model_stats"]
    assert {s["name"] for s in everything} >= {"linear", "add_sub", "words"}


def test_repository_index_load_unload(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    # the model-repository group is restricted: no header, no access
    r = post(server, "/v2/repository/index")
    assert r.status_code == 403 and "admin-key" in r.json()["error"]
    index = post(server, "/v2/repository/index", headers=ADMIN).json()
    assert {"name": "linear", "version": "1", "state": "READY"} in index
    client.unload_model("linear", headers=ADMIN)
    assert {
        "name": "linear",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    } in client.get_model_repository_index(headers=ADMIN)
    assert not client.is_model_ready("linear")
    r = get(server, "/v2/models/linear/ready")
    assert r.status_code == 400 and r.json() == {"error": "Model version not ready"}
    body = {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32", "data": [0] * 9}]}
    r = post(server, "/v2/models/linear/infer", json=body)
    assert r.status_code == 404 and "has no available versions" in r.json()["error"]  # NOT_FOUND, as Triton
    assert {"name": "linear", "version": "1", "state": "READY"} not in post(
        server, "/v2/repository/index", headers=ADMIN, json={"ready": True}
    ).json()
    # reload with a config override: a max_batch_size the metadata then shows
    config = client.get_model_config("identity_fp32_any")
    config["max_batch_size"] = 4
    client.load_model("identity_fp32_any", headers=ADMIN, config=json.dumps(config))
    assert client.get_model_config("identity_fp32_any")["max_batch_size"] == 4
    client.load_model("linear", headers=ADMIN)
    assert client.is_model_ready("linear")
    assert post(server, "/v2/models/linear/infer", json=body).json()["outputs"][0]["data"] == [1.0] * 9
    r = post(server, "/v2/repository/models/no_such_model/load", headers=ADMIN)
    assert r.status_code == 500 and "no_such_model" in r.json()["error"]  # INTERNAL, as Triton (and gRPC)
    r = post(server, "/v2/repository/models/linear/load", headers=ADMIN, json={"parameters": {"bogus": 1}})
    assert r.status_code == 400 and r.json()["error"] == "unrecognized load parameter 'bogus'."
    r = post(server, "/v2/repository/myrepo/index", headers=ADMIN)
    assert r.status_code == 501 and r.json() == {"error": "'repository_name' specification is not supported"}


def test_system_shared_memory_over_http(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    x = np.arange(4, dtype=np.float32)
    y = np.full(4, 2, np.float32)
    key = f"/http_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("http_io", key, 64)
    try:
        shm.set_shared_memory_region(handle, [x, y])
        client.register_system_shared_memory("http_io", key, 64)
        assert client.get_system_shared_memory_status() == [
            {"name": "http_io", "key": key, "offset": 0, "byte_size": 64}
        ]
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_shared_memory("http_io", 16, offset=0)
        inputs[1].set_shared_memory("http_io", 16, offset=16)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("http_io", 16, offset=32)
        outputs[1].set_shared_memory("http_io", 16, offset=48)
        result = client.infer("add_sub", inputs, outputs=outputs)
        out = {o["name"]: o for o in result.get_response()["outputs"]}
        assert out["OUTPUT0"] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [4]}  # no data: it is in shm
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [4], offset=32), x + y)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [4], offset=48), x - y)
        # errors: a duplicate name, an unknown region in a request, an unknown status name
        r = post(server, "/v2/systemsharedmemory/region/http_io/register", json={"key": key, "byte_size": 64})
        assert r.status_code == 400 and "already in manager" in r.json()["error"]
        r = post(server, "/v2/systemsharedmemory/region/x/register", json={"key": key})
        assert r.status_code == 400 and "'byte_size'" in r.json()["error"]
        r = get(server, "/v2/systemsharedmemory/region/nope/status")
        assert r.status_code == 404 and "nope" in r.json()["error"]
        inputs[0].set_shared_memory("nope", 16)
        with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'nope'"):
            client.infer("add_sub", inputs)
        client.unregister_system_shared_memory("http_io")
        assert client.get_system_shared_memory_status() == []
        assert post(server, "/v2/systemsharedmemory/region/never_there/unregister").status_code == 200
    finally:
        shm.destroy_shared_memory_region(handle)


def test_cuda_shared_memory_endpoints_without_a_region(server: ServerProcess) -> None:
    assert get(server, "/v2/cudasharedmemory/status").json() == []
    assert post(server, "/v2/cudasharedmemory/unregister").status_code == 200
    r = post(server, "/v2/cudasharedmemory/region/c/register", json={"raw_handle": {"b64": "AAAA"}, "byte_size": 8})
    assert r.status_code == 400
    assert r.json() == {"error": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"}


def test_logging_and_trace_settings(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    settings = client.get_log_settings()
    assert set(settings) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    assert client.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert client.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0
    r = post(server, "/v2/logging", json={"log_format": "fancy"})
    assert r.status_code == 400 and "log_format" in r.json()["error"]
    for path in ("/v2/trace/setting", "/v2/models/linear/trace/setting"):
        r = get(server, path)
        assert r.status_code == 200 and r.json()["trace_level"] == ["OFF"] and r.json()["trace_rate"] == "1000"
    r = post(server, "/v2/trace/setting", json={"trace_rate": 5})
    assert r.status_code == 400 and "trace_rate" in r.json()["error"]
    r = get(server, "/v2/models/unknown/trace/setting")
    assert r.status_code == 400 and "unknown model" in r.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("GET", "/v2/nowhere", None, 404, "Not Found"),
        ("GET", "/v2/models/linear/versions/x1", None, 404, "Not Found"),
        ("POST", "/v2/health/ready", None, 405, "Method Not Allowed"),
        ("GET", "/v2/models/linear/infer", None, 405, "Method Not Allowed"),
        ("GET", "/v2/models/unknown", None, 404, "Request for unknown model: 'unknown' is not found"),
        ("GET", "/v2/models/unknown/ready", None, 404, "Request for unknown model: 'unknown' is not found"),
        ("POST", "/v2/models/linear/infer", b"{not json", 500, "failed to parse the request JSON buffer"),
        ("POST", "/v2/models/linear/infer", {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32",
                                                         "data": [1, 2]}]}, 500, "Shape does not match"),
        ("POST", "/v2/models/linear/infer", {"inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": "FP32",
                                                         "data": [0] * 6}]}, 400, "unexpected shape for input"),
        ("POST", "/v2/models/linear/infer", {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32"}]},
         400, "Input must set only one of the following fields"),
        ("POST", "/v2/models/linear/infer", {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP16",
                                                         "data": [0] * 9}]}, 400, "FP16 data via JSON"),
        ("POST", "/v2/models/unknown/infer", {"inputs": []}, 404, "Request for unknown model"),
        ("POST", "/v2/repository/models/linear/unload", None, 403, "This API is restricted"),
    ],
)  # fmt: skip
def test_error_statuses(server: ServerProcess, method: str, path: str, body: Any, status: int, error: str) -> None:
    kw = {"data": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    r = requests.request(method, f"http://{server.http_url}{path}", timeout=30, **kw)
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/json"
    assert error in r.json()["error"]
    assert get(server, "/v2/health/live").status_code == 200  # still serving


def test_binary_header_errors(server: ServerProcess) -> None:
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32", "parameters": {"binary_data_size": 36}}]}
    ).encode()
    url = "/v2/models/linear/infer"
    data = np.ones(9, np.float32).tobytes()
    r = post(server, url, data=header + data, headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [3.0] * 9
    r = post(server, url, data=header + data[:20], headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "expecting 16 additional bytes" in r.json()["error"]
    r = post(server, url, data=header + data + b"xx", headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "unexpected additional input data" in r.json()["error"]
    r = post(server, url, data=header + data, headers={"Inference-Header-Content-Length": "99999"})
    assert r.status_code == 400 and "Inference-Header-Content-Length" in r.json()["error"]
    r = post(server, url, data=header)
    assert r.status_code == 400 and "Infer-Header-Content-Length" in r.json()["error"]


def test_allow_http_false_and_port_in_use(start_server: Any) -> None:
    off = start_server(args=["--allow-http=false"])
    assert "Started GRPCInferenceService" in off.log() and "HTTPService" not in off.log()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{off.http_url}/v2/health/live", timeout=5)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        clash = start_server(args=["--http-port", str(busy.getsockname()[1])], wait=False)
        assert clash.proc.wait(60) == 1
    assert "failed to start" in clash.log() and "Started GRPCInferenceService" not in clash.log()
