"""SageMaker's endpoint (--allow-sagemaker=true) through a real server and `requests`: /ping, /invocations (infer,
binary MIME type, generate, generate_stream), the multi-model endpoint, Triton's status codes for bad input."""

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

MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="

# x * 2; a negative first element fails the request with an out-of-memory message, zero with a plain one
FAILING_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] < 0:
                error = pb_utils.TritonError("CUDA out of memory while running")
                responses.append(pb_utils.InferenceResponse(error=error))
            elif x[0] == 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("zero is not allowed")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""


def _infer_body(values: list[float]) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]}


@pytest.fixture
def sagemaker(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[ServerProcess, str]]:
    """start(env=..., args=...) -> (server, base URL of its SageMaker endpoint) on a one-model repository."""
    repo = tmp_path / "repo"
    write_python_model(repo, "doubler", FAILING_PY)
    monkeypatch.setenv("TRIREME_SAGEMAKER_MODELS_ROOT", str(tmp_path / "opt_ml_models"))

    def start(env: dict[str, str] | None = None, args: list[str] | None = None) -> tuple[ServerProcess, str]:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        port = free_port()
        flags = ["--allow-sagemaker=true", f"--sagemaker-port={port}", "--model-control-mode=explicit"]
        server = start_server([repo], [*flags, "--load-model=doubler", *(args or [])])
        assert f"Started Sagemaker HTTPService at 127.0.0.1:{port}" in server.log()
        return server, f"http://127.0.0.1:{port}"

    return start


def test_ping_invocations_and_bad_input(sagemaker: Callable[..., tuple[ServerProcess, str]]) -> None:
    _, url = sagemaker()
    assert requests.get(f"{url}/ping").status_code == 200
    assert requests.post(f"{url}/ping").status_code == 405
    # the only model is the default model
    r = requests.post(f"{url}/invocations", json=_infer_body([1.0, 2.5]))
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json"
    assert r.json()["outputs"][0]["data"] == [2.0, 5.0]
    assert r.json()["model_name"] == "doubler"

    # binary tensors announced in the Content-Type, both ways
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.array([1, 2, 3], dtype=np.float32).tobytes()
    r = requests.post(f"{url}/invocations", data=body, headers={"Content-Type": f"{MIME}{len(header)}"})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith(MIME)
    size = int(r.headers["Content-Type"][len(MIME) :])
    assert json.loads(r.content[:size])["outputs"][0]["name"] == "OUTPUT0"
    assert list(struct.unpack("<3f", r.content[size:])) == [2.0, 4.0, 6.0]

    # bad input: Triton's codes and messages
    r = requests.post(f"{url}/invocations", data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 500  # Triton's HTTP code for a body that is not JSON
    assert r.json()["error"].startswith("failed to parse the request JSON buffer")
    r = requests.post(f"{url}/invocations", data=body, headers={"Content-Type": f"{MIME}abc"})
    assert r.status_code == 400
    assert r.json()["error"] == "Unable to parse inference header size, got: abc"
    r = requests.post(f"{url}/invocations", data=body, headers={"Content-Type": f"x;{MIME}5"})
    assert r.status_code == 400 and "expect MIME type for binary data starts with" in r.json()["error"]
    r = requests.post(f"{url}/invocations", data=body, headers={"Content-Type": f"{MIME}99999"})
    assert r.status_code == 400 and r.json()["error"].startswith("inference header size should be in range (0, ")
    assert requests.get(f"{url}/invocations").status_code == 405
    r = requests.get(f"{url}/nowhere")
    assert r.status_code == 400 and r.content == b""
    # a failed execution: 400, or 507 when the message says out of memory
    r = requests.post(f"{url}/invocations", json=_infer_body([0.0]))
    assert r.status_code == 400 and "zero is not allowed" in r.json()["error"]
    r = requests.post(f"{url}/invocations", json=_infer_body([-1.0]))
    assert r.status_code == 507 and "CUDA out of memory" in r.json()["error"]
    # still serving
    assert requests.post(f"{url}/invocations", json=_infer_body([4.0])).json()["outputs"][0]["data"] == [8.0]
    assert requests.get(f"{url}/ping").status_code == 200


def test_default_model_from_environment(sagemaker: Callable[..., tuple[ServerProcess, str]]) -> None:
    _, url = sagemaker(env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "absent", "SAGEMAKER_TRITON_PING_MODE": "live"})
    r = requests.post(f"{url}/invocations", json=_infer_body([1.0]))
    assert r.status_code == 404
    assert "absent" in r.json()["error"]
    assert requests.get(f"{url}/ping").status_code == 200


def test_generate_variants(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    write_python_model(repo, "plus_one", elementwise_py("x + 1"))
    for kind in ("generate", "generate_stream"):
        port = free_port()
        monkeypatch.setenv("SAGEMAKER_TRITON_INFERENCE_TYPE", kind)
        server = start_server([repo], ["--allow-sagemaker=true", f"--sagemaker-port={port}"])
        r = requests.post(f"http://127.0.0.1:{port}/invocations", json={"INPUT0": [1.0, 2.0]})
        assert r.status_code == 200, r.text
        if kind == "generate":
            assert r.json()["OUTPUT0"] == [2.0, 3.0]
        else:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[0]["OUTPUT0"] == [2.0, 3.0]
        server.stop()


def test_invalid_inference_type_refused(
    start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAGEMAKER_TRITON_INFERENCE_TYPE", "classify")
    server = start_server(args=["--allow-sagemaker=true", f"--sagemaker-port={free_port()}"], wait=False)
    server.proc.wait(60)
    assert server.proc.returncode != 0
    assert "Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'classify'" in server.log()


def test_safe_port_range(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(
        args=["--allow-sagemaker=true", f"--sagemaker-port={free_port()}", "--sagemaker-safe-port-range=1-2"],
        wait=False,
    )
    server.proc.wait(60)
    assert server.proc.returncode != 0
    assert "The server cannot listen to GRPC requests at port" in server.log()
    assert "allowed port range is [1, 2]" in server.log()


def test_multi_model_endpoint(tmp_path: Path, sagemaker: Callable[..., tuple[ServerProcess, str]]) -> None:
    root = tmp_path / "opt_ml_models"
    # archive 1: config.pbtxt at the url; archive 2: a folder with one model inside
    write_python_model(root / "hash1", "model", elementwise_py("x + 100"))
    (root / "hash1" / "model" / "config.pbtxt").write_text(
        (root / "hash1" / "model" / "config.pbtxt").read_text().replace('name: "model"', 'name: "mme_one"')
    )
    write_python_model(root / "hash2" / "model", "mme_two", elementwise_py("x * 10"))
    _, url = sagemaker()

    r = requests.post(
        f"{url}/models",
        json={"model_name": "hash1", "url": str(root / "hash1" / "model")},
        headers={"X-Amzn-SageMaker-Target-Model": "mme_one"},
    )
    assert r.status_code == 200, r.text
    r = requests.post(
        f"{url}/models",
        json={"model_name": "hash1", "url": str(root / "hash1" / "model")},
        headers={"X-Amzn-SageMaker-Target-Model": "mme_one"},
    )
    assert r.status_code == 409 and "error" in r.json()
    r = requests.post(f"{url}/models", json={"model_name": "mme_two", "url": str(root / "hash2" / "model")})
    assert r.status_code == 200, r.text

    listed = requests.get(f"{url}/models").json()["models"]
    assert sorted(listed, key=lambda m: m["modelName"]) == [
        {"modelName": "hash1", "modelUrl": str(root / "hash1")},
        {"modelName": "mme_two", "modelUrl": str(root / "hash2" / "model")},
    ]
    assert requests.get(f"{url}/models/hash1").json() == {"modelName": "hash1", "modelUrl": str(root / "hash1")}
    assert requests.get(f"{url}/models/nothing").status_code == 404

    r = requests.post(
        f"{url}/models/hash1/invoke", json=_infer_body([1.0]), headers={"X-Amzn-SageMaker-Target-Model": "mme_one"}
    )
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [101.0]
    r = requests.post(f"{url}/models/mme_two/invoke", json=_infer_body([3.0]))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [30.0]
    assert requests.post(f"{url}/models/nothing/invoke", json=_infer_body([1.0])).status_code == 404
    r = requests.post(f"{url}/models/mme_two/invoke", json={"inputs": "wrong"})
    assert r.status_code == 400 and "error" in r.json()

    # bad loads
    r = requests.post(f"{url}/models", json={"model_name": "x", "url": "/somewhere/else"})
    assert r.status_code == 400 and "expected a path of the form" in r.json()["error"]
    assert requests.post(f"{url}/models", json={"model_name": "x", "url": "/proc/self"}).status_code == 400
    assert requests.post(f"{url}/models", data=b"[1, 2").status_code == 400
    write_python_model(root / "hash3" / "model", "broken", "this is not python")
    r = requests.post(f"{url}/models", json={"model_name": "broken", "url": str(root / "hash3" / "model")})
    assert r.status_code == 400 and "broken" in r.json()["error"]
    assert requests.get(f"{url}/models/broken").status_code == 404

    assert requests.delete(f"{url}/models/hash1").status_code == 200
    assert requests.delete(f"{url}/models/hash1").status_code == 404
    assert requests.post(f"{url}/models/hash1/invoke", json=_infer_body([1.0])).status_code == 404
    assert [m["modelName"] for m in requests.get(f"{url}/models").json()["models"]] == ["mme_two"]
    # the same archive loads again once unloaded
    r = requests.post(
        f"{url}/models",
        json={"model_name": "hash1", "url": str(root / "hash1" / "model")},
        headers={"X-Amzn-SageMaker-Target-Model": "mme_one"},
    )
    assert r.status_code == 200, r.text
    assert requests.get(f"{url}/ping").status_code == 200
