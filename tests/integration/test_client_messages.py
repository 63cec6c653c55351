"""Error messages clients match on, worded as Triton words them: missing inputs (with and without optional
inputs), a tensor named twice in one request, and a CUDA region registered with an unusable handle."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server, write_model

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [
      {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "INPUT2" data_type: TYPE_INT32 dims: [ 1 ] }}{extra}
    ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
OPTIONAL = """,
      { name: "INPUT3" data_type: TYPE_INT32 dims: [ 1 ] optional: true }"""

MODEL_PY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
                )
                for r in requests
            ]
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpcclient.InferenceServerClient]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "m", CONFIG.format(name="m", extra=""), MODEL_PY)
    write_model(repo, "m_opt", CONFIG.format(name="m_opt", extra=OPTIONAL), MODEL_PY)
    server: ServerProcess
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as server:
        c = grpcclient.InferenceServerClient(server.url)
        yield c
        c.close()


def inp(name: str, value: int = 1) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, [1], "INT32")
    t.set_data_from_numpy(np.array([value], np.int32))
    return t


def error_of(call: object) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()  # type: ignore[operator]
    return str(e.value)


def test_missing_required_inputs(client: grpcclient.InferenceServerClient) -> None:
    assert error_of(lambda: client.infer("m", [inp("INPUT0")])) == (
        "[StatusCode.INVALID_ARGUMENT] [request id: <id_unknown>] expected 3 inputs but got 1 inputs for model 'm'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. "
        "Please provide all required input(s)."
    )


def test_missing_required_inputs_with_optional_inputs(client: grpcclient.InferenceServerClient) -> None:
    message = error_of(lambda: client.infer("m_opt", [inp("INPUT0"), inp("INPUT3")], request_id="r7"))
    assert message == (
        "[StatusCode.INVALID_ARGUMENT] [request id: r7] expected number of inputs between 3 and 4 but got 2 inputs "
        "for model 'm_opt'. Got input(s) ['INPUT0','INPUT3'], but missing required input(s) ['INPUT1','INPUT2']. "
        "Please provide all required input(s)."
    )
    # the optional input may be left out
    result = client.infer("m_opt", [inp("INPUT0", 5), inp("INPUT1"), inp("INPUT2")])
    assert result.as_numpy("OUTPUT0").tolist() == [5]


def test_tensor_named_twice(client: grpcclient.InferenceServerClient) -> None:
    full = [inp("INPUT0"), inp("INPUT1"), inp("INPUT2")]
    twice = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
    assert error_of(lambda: client.infer("m", full, outputs=twice)).endswith(
        "] output 'OUTPUT0' already exists in request"
    )
    assert error_of(lambda: client.infer("m", [*full, inp("INPUT0")])).endswith(
        "] input 'INPUT0' already exists in request"
    )
    assert client.infer("m", full).as_numpy("OUTPUT0").tolist() == [1]  # and the server keeps serving


def test_cuda_register_with_an_invalid_handle(client: grpcclient.InferenceServerClient) -> None:
    # a malformed handle, and one of the right size that no process exported: the same answer with or without GPU
    for handle in (b"dummy_handle", b"\x01" * 64):
        with pytest.raises(InferenceServerException) as e:
            client.register_cuda_shared_memory("cuda_bad", base64.b64encode(handle), 0, 8)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert e.value.message() == "failed to register shared memory region: invalid args"
    assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
