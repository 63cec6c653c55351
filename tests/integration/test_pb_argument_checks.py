"""pb_utils argument checks as Triton's bindings make them: a wrong type (None included) raises TypeError, a
wrong value TritonModelException, with Triton's messages; run inside a real worker by a real model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, running_server, write_model

CONFIG = """
    name: "argcheck"
    backend: "python"
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# each case runs inside execute(); OUT is {case: [exception type, message]} ("" when nothing was raised)
MODEL_PY = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils

    T = [pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))]
    R = dict(model_name="my_model", requested_output_names=["my_output"])
    CASES = {
        "request inputs=[None]": lambda: pb_utils.InferenceRequest(inputs=[None], **R),
        "request inputs=None": lambda: pb_utils.InferenceRequest(inputs=None, **R),
        "request model_name=None": lambda: pb_utils.InferenceRequest(
            inputs=T, model_name=None, requested_output_names=["o"]),
        "request output names [None]": lambda: pb_utils.InferenceRequest(
            inputs=T, model_name="m", requested_output_names=[None]),
        "request output names ['']": lambda: pb_utils.InferenceRequest(
            inputs=T, model_name="m", requested_output_names=[""]),
        "request output names None": lambda: pb_utils.InferenceRequest(
            inputs=T, model_name="m", requested_output_names=None),
        "request correlation_id=None": lambda: pb_utils.InferenceRequest(inputs=T, correlation_id=None, **R),
        "request correlation_id=1.5": lambda: pb_utils.InferenceRequest(inputs=T, correlation_id=1.5, **R),
        "request request_id=None": lambda: pb_utils.InferenceRequest(inputs=T, request_id=None, **R),
        "request model_version=None": lambda: pb_utils.InferenceRequest(inputs=T, model_version=None, **R),
        "request flags=None": lambda: pb_utils.InferenceRequest(inputs=T, flags=None, **R),
        "request empty lists": lambda: pb_utils.InferenceRequest(
            inputs=[], model_name="m", requested_output_names=[]),
        "request string id": lambda: pb_utils.InferenceRequest(inputs=T, correlation_id="seq-5", **R),
        "response [None]": lambda: pb_utils.InferenceResponse(output_tensors=[None]),
        "response None": lambda: pb_utils.InferenceResponse(output_tensors=None),
        "response []": lambda: pb_utils.InferenceResponse(output_tensors=[]),
        "response tensors": lambda: pb_utils.InferenceResponse(T),
        "tensor None name": lambda: pb_utils.Tensor(None, np.asarray([1])),
        "tensor None array": lambda: pb_utils.Tensor("OUTPUT0", None),
        "tensor '' None": lambda: pb_utils.Tensor("", None),
        "from_dlpack None": lambda: pb_utils.Tensor.from_dlpack("OUTPUT0", None),
        "from_dlpack '' None": lambda: pb_utils.Tensor.from_dlpack("", None),
        "log level None": lambda: pb_utils.Logger.log("Invalid Level", None),
        "log level 1": lambda: pb_utils.Logger.log("Invalid Level", 1),
        "log_info None": lambda: pb_utils.Logger.log_info(None),
        "log_warn None": lambda: pb_utils.Logger.log_warn(None),
        "log_error None": lambda: pb_utils.Logger.log_error(None),
        "log_verbose None": lambda: pb_utils.Logger.log_verbose(None),
        "log unspecified level": lambda: pb_utils.Logger.log("Level unspecified"),
        "log enum level": lambda: pb_utils.Logger.log("warned", pb_utils.Logger.LogLevel.WARNING),
    }


    def run(case):
        try:
            CASES[case]()
        except Exception as e:
            return [type(e).__name__, str(e)]
        return ["", ""]


    class TritonPythonModel:
        def execute(self, requests):
            seen = {case: run(case) for case in CASES}
            out = pb_utils.Tensor("OUT", np.array([json.dumps(seen)], dtype=np.object_))
            return [pb_utils.InferenceResponse([out]) for _ in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("argcheck")
    write_model(tmp / "repo", "argcheck", CONFIG, MODEL_PY)
    with running_server([tmp / "repo"], tmp / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def seen(server: ServerProcess) -> dict[str, list[str]]:
    with grpcclient.InferenceServerClient(server.url) as client:
        x = grpcclient.InferInput("IN", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        out = client.infer("argcheck", [x]).as_numpy("OUT")
    assert out is not None
    return dict(json.loads(out[0]))


TYPE_ERRORS = [
    "request inputs=None",
    "request model_name=None",
    "request output names [None]",
    "request output names None",
    "request correlation_id=None",
    "request request_id=None",
    "request model_version=None",
    "request flags=None",
    "response None",
    "tensor None name",
    "tensor None array",
    "tensor '' None",
    "log level None",
    "log level 1",
    "log_info None",
    "log_warn None",
    "log_error None",
    "log_verbose None",
]


@pytest.mark.parametrize("case", TYPE_ERRORS)
def test_a_wrong_argument_type_is_a_type_error(seen: dict[str, list[str]], case: str) -> None:
    kind, message = seen[case]
    assert kind == "TypeError", (case, kind, message)
    assert "incompatible" in message and "Invoked with:" in message


MODEL_EXCEPTIONS = {
    "request inputs=[None]": "Input tensor for request with id '' and model name 'my_model' should not be empty.",
    "request output names ['']": "Requested output name for request with id '' and model name 'm' should not be empty.",
    "request correlation_id=1.5": "Correlation ID must be integer or string",
    "response [None]": "Output tensor for inference response should not be empty.",
    "from_dlpack None": "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
    "`__dlpack_device__` attributes",
    "from_dlpack '' None": "Tensor name cannot be an empty string.",
}


@pytest.mark.parametrize("case", sorted(MODEL_EXCEPTIONS))
def test_a_wrong_value_is_a_model_exception(seen: dict[str, list[str]], case: str) -> None:
    assert seen[case] == ["TritonModelException", MODEL_EXCEPTIONS[case]]


@pytest.mark.parametrize(
    "case",
    [
        "request empty lists",
        "request string id",
        "response []",
        "response tensors",
        "log unspecified level",
        "log enum level",
    ],
)
def test_valid_arguments_raise_nothing(seen: dict[str, list[str]], case: str) -> None:
    assert seen[case] == ["", ""]


def test_the_model_logged_through_the_server(server: ServerProcess, seen: dict[str, list[str]]) -> None:
    log = Path(server.log_path).read_text(errors="replace")
    assert "Level unspecified" in log and "warned" in log
