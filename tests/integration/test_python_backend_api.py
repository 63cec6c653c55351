"""The TritonPythonModel contract through a real server: initialize args, async execute, request accessors,
TritonError codes, exceptions, Logger, DLPack, and the pb_utils helper functions (run inside the stub)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import write_model

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 4
    input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2 ] }} ]
    output [
      {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }},
      {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }}
    ]
"""

# Everything the model can observe is returned in INFO (a JSON string), so the test checks it from outside.
INTROSPECT = """
    import asyncio
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.args = dict(args)
            self.config = json.loads(args["model_config"])
            pb_utils.Logger.log_info("introspect: initialized")

        async def execute(self, requests):
            await asyncio.sleep(0)  # a real coroutine: Trireme must await it
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN")
                params = json.loads(request.parameters())
                if params.get("fail") == "error":
                    err = pb_utils.TritonError("asked to fail", pb_utils.TritonError.NOT_FOUND)
                    responses.append(pb_utils.InferenceResponse(error=err))
                    continue
                if params.get("fail") == "raise":
                    raise pb_utils.TritonModelException("model exception text")
                doubled = pb_utils.Tensor.from_dlpack("OUT", pb_utils.Tensor("tmp", x.as_numpy() * 2).to_dlpack())
                info = {
                    "args": sorted(self.args),
                    "instance": self.args["model_instance_name"],
                    "kind": self.args["model_instance_kind"],
                    "version": self.args["model_version"],
                    "repository": self.args["model_repository"],
                    "name": self.args["model_name"],
                    "config_name": self.config["name"],
                    "max_batch_size": self.config["max_batch_size"],
                    "id": request.request_id(),
                    "params": params,
                    "requested": request.requested_output_names(),
                    "flags": request.flags(),
                    "corr": request.correlation_id(),
                    "dtype": x.triton_dtype(),
                    "shape": x.shape(),
                    "is_cpu": x.is_cpu(),
                    "np_from_string": str(np.dtype(pb_utils.triton_string_to_numpy("TYPE_FP32"))),
                    "to_numpy_13": str(pb_utils.triton_to_numpy_type(13)),
                    "to_triton": pb_utils.numpy_to_triton_type(np.float32),
                    "in_cfg": pb_utils.get_input_config_by_name(self.config, "IN")["data_type"],
                    "out_cfg": pb_utils.get_output_config_by_name(self.config, "INFO")["data_type"],
                    "decoupled": pb_utils.using_decoupled_model_transaction_policy(self.config),
                    "roundtrip": [
                        b.decode() for b in pb_utils.deserialize_bytes_tensor(
                            pb_utils.serialize_byte_tensor(np.array([b"a", b"", b"xyz"], dtype=np.object_))
                        )
                    ],
                    "model_dir": pb_utils.get_model_dir(),
                }
                batch = x.shape()[0]
                text = np.array([[json.dumps(info).encode()]] * batch, dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([doubled, pb_utils.Tensor("INFO", text)]))
            return responses
"""


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    from tests.conftest import ServerProcess

    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "introspect", CONFIG.format(name="introspect"), INTROSPECT)
    server = ServerProcess([repo], [], tmp_path_factory.mktemp("log") / "server.log")
    server.wait_ready()
    yield server, repo
    server.stop()


def _call(url: str, params: dict | None = None, outputs: list[str] | None = None, request_id: str = "") -> object:
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("IN", [2, 2], "FP32")
    x.set_data_from_numpy(np.array([[1, 2], [3, 4]], np.float32))
    requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    try:
        return client.infer("introspect", [x], outputs=requested, parameters=params, request_id=request_id)
    finally:
        client.close()


def test_initialize_args_and_request_accessors(api_server) -> None:  # type: ignore[no-untyped-def]
    server, repo = api_server
    result = _call(server.url, {"mode": "check", "n": 3}, request_id="abc")
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[2, 4], [6, 8]])
    info = json.loads(result.as_numpy("INFO")[0, 0])
    assert info["args"] == sorted(
        [
            "model_config",
            "model_instance_kind",
            "model_instance_name",
            "model_instance_device_id",
            "model_repository",
            "model_version",
            "model_name",
        ]
    )
    assert info["instance"] == "introspect_0" and info["kind"] == "CPU" and info["version"] == "1"
    assert info["repository"] == str(repo / "introspect") and info["name"] == "introspect"
    assert info["config_name"] == "introspect" and info["max_batch_size"] == 4
    assert info["id"] == "abc" and info["params"] == {"mode": "check", "n": 3}
    assert info["requested"] == ["OUT", "INFO"] and info["flags"] == 0 and info["corr"] == 0
    assert info["dtype"] == 11 and info["shape"] == [2, 2] and info["is_cpu"] is True
    assert info["np_from_string"] == "float32" and info["to_numpy_13"] == "<class 'numpy.object_'>"
    assert info["to_triton"] == 11 and info["in_cfg"] == "TYPE_FP32" and info["out_cfg"] == "TYPE_STRING"
    assert info["decoupled"] is False and info["roundtrip"] == ["a", "", "xyz"]
    assert info["model_dir"] == str(repo / "introspect" / "1")
    assert "introspect: initialized" in server.log()


def test_requested_outputs_only(api_server) -> None:  # type: ignore[no-untyped-def]
    server, _ = api_server
    result = _call(server.url, outputs=["OUT"])
    assert result.as_numpy("INFO") is None
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[2, 4], [6, 8]])


def test_triton_error_code_reaches_client(api_server) -> None:  # type: ignore[no-untyped-def]
    server, _ = api_server
    with pytest.raises(InferenceServerException) as info:
        _call(server.url, {"fail": "error"})
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "asked to fail" in info.value.message()


def test_model_exception_fails_the_batch_with_internal(api_server) -> None:  # type: ignore[no-untyped-def]
    server, _ = api_server
    with pytest.raises(InferenceServerException) as info:
        _call(server.url, {"fail": "raise"})
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "Failed to process the request(s) for model 'introspect_0'" in info.value.message()
    assert "TritonModelException: model exception text" in info.value.message()
    assert _call(server.url).as_numpy("OUT").shape == (2, 2)  # the stub survived


def test_wrong_return_from_execute(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    bad = """
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                return [] if len(requests) else None
    """
    write_model(tmp_path, "introspect", CONFIG.format(name="introspect"), bad)
    server = start_server([tmp_path])
    with pytest.raises(InferenceServerException) as info:
        _call(server.url)
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "Number of InferenceResponse objects do not match the number of InferenceRequest objects" in (
        info.value.message()
    )
