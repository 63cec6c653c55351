"""What a Python model's execute() returns, through a real server and worker: a tuple of responses, the wrong
return types, an output the config does not have, an output the client did not ask for, and an error response
(answered to the client, counted as a success in the statistics)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, write_model

CONFIG = """
    name: "returns"
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [
      { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
      { name: "EXTRA" data_type: TYPE_FP32 dims: [ -1 ] }
    ]
"""

# the request parameter "mode" picks what execute() returns
MODEL = """
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            mode = json.loads(requests[0].parameters()).get("mode", "")
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
            if mode == "not_list":
                return {"OUT": x}
            if mode == "not_response":
                return [42]
            if mode == "unknown_output":
                return [pb_utils.InferenceResponse([pb_utils.Tensor("NOPE", x)])]
            if mode == "error":
                error = pb_utils.TritonError("bad input from the model", pb_utils.TritonError.INVALID_ARG)
                return [pb_utils.InferenceResponse(error=error)]
            out = [pb_utils.Tensor("OUT", x + 1), pb_utils.Tensor("EXTRA", x * 0)]
            return tuple(pb_utils.InferenceResponse(out) for _ in requests)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "returns", CONFIG, MODEL)
    proc = ServerProcess([repo], [], tmp_path_factory.mktemp("log") / "server.log")
    proc.wait_ready()
    yield proc
    proc.stop()


def _call(url: str, mode: str = "", outputs: list[str] | None = None) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("IN", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    try:
        return client.infer("returns", [x], outputs=requested, parameters={"mode": mode} if mode else None)
    finally:
        client.close()


def _failure(url: str, mode: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        _call(url, mode)
    return info.value


def test_a_tuple_of_responses_is_accepted_and_every_output_comes_back(server: ServerProcess) -> None:
    result = _call(server.url)
    np.testing.assert_array_equal(result.as_numpy("OUT"), [2, 3, 4])
    np.testing.assert_array_equal(result.as_numpy("EXTRA"), [0, 0, 0])


def test_an_output_not_requested_is_dropped(server: ServerProcess) -> None:
    result = _call(server.url, outputs=["OUT"])
    np.testing.assert_array_equal(result.as_numpy("OUT"), [2, 3, 4])
    assert result.as_numpy("EXTRA") is None
    assert [o.name for o in result.get_response().outputs] == ["OUT"]


def test_wrong_return_types_fail_with_internal(server: ServerProcess) -> None:
    e = _failure(server.url, "not_list")
    assert e.status() == "StatusCode.INTERNAL"
    assert e.message() == (
        "Failed to process the request(s) for model 'returns_0', message: "
        "Expected a list in the execute return, found type '<class 'dict'>'."
    )
    e = _failure(server.url, "not_response")
    assert e.status() == "StatusCode.INTERNAL"
    assert e.message() == (
        "Failed to process the request(s) for model 'returns_0', message: Expected an 'InferenceResponse' object "
        "in the execute function return list, found type '<class 'int'>'."
    )
    np.testing.assert_array_equal(_call(server.url).as_numpy("OUT"), [2, 3, 4])  # the worker goes on serving


def test_an_output_the_config_does_not_have_fails_the_request(server: ServerProcess) -> None:
    e = _failure(server.url, "unknown_output")
    assert e.status() == "StatusCode.INTERNAL"
    assert e.message() == "unexpected inference output 'NOPE' for model 'returns'"


def _success_and_fail_counts(url: str) -> tuple[int, int]:
    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics("returns", as_json=True)["model_stats"][0]["inference_stats"]
    finally:
        client.close()
    return int(stats["success"].get("count", 0)), int(stats["fail"].get("count", 0))


def test_an_error_response_reaches_the_client_and_counts_as_a_success(server: ServerProcess) -> None:
    success, fail = _success_and_fail_counts(server.url)
    e = _failure(server.url, "error")
    assert e.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.message() == "bad input from the model"
    assert _success_and_fail_counts(server.url) == (success + 1, fail)
