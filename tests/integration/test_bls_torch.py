"""BLS and ensembles with the TorchScript model fc_model_pt (the seed tutorial's custom_model)."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import ROOT, ServerProcess, write_model
from tests.integration.models import python_config

pytestmark = pytest.mark.single_pass

if importlib.util.find_spec("torch") is None or not (ROOT / "service" / "worker" / "backends" / "pytorch.py").exists():
    pytest.skip("needs torch and the pytorch backend (service/worker/backends/pytorch.py)", allow_module_level=True)

# the seed: a fixed output__0 of [1..8], and output__1 of fc_model_pt for input__0, fetched through BLS
CUSTOM_MODEL_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.use_async = args["model_name"].endswith("_async")

    def _request(self, request):
        return pb_utils.InferenceRequest(
            model_name="fc_model_pt",
            requested_output_names=["output__1"],
            inputs=[pb_utils.get_input_tensor_by_name(request, "input__0")],
        )

    def _answer(self, reply):
        if reply.has_error():
            raise pb_utils.TritonModelException(reply.error().message())
        output__1 = pb_utils.get_output_tensor_by_name(reply, "output__1")
        output__0 = pb_utils.Tensor("output__0", np.arange(1, 9, dtype=np.float32))
        return pb_utils.InferenceResponse([output__0, pb_utils.Tensor("output__1", output__1.as_numpy())])

    async def _execute_async(self, requests):
        replies = await asyncio.gather(*(self._request(r).async_exec() for r in requests))
        return [self._answer(reply) for reply in replies]

    def execute(self, requests):
        if self.use_async:
            return asyncio.run(self._execute_async(requests))
        return [self._answer(self._request(r).exec()) for r in requests]
"""

CUSTOM_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "input__0" data_type: TYPE_INT64 dims: [ -1, -1 ] }} ]
output [
  {{ name: "output__0" data_type: TYPE_FP32 dims: [ 8 ] }},
  {{ name: "output__1" data_type: TYPE_FP32 dims: [ -1, -1, 8 ] }}
]
"""

FC_CONFIG = """
name: "fc_model_pt"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "input__0" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [
  { name: "output__0" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "output__1" data_type: TYPE_FP32 dims: [ -1, 8 ] }
]
"""

PRE_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "TOKENS", (pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy() + 1) % 100)]) for r in requests]
"""

POST_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "SCORE", pb_utils.get_input_tensor_by_name(r, "HIDDEN").as_numpy().sum(axis=-1))]) for r in requests]
"""

PRE_CONFIG = python_config("tpre", [("TEXT", "TYPE_INT64", [-1, -1])], [("TOKENS", "TYPE_INT64", [-1, -1])])

POST_CONFIG = python_config("tpost", [("HIDDEN", "TYPE_FP32", [-1, -1, 8])], [("SCORE", "TYPE_FP32", [-1, -1])])

ENSEMBLE_CONFIG = """
name: "tpipeline"
platform: "ensemble"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_INT64 dims: [ -1, -1 ] } ]
output [
  { name: "SCORE" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "DIRECT" data_type: TYPE_FP32 dims: [ -1, -1, 4 ] }
]
ensemble_scheduling { step [
  { model_name: "tpre" model_version: -1 input_map { key: "TEXT" value: "TEXT" }
    output_map { key: "TOKENS" value: "tokens" } },
  { model_name: "fc_model_pt" model_version: -1 input_map { key: "input__0" value: "tokens" }
    output_map { key: "output__1" value: "hidden" } },
  { model_name: "tpost" model_version: -1 input_map { key: "HIDDEN" value: "hidden" }
    output_map { key: "SCORE" value: "SCORE" } },
  { model_name: "fc_model_pt" model_version: -1 input_map { key: "input__0" value: "TEXT" }
    output_map { key: "output__0" value: "DIRECT" } }
] }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from tools.make_example_models import write_fc_model_pt

    tmp = tmp_path_factory.mktemp("blstorch")
    repo = tmp / "repo"
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; Triton's pytorch_libtorch is TorchScript
        warnings.simplefilter("ignore", DeprecationWarning)
        model_dir = write_fc_model_pt(repo)
    # dims without the batch dim, so the ensemble's shape checks see [-1, -1, 8] for output__1
    (model_dir / "config.pbtxt").write_text(FC_CONFIG)
    for name in ("custom_model", "custom_model_async"):
        write_model(repo, name, CUSTOM_CONFIG.format(name=name), CUSTOM_MODEL_PY)
    write_model(repo, "tpre", PRE_CONFIG, PRE_PY)
    write_model(repo, "tpost", POST_CONFIG, POST_PY)
    write_model(repo, "tpipeline", ENSEMBLE_CONFIG)
    srv = ServerProcess([repo], [], tmp / "server.log")
    try:
        srv.wait_ready(120)
        yield srv
    finally:
        srv.stop()


def _infer(url: str, model: str, name: str, x: np.ndarray):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput(name, list(x.shape), "INT64")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp])
    finally:
        client.close()


@pytest.mark.parametrize("model", ["custom_model", "custom_model_async"])
def test_seed_custom_model_matches_direct_request(server: ServerProcess, model: str) -> None:
    x = np.array([[1, 5, 42]], dtype=np.int64)
    through_bls = _infer(server.url, model, "input__0", x)
    direct = _infer(server.url, "fc_model_pt", "input__0", x)
    np.testing.assert_array_equal(through_bls.as_numpy("output__0"), np.arange(1, 9, dtype=np.float32))
    np.testing.assert_array_equal(through_bls.as_numpy("output__1"), direct.as_numpy("output__1"))
    assert through_bls.as_numpy("output__1").shape == (1, 3, 8)


def test_ensemble_python_torch_python_with_parallel_branch(server: ServerProcess) -> None:
    x = np.array([[3, 99, 7]], dtype=np.int64)
    result = _infer(server.url, "tpipeline", "TEXT", x)
    hidden = _infer(server.url, "fc_model_pt", "input__0", (x + 1) % 100).as_numpy("output__1")
    np.testing.assert_allclose(result.as_numpy("SCORE"), hidden.sum(axis=-1), rtol=1e-6)
    direct = _infer(server.url, "fc_model_pt", "input__0", x).as_numpy("output__0")
    np.testing.assert_array_equal(result.as_numpy("DIRECT"), direct)
