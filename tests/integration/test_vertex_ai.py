"""Vertex AI's endpoint (--allow-vertex-ai=true and the AIP_* environment) through a real server and `requests`:
health and predict routes, the default model, the X-Vertex-Ai-Triton-Redirect header and what it may reach."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.conftest import ServerProcess, free_port
from tests.integration.models import elementwise_py, write_python_model

MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = "X-Vertex-Ai-Triton-Redirect"


def _body(values: list[float]) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_python_model(repo, "double", elementwise_py("x * 2"))
    write_python_model(repo, "triple", elementwise_py("x * 3"))
    return repo


@pytest.fixture
def vertex_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/v1/endpoints/e1/deployedModels/m1:predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/v1/endpoints/e1/deployedModels/m1")


def test_predict_health_and_redirect(repo: Path, vertex_env: None, start_server: Callable[..., ServerProcess]) -> None:
    port = free_port()
    server = start_server(
        [repo], ["--allow-vertex-ai=true", f"--vertex-ai-port={port}", "--vertex-ai-default-model=double"]
    )
    assert f"Started Vertex AI HTTPService at 127.0.0.1:{port}" in server.log()
    base = f"http://127.0.0.1:{port}"
    health, predict = f"{base}/v1/endpoints/e1/deployedModels/m1", f"{base}/v1/endpoints/e1/deployedModels/m1:predict"

    assert requests.get(health).status_code == 200
    assert requests.post(health).status_code == 405
    r = requests.post(predict, json=_body([1.0, 2.0]))
    assert r.status_code == 200 and r.json()["model_name"] == "double"
    assert r.json()["outputs"][0]["data"] == [2.0, 4.0]
    # binary input announced in the Content-Type
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    data = header + np.array([5, 6], dtype=np.float32).tobytes()
    r = requests.post(predict, data=data, headers={"Content-Type": f"{MIME}{len(header)}"})
    assert r.status_code == 200, r.text
    size = int(r.headers["Inference-Header-Content-Length"])
    assert list(struct.unpack("<2f", r.content[size:])) == [10.0, 12.0]

    # redirects: the method becomes the one the route expects
    r = requests.post(predict, json=_body([1.0]), headers={REDIRECT: "v2/models/triple/infer"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [3.0]
    r = requests.post(predict, headers={REDIRECT: "v2/models/triple/config"})
    assert r.status_code == 200 and r.json()["name"] == "triple"
    r = requests.post(predict, headers={REDIRECT: "v2/models/triple"})
    assert r.status_code == 200 and r.json()["name"] == "triple" and r.json()["inputs"][0]["name"] == "INPUT0"
    assert requests.post(predict, headers={REDIRECT: "v2/models/triple/ready"}).status_code == 200
    assert requests.post(predict, headers={REDIRECT: "v2/health/live"}).status_code == 200
    assert requests.post(predict, headers={REDIRECT: "v2"}).json()["name"] == "triton"
    r = requests.post(predict, headers={REDIRECT: "v2/models/stats"})
    assert {s["name"] for s in r.json()["model_stats"]} == {"double", "triple"}
    r = requests.post(predict, headers={REDIRECT: "metrics"})
    assert r.status_code == 200 and "nv_inference_request_success" in r.text
    assert requests.post(predict, headers={REDIRECT: "v2/repository/index"}).status_code == 200
    assert requests.post(predict, headers={REDIRECT: "v2/systemsharedmemory/status"}).status_code == 200
    # mutating routes are refused; unknown ones are 400; the redirect needs POST
    assert requests.post(predict, headers={REDIRECT: "v2/repository/models/double/unload"}).status_code == 403
    assert requests.post(predict, headers={REDIRECT: "v2/systemsharedmemory/region/r/unregister"}).status_code == 403
    assert requests.post(predict, headers={REDIRECT: "v2/logging"}).status_code == 400
    assert requests.get(predict, headers={REDIRECT: "v2"}).status_code == 405
    # bad input
    r = requests.post(predict, headers={REDIRECT: "v2/models/nothing/config"})
    assert r.status_code == 404 and "nothing" in r.json()["error"]
    r = requests.post(predict, json={"inputs": [{"name": "WRONG", "datatype": "FP32", "shape": [1], "data": [1]}]})
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(predict, data=data, headers={"Content-Type": f"{MIME}x"})
    assert r.status_code == 400 and r.json()["error"] == "Unable to parse inference header size, got: x"
    r = requests.get(f"{base}/v2/health/ready")
    assert r.status_code == 400 and r.content == b""
    # still serving, and the model was not unloaded
    assert requests.post(predict, json=_body([7.0])).json()["outputs"][0]["data"] == [14.0]


def test_default_model_checks(repo: Path, vertex_env: None, start_server: Callable[..., ServerProcess]) -> None:
    # two models and no --vertex-ai-default-model: Triton refuses to start
    server = start_server([repo], ["--allow-vertex-ai=true", f"--vertex-ai-port={free_port()}"], wait=False)
    server.proc.wait(60)
    assert server.proc.returncode != 0
    assert "Expect the model repository contains only a single model if default model is not specified" in server.log()
    server = start_server(
        [repo], ["--allow-vertex-ai=true", f"--vertex-ai-port={free_port()}", "--vertex-ai-default-model=x"], wait=False
    )
    server.proc.wait(60)
    assert "Expect the default model 'x' is loaded" in server.log()


def test_missing_routes_refused(repo: Path, start_server: Callable[..., ServerProcess]) -> None:
    server = start_server([repo], ["--allow-vertex-ai=true", f"--vertex-ai-port={free_port()}"], wait=False)
    server.proc.wait(60)
    assert server.proc.returncode != 0
    assert "API_PREDICT_ROUTE is not defined for Vertex AI endpoint" in server.log()


def test_vertex_container_environment(
    tmp_path: Path, vertex_env: None, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AIP_MODE=PREDICTION: Vertex AI on at AIP_HTTP_PORT, HTTP off, AIP_STORAGE_URI the repository."""
    repo = tmp_path / "storage"
    write_python_model(repo, "only", elementwise_py("x + 1"))
    port = free_port()
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", str(port))
    monkeypatch.setenv("AIP_STORAGE_URI", str(repo))
    server = ServerProcess([], [], tmp_path / "server.log")
    try:
        server.wait_ready()
        r = requests.post(f"http://127.0.0.1:{port}/v1/endpoints/e1/deployedModels/m1:predict", json=_body([1.0]))
        assert r.status_code == 200 and r.json()["model_name"] == "only"
        assert r.json()["outputs"][0]["data"] == [2.0]
        assert "Started HTTPService" not in server.log()
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{server.http_url}/v2/health/ready", timeout=5)
    finally:
        server.stop()
