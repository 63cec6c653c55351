"""Invalid input found by probing is refused with Triton's status and message, and the server keeps serving:
batch size 0, typed contents of another datatype, non-ASCII or negative versions, bodies that are not protobuf,
path-traversing model names in load/unload."""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, copy_example, running_server, write_model
from tests.integration import models
from tests.integration.models import python_config

IDENTITY4 = python_config(
    "identity4", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], max_batch_size=8
)
IDENTITY_PY = models.IDENTITY_PY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "identity4", IDENTITY4, IDENTITY_PY)
    copy_example(repo, "identity_fp32")
    log = tmp_path_factory.mktemp("srv") / "server.log"
    with running_server([repo], log, ["--model-control-mode=explicit", "--load-model=*"]) as s:
        yield s


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _error(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _infer_request(shape: list[int], version: str = "", data: bytes | None = None) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="identity4", model_version=version)
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    count = int(np.prod(shape))
    msg.raw_input_contents.append(np.arange(count, dtype=np.float32).tobytes() if data is None else data)
    return msg


def _still_serves(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    x = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    x.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity4", [x]).as_numpy("OUTPUT0"), data)
    client.close()


def test_batch_size_zero_is_refused(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    x = grpcclient.InferInput("INPUT0", [0, 4], "FP32")
    x.set_data_from_numpy(np.zeros((0, 4), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity4", [x])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    expected = "[request id: <id_unknown>] inference request batch-size must be >= 1 for 'identity4'"
    assert info.value.message() == expected
    client.close()
    _still_serves(server)


def test_typed_contents_of_another_datatype_are_refused(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    msg = pb.ModelInferRequest(model_name="identity4")
    t = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    t.contents.fp64_contents.extend([1.0, 2.0, 3.0, 4.0])  # FP64 values for an FP32 input
    err = _error(lambda: stub.ModelInfer(msg))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity4' of type 'FP64', "
        "expected datatype 'FP32'"
    )
    t.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])  # both the right and a wrong field
    err = _error(lambda: stub.ModelInfer(msg))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity4', binary data was already "
        "supplied."
    )
    t.contents.ClearField("fp64_contents")  # only the right one: accepted
    response = stub.ModelInfer(msg)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), [1, 2, 3, 4])


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
        (
            "\uff11",  # full-width digit one
            "failed to get model version from specified version string '\uff11' (details: only the ASCII digits 0-9 "
            "are allowed), version should be an integral value > 0",
        ),
        (
            "\u0661",  # Arabic-Indic digit one
            "failed to get model version from specified version string '\u0661' (details: only the ASCII digits 0-9 "
            "are allowed), version should be an integral value > 0",
        ),
        # beyond int64 (Triton's stoll): 10,000 digits once answered INTERNAL from Python's int() digit limit
        *(
            (
                v,
                f"failed to get model version from specified version string '{v}' (details: stoll), version should "
                "be an integral value > 0",
            )
            for v in ("9223372036854775808", "1" + "0" * 30)
        ),
        (
            "9" * 10_000,
            f"failed to get model version from specified version string '{'9' * 32}...(10000 digits)' (details: "
            "stoll), version should be an integral value > 0",
        ),
    ],
)
def test_versions_are_ascii_digits(stub: pb_grpc.GRPCInferenceServiceStub, version: str, message: str) -> None:
    calls = [
        lambda: stub.ModelInfer(_infer_request([1, 4], version)),
        lambda: stub.ModelReady(pb.ModelReadyRequest(name="identity4", version=version)),
        lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="identity4", version=version)),
        lambda: stub.ModelConfig(pb.ModelConfigRequest(name="identity4", version=version)),
        lambda: stub.ModelStatistics(pb.ModelStatisticsRequest(name="identity4", version=version)),
    ]
    for call in calls:
        err = _error(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert stub.ModelInfer(_infer_request([1, 4], "1")).model_version == "1"


def test_reserved_parameter_prefix_over_grpc(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    msg = _infer_request([1, 4])
    msg.parameters["triton_anything"].bool_param = True
    err = _error(lambda: stub.ModelInfer(msg))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting with "
        "'triton_' are allowed: triton_enable_empty_final_response"
    )


@pytest.mark.parametrize("version", ["1" + "0" * 30, "9" * 4000])
def test_huge_version_over_http_is_400(server: ServerProcess, version: str) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]}]}
    for method, path, payload in (
        ("POST", f"/v2/models/identity4/versions/{version}/infer", body),
        ("GET", f"/v2/models/identity4/versions/{version}", None),
        ("GET", f"/v2/models/identity4/versions/{version}/ready", None),
    ):
        r = requests.request(method, f"http://{server.http_url}{path}", json=payload, timeout=30)
        assert r.status_code == 400, (path[:40], r.status_code, r.text[:200])
        if method == "POST" or "ready" not in path:  # a ready probe answers with the status alone
            assert "(details: stoll), version should be an integral value > 0" in r.json()["error"]


def test_unparsable_bodies_are_invalid_argument_with_one_log_line(
    server: ServerProcess, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    garbage = b"\xff\xff\xff\xff\x0f"  # a truncated varint: not a protobuf message
    with grpc.insecure_channel(server.url) as channel:
        for method in ("ModelInfer", "ModelReady", "RepositoryModelLoad", "SystemSharedMemoryRegister", "LogSettings"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            for _ in range(20):
                err = _error(lambda call=call: call(garbage))
                assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Unable to parse request")
        health = channel.unary_unary("/grpc.health.v1.Health/Check")
        err = _error(lambda: health(garbage))
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Unable to parse request")

        # on a stream the error is in-band and the stream keeps serving
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        good = _infer_request([1, 4]).SerializeToString()
        replies = [pb.ModelStreamInferResponse.FromString(r) for r in stream(iter([garbage, good, garbage]))]
    assert [r.error_message for r in replies] == ["Unable to parse request", "", "Unable to parse request"]
    np.testing.assert_array_equal(np.frombuffer(replies[1].infer_response.raw_output_contents[0], np.float32), range(4))
    log = server.log()
    assert "Traceback" not in log
    assert len(re.findall("not valid protobuf", log)) == 1  # 103 bad bodies, one rate-limited line
    _still_serves(server)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("   ", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("\t", "Model name cannot be empty. Please enter a valid name to deploy."),
        ("../etc", "model name must not contain path traversal characters"),
        ("..", "model name must not contain path traversal characters"),
        ("a/b", "model name must not contain path traversal characters"),
        ("/etc", "model name must not contain path traversal characters"),
        ("a\x00b", "model name must not contain path traversal characters"),
        (" ..", "model name must not contain path traversal characters"),  # Triton 2.73 refuses these too
        (".. ", "model name must not contain path traversal characters"),
        (" . ", "model name must not contain path traversal characters"),
    ],
)
def test_load_and_unload_names_are_checked(server: ServerProcess, name: str, message: str) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name)
    assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    if "traversal" in message:
        # an unload is a lookup among loaded models, not a path: answered as for any unknown model (no error)
        client.unload_model(name)
    else:
        with pytest.raises(InferenceServerException) as info:
            client.unload_model(name)
        assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    assert client.is_server_live()
    client.close()
    assert "poll" not in server.log()  # refused before any repository lookup


def test_load_of_a_valid_name_still_works(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    client.unload_model("identity_fp32")
    assert not client.is_model_ready("identity_fp32")
    client.load_model("identity_fp32")
    assert client.is_model_ready("identity_fp32")
    client.close()


@pytest.mark.parametrize("value", [float("nan"), 2.5])
def test_classification_must_be_an_integer(stub: pb_grpc.GRPCInferenceServiceStub, value: float) -> None:
    """Found by the reliability fuzzer: a double `classification` parameter (NaN) was an INTERNAL error."""
    msg = _infer_request([1, 4])
    msg.outputs.add(name="OUTPUT0").parameters["classification"].double_param = value
    err = _error(lambda: stub.ModelInfer(msg))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "invalid value type for 'classification' parameter for output 'OUTPUT0', expected int64_param."
    )
