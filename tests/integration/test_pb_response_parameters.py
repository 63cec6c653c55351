"""Response parameters set by Python models (`pb_utils.InferenceResponse(parameters=...)`): Triton's type checks
and messages, and valid parameters reaching gRPC responses, streamed decoupled responses and BLS callers."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.models import python_config

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: {decoupled} }}
    input [ {{ name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""

# PARAMS is JSON: the parameters of the one response (default mode), or a list of them (decoupled). A
# parameters value the backend refuses becomes an INVALID_ARG error response carrying the exception text.
PARAMS_PY = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    def make(params):
        out = pb_utils.Tensor("OUT", np.array([json.dumps(params)], dtype=np.object_))
        try:
            return pb_utils.InferenceResponse([out], parameters=params)
        except Exception as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))


    def decode(text):
        # JSON keys are strings: "int:<n>" keys become int keys to exercise the key check
        return json.loads(text, object_hook=lambda d: {int(k[4:]) if k[:4] == "int:" else k: v for k, v in d.items()})


    class TritonPythonModel:
        def initialize(self, args):
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

        def execute(self, requests):
            responses = []
            for request in requests:
                params = decode(pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy()[0])
                if not self.decoupled:
                    responses.append(make(params))
                    continue
                sender = request.get_response_sender()
                for p in params:
                    sender.send(make(p))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None if self.decoupled else responses
"""

BLS_CONFIG = python_config("params_bls", [("PARAMS", "TYPE_STRING", [1])], [("OUT", "TYPE_STRING", [1])])

# Calls both models through BLS and reports the parameters() of every response it got, as JSON.
BLS_PY = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                text = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy()[0]
                one = json.loads(text)
                many = json.dumps([one, {"second": 2}]).encode()
                seen = {}
                r = pb_utils.InferenceRequest(
                    model_name="params_default",
                    inputs=[pb_utils.Tensor("PARAMS", np.array([text], dtype=np.object_))],
                    requested_output_names=["OUT"],
                ).exec()
                seen["default"] = json.loads(r.parameters())
                stream = pb_utils.InferenceRequest(
                    model_name="params_decoupled",
                    inputs=[pb_utils.Tensor("PARAMS", np.array([many], dtype=np.object_))],
                    requested_output_names=["OUT"],
                ).exec(decoupled=True)
                seen["decoupled"] = [json.loads(x.parameters()) for x in stream if x.output_tensors()]
                out = pb_utils.Tensor("OUT", np.array([json.dumps(seen)], dtype=np.object_))
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "params_default", CONFIG.format(name="params_default", decoupled="false"), PARAMS_PY)
    write_model(repo, "params_decoupled", CONFIG.format(name="params_decoupled", decoupled="true"), PARAMS_PY)
    write_model(repo, "params_bls", BLS_CONFIG, BLS_PY)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def params_input(params: Any) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("PARAMS", [1], "BYTES")
    t.set_data_from_numpy(np.array([json.dumps(params)], dtype=np.object_))
    return [t]


def response_params(result: grpcclient.InferResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.get_response().parameters.items():
        out[key] = getattr(value, value.WhichOneof("parameter_choice"))
    return out


@pytest.mark.parametrize(
    "params",
    [{}, {"many_elements": False}, {"bool": True, "str": "Hello World!", "int": 1024}, {"a": "1", "c": 3, "f": ""}],
)
def test_valid_parameters_reach_the_grpc_response(client: grpcclient.InferenceServerClient, params: Any) -> None:
    result = client.infer("params_default", params_input(params))
    assert response_params(result) == params
    assert result.as_numpy("OUT")[0].decode() == json.dumps(params)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([], ", got <class 'list'>"),
        ({"int:1": "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ({"int": 2, "float": 0.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        ({"bool": True, "null": None}, "values to have type bool/int/str, found type <class 'NoneType'>"),
        ({"str": "", "list": ["v"]}, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
        ({"nested": {"a": 1}}, "Expect parameters values to have type bool/int/str, found type <class 'dict'>"),
    ],
)
def test_invalid_parameters_are_refused_with_tritons_message(
    client: grpcclient.InferenceServerClient, params: Any, message: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.infer("params_default", params_input(params))
    assert "[StatusCode.INVALID_ARGUMENT]" in str(e.value)
    assert message in str(e.value)
    assert client.infer("params_default", params_input({"k": 1})).get_response().parameters["k"].int64_param == 1


def test_decoupled_responses_carry_their_parameters(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    events: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    sent = [[{"bool": False, "int": 2048}, {"str": "Hello World!"}], [{"n": 1}], [{"int:1": "x"}, {"after": True}]]
    for i, params in enumerate(sent):
        client.async_stream_infer("params_decoupled", params_input(params), request_id=str(i))
    got: dict[str, list[Any]] = {}
    for _ in range(5):
        result, error = events.get(timeout=20)
        if error is not None:
            got.setdefault("error", []).append(str(error))
            continue
        got.setdefault(result.get_response().id, []).append(response_params(result))
    client.stop_stream()
    client.close()
    assert got["0"] == [{**p, "triton_final_response": False} for p in sent[0]]
    assert got["1"] == [{"n": 1, "triton_final_response": False}]
    assert got["2"] == [{"after": True, "triton_final_response": False}]
    assert got["error"] == ["Expect parameters keys to have type str, found type <class 'int'>"]


def test_bls_responses_carry_their_parameters(client: grpcclient.InferenceServerClient) -> None:
    params = {"bool": False, "int": 2048, "str": "Hello World!"}
    result = client.infer("params_bls", params_input(params))
    seen = json.loads(result.as_numpy("OUT")[0])
    assert seen == {"default": params, "decoupled": [params, {"second": 2}]}


def test_parameters_reach_http_responses(server: ServerProcess) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        params = {"bool": True, "str": "Hello World!", "int": 1024}
        t = httpclient.InferInput("PARAMS", [1], "BYTES")
        t.set_data_from_numpy(np.array([json.dumps(params)], dtype=np.object_))
        result = client.infer("params_default", [t])
        assert result.get_response()["parameters"] == params
        assert result.as_numpy("OUT")[0].decode() == json.dumps(params)
    finally:
        client.close()
