"""A Python model's optional readiness function (Triton 2.73's Python backend: `is_model_ready()`, also accepted
as `is_ready()`) decides model readiness on every probe, over gRPC and HTTP: ready only when it returns True;
False, a non-bool, an exception or no answer within 5 s mean not ready. Inference is not affected, and neither
is server readiness (Triton asks it only for model readiness)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, running_server, write_model

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
{extra}
"""

MODEL_PY = """
import asyncio
import time
import triton_python_backend_utils as pb_utils

ANSWER = {answer!r}

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]

    {define} {name}(self):
        if ANSWER == "raise":
            raise RuntimeError("database is down")
        if ANSWER == "slow":
            time.sleep(7)
            return True
        if ANSWER == "coroutine":
            return {coroutine_body}
        return ANSWER
"""

IN_PROCESS = 'parameters { key: "TRIREME_INSTANCE_MODE" value: { string_value: "in_process" } }'
MODELS = {  # name -> (answer, method, extra config), and whether the model is ready
    "returns_true": ((True, "def", "is_model_ready", ""), True),
    "returns_false": ((False, "def", "is_model_ready", ""), False),
    "raises": (("raise", "def", "is_model_ready", ""), False),
    "non_boolean": (("ready", "def", "is_model_ready", ""), False),
    "coroutine_true": (("coroutine", "async def", "is_model_ready", ""), True),
    "is_ready_false": ((False, "def", "is_ready", ""), False),
    "in_process_false": ((False, "def", "is_model_ready", IN_PROCESS), False),
    "two_instances_false": ((False, "def", "is_model_ready", "instance_group [ { count: 2 } ]"), False),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    models = {**MODELS, "slow": (("slow", "def", "is_model_ready", ""), False)}
    for name, ((answer, define, method, extra), _ready) in models.items():
        body = "await asyncio.sleep(0.01) is None" if define == "async def" else "True"
        py = MODEL_PY.format(answer=answer, define=define, name=method, coroutine_body=body)
        write_model(repo, name, CONFIG.format(name=name, extra=extra), py)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def _infer(client: grpcclient.InferenceServerClient, model: str) -> None:
    x = grpcclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([1, 2], np.float32))
    np.testing.assert_array_equal(client.infer(model, [x]).as_numpy("OUTPUT0"), [1, 2])


@pytest.mark.parametrize("model", list(MODELS))
def test_readiness_function_decides_model_readiness(server: ServerProcess, model: str) -> None:
    expected = MODELS[model][1]
    client = grpcclient.InferenceServerClient(server.url)
    for _ in range(3):  # asked on every probe
        assert client.is_model_ready(model) is expected
        r = requests.get(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10)
        assert r.status_code == (200 if expected else 400)
        if not expected:
            assert r.json() == {"error": "Model version not ready"}
        _infer(client, model)  # inference is not affected
    assert client.is_server_ready()  # nor is server readiness
    client.close()


def test_a_slow_readiness_function_times_out_as_not_ready(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    start = time.monotonic()
    assert client.is_model_ready("slow") is False
    assert 4.5 < time.monotonic() - start < 6.5
    _infer(client, "slow")
    client.close()
    assert "model instance 'slow_0': readiness check did not answer in 5.0 s: not ready" in server.log()


def test_errors_of_the_readiness_function_are_logged(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    assert not client.is_model_ready("raises")
    assert not client.is_model_ready("non_boolean")
    client.close()
    log = server.log()
    assert "model 'raises_0' readiness check raised: RuntimeError: database is down" in log
    assert "model 'non_boolean_0' readiness check returned str, expected a bool: not ready" in log
