"""--model-namespacing=true: a model name in two repositories, each repository's ensemble using its own model, a
request by the shared name refused with Triton's ambiguity error, load/unload by name acting on both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import write_model

ADD_CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [1] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [1] }}]
instance_group [{{ count: 1, kind: KIND_CPU }}]
"""

ADD_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + {add})]))
        return out
"""

ENSEMBLE = """
name: "{name}"
platform: "ensemble"
input [{{ name: "X", data_type: TYPE_FP32, dims: [1] }}]
output [{{ name: "Y", data_type: TYPE_FP32, dims: [1] }}]
ensemble_scheduling {{
  step [{{ model_name: "m", model_version: -1, input_map {{ key: "IN", value: "X" }},
          output_map {{ key: "OUT", value: "Y" }} }}]
}}
"""


def _repos(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "repo_a", tmp_path / "repo_b"
    write_model(a, "m", ADD_CONFIG.format(name="m"), ADD_MODEL.format(add=1))
    write_model(b, "m", ADD_CONFIG.format(name="m"), ADD_MODEL.format(add=100))
    write_model(a, "ens_a", ENSEMBLE.format(name="ens_a"))
    write_model(b, "ens_b", ENSEMBLE.format(name="ens_b"))
    write_model(a, "only_a", ADD_CONFIG.format(name="only_a"), ADD_MODEL.format(add=7))
    for ens in (a / "ens_a", b / "ens_b"):
        (ens / "1").mkdir(exist_ok=True)
    return a, b


def _infer(client: grpcclient.InferenceServerClient, model: str, name: str = "IN", out: str = "OUT") -> float:
    x = grpcclient.InferInput(name, [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return float(client.infer(model, [x]).as_numpy(out)[0])


def test_namespaces_and_ensembles(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    a, b = _repos(tmp_path)
    server = start_server([a, b], ["--model-namespacing=true"])
    client = grpcclient.InferenceServerClient(server.url)
    assert _infer(client, "ens_a", "X", "Y") == 2.0  # repo_a's ensemble runs repo_a's m
    assert _infer(client, "ens_b", "X", "Y") == 101.0  # repo_b's ensemble runs repo_b's m
    assert _infer(client, "only_a") == 8.0  # a name in one repository serves as usual
    message = (
        "There are 2 identifiers of model 'm' in global map, model namespace must be provided to resolve ambiguity."
    )
    with pytest.raises(InferenceServerException) as info:
        _infer(client, "m")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and message in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("m")
    assert message in info.value.message()
    rows = [(m.name, m.state) for m in client.get_model_repository_index().models if m.name == "m"]
    assert rows == [("m", "READY"), ("m", "READY")]
    client.close()


def test_explicit_load_and_unload_by_shared_name(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    a, b = _repos(tmp_path)
    server = start_server([a, b], ["--model-namespacing=true", "--model-control-mode=explicit"])
    client = grpcclient.InferenceServerClient(server.url)
    client.load_model("m")  # both models named m
    assert [m.state for m in client.get_model_repository_index().models if m.name == "m"] == ["READY", "READY"]
    client.load_model("ens_b")
    assert _infer(client, "ens_b", "X", "Y") == 101.0
    client.unload_model("m")
    assert [m.state for m in client.get_model_repository_index().models if m.name == "m"] == ["UNAVAILABLE"] * 2
    client.close()


def test_without_namespacing_a_shared_name_is_refused(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    a, b = _repos(tmp_path)
    server = start_server([a, b], wait=False)
    assert server.proc.wait(60) != 0
    assert "model 'm' appears in two repositories" in server.log()
