"""The core server through the real tritonclient.grpc: health, metadata, config, inference and every request error."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def _expect_error(fn, status: str, *fragments: str) -> InferenceServerException:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as info:
        fn()
    err = info.value
    assert err.status() == status, (err.status(), err.message())
    for fragment in fragments:
        assert fragment in err.message(), err.message()
    return err


def test_health_and_server_metadata(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    meta = grpc_client.get_server_metadata()
    assert meta.name == "triton"
    assert "statistics" in meta.extensions and "system_shared_memory" in meta.extensions


def test_grpc_health_service(example_server: ServerProcess) -> None:
    import grpc

    from protos import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(example_server.url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_model_ready_and_unknown_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_model_ready("add_sub")
    assert grpc_client.is_model_ready("add_sub", "1")
    assert not grpc_client.is_model_ready("add_sub", "7")
    _expect_error(lambda: grpc_client.is_model_ready("nope"), "StatusCode.NOT_FOUND", "'nope'")


@pytest.mark.parametrize(
    ("model", "inputs", "outputs"),
    [
        ("add_sub", [("INPUT0", "FP32", [4]), ("INPUT1", "FP32", [4])], [("OUTPUT0", "FP32", [4])]),
        ("add_sub_int32", [("INPUT0", "INT32", [-1, 16])], [("OUTPUT1", "INT32", [-1, 16])]),
        ("identity_fp32", [("INPUT0", "FP32", [-1, 16])], [("OUTPUT0", "FP32", [-1, 16])]),
        ("identity_bytes", [("INPUT0", "BYTES", [-1, -1])], [("OUTPUT0", "BYTES", [-1, -1])]),
    ],
)
def test_model_metadata(grpc_client: grpcclient.InferenceServerClient, model: str, inputs: list, outputs: list) -> None:
    meta = grpc_client.get_model_metadata(model)
    assert meta.name == model
    assert meta.platform == "python"
    assert list(meta.versions) == ["1"]
    got_inputs = {t.name: (t.datatype, list(t.shape)) for t in meta.inputs}
    got_outputs = {t.name: (t.datatype, list(t.shape)) for t in meta.outputs}
    for name, dt, shape in inputs:
        assert got_inputs[name] == (dt, shape)
    for name, dt, shape in outputs:
        assert got_outputs[name] == (dt, shape)


def test_model_config_is_normalized(grpc_client: grpcclient.InferenceServerClient) -> None:
    config = grpc_client.get_model_config("identity_fp32", as_json=True)["config"]
    assert config["name"] == "identity_fp32"
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 8
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"][0]["name"] == "identity_fp32_0"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["default_model_filename"] == "model.py"
    assert config["input"][0]["data_type"] == "TYPE_FP32"


def test_add_sub_fp32(grpc_client: grpcclient.InferenceServerClient) -> None:
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    result = grpc_client.infer("add_sub", [_input("INPUT0", a, "FP32"), _input("INPUT1", b, "FP32")], request_id="r1")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response.id == "r1" and response.model_name == "add_sub" and response.model_version == "1"


def test_add_sub_int32_batched_and_requested_output(grpc_client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    b = np.full((3, 16), 5, dtype=np.int32)
    out = grpcclient.InferRequestedOutput("OUTPUT1")
    result = grpc_client.infer(
        "add_sub_int32", [_input("INPUT0", a, "INT32"), _input("INPUT1", b, "INT32")], outputs=[out]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None  # not requested: not returned
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]


def test_bytes_identity_with_empty_and_nul(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[b"", b"\x00", b"a\x00b", "héllo".encode(), b"x" * 1000]], dtype=np.object_)
    result = grpc_client.infer("identity_bytes", [_input("INPUT0", data, "BYTES")])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (1, 5)
    assert list(out.reshape(-1)) == list(data.reshape(-1))


def test_large_tensor_goes_through_arena(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.random.rand(1, 1 << 18).astype(np.float32)  # 1 MiB: above the inline limit
    result = grpc_client.infer("identity_fp32_any", [_input("INPUT0", data, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_statistics_count_requests(grpc_client: grpcclient.InferenceServerClient) -> None:
    before = grpc_client.get_inference_statistics("identity_fp32").model_stats[0]
    data = np.ones((2, 16), dtype=np.float32)
    for _ in range(3):
        grpc_client.infer("identity_fp32", [_input("INPUT0", data, "FP32")])
    after = grpc_client.get_inference_statistics("identity_fp32").model_stats[0]
    assert after.inference_stats.success.count == before.inference_stats.success.count + 3
    assert after.inference_count == before.inference_count + 6  # batch 2 each
    assert after.execution_count == before.execution_count + 3
    assert after.inference_stats.queue.count == after.inference_stats.success.count
    assert after.inference_stats.compute_infer.ns > before.inference_stats.compute_infer.ns
    sizes = {b.batch_size for b in after.batch_stats}
    assert 2 in sizes
    all_stats = grpc_client.get_inference_statistics().model_stats
    assert {s.name for s in all_stats} >= {"add_sub", "identity_fp32", "identity_bytes"}


def test_repository_index(grpc_client: grpcclient.InferenceServerClient) -> None:
    index = grpc_client.get_model_repository_index().models
    rows = {m.name: (m.version, m.state) for m in index}
    assert rows["add_sub"] == ("1", "READY")
    assert rows["raise_error"] == ("1", "READY")


# ---- errors -----------------------------------------------------------------------------------------------
def test_unknown_model_and_version(grpc_client: grpcclient.InferenceServerClient) -> None:
    x = _input("INPUT0", np.ones((1, 16), np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("missing_model", [x]),
        "StatusCode.NOT_FOUND",
        "Request for unknown model: 'missing_model'",
    )
    _expect_error(
        lambda: grpc_client.infer("identity_fp32", [x], model_version="3"),
        "StatusCode.NOT_FOUND",
        "'identity_fp32' version 3 is not found",
    )
    _expect_error(
        lambda: grpc_client.infer("identity_fp32", [x], model_version="abc"),
        "StatusCode.INVALID_ARGUMENT",
        "failed to get model version from specified version string 'abc'",
    )


def test_missing_extra_and_duplicate_inputs(grpc_client: grpcclient.InferenceServerClient) -> None:
    a = _input("INPUT0", np.ones(4, np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("add_sub", [a]),
        "StatusCode.INVALID_ARGUMENT",
        "expected 2 inputs but got 1 inputs for model 'add_sub'",
        "INPUT1",
    )
    extra = _input("INPUT9", np.ones(4, np.float32), "FP32")
    b = _input("INPUT1", np.ones(4, np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("add_sub", [a, b, extra]),
        "StatusCode.INVALID_ARGUMENT",
        "unexpected inference input 'INPUT9' for model 'add_sub'",
    )
    dup = _input("INPUT0", np.ones(4, np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("add_sub", [a, dup]), "StatusCode.INVALID_ARGUMENT", "already exists in request"
    )


def test_wrong_dtype_and_shape(grpc_client: grpcclient.InferenceServerClient) -> None:
    a = _input("INPUT0", np.ones(4, np.int32), "INT32")
    b = _input("INPUT1", np.ones(4, np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("add_sub", [a, b]),
        "StatusCode.INVALID_ARGUMENT",
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    )
    a5 = _input("INPUT0", np.ones(5, np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("add_sub", [a5, b]),
        "StatusCode.INVALID_ARGUMENT",
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]",
    )


def test_batch_larger_than_max_batch_size(grpc_client: grpcclient.InferenceServerClient) -> None:
    x = _input("INPUT0", np.ones((9, 16), np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("identity_fp32", [x]),
        "StatusCode.INVALID_ARGUMENT",
        "inference request batch-size must be <= 8 for 'identity_fp32'",
    )


def test_byte_size_mismatch(example_server: ServerProcess) -> None:
    """A raw payload that does not match the shape (sent with a hand-built request, as tritonclient can't)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb  # tritonclient's own protos: ours can't share a process
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name="identity_fp32", id="bad")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(b"\x00" * 60)
    with grpc.insecure_channel(example_server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "[request id: bad] input byte size mismatch for input 'INPUT0'" in info.value.details()
        assert "Expected 64, got 60" in info.value.details()
        # malformed BYTES length prefix: claims 100 bytes, has 3
        request = pb.ModelInferRequest(model_name="identity_bytes")
        request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 1])
        request.raw_input_contents.append(b"\x64\x00\x00\x00abc")
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed BYTES data" in info.value.details()
        # missing raw contents entirely
        request = pb.ModelInferRequest(model_name="identity_fp32")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unable to find data for input tensor 'INPUT0'" in info.value.details()
        # typed contents are accepted too
        request = pb.ModelInferRequest(model_name="identity_fp32")
        t = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(float(i) for i in range(16))
        reply = stub.ModelInfer(request)
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [float(i) for i in range(16)]


def test_unknown_requested_output_and_reserved_params(grpc_client: grpcclient.InferenceServerClient) -> None:
    x = _input("INPUT0", np.ones((1, 16), np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("identity_fp32", [x], outputs=[grpcclient.InferRequestedOutput("NOPE")]),
        "StatusCode.INVALID_ARGUMENT",
        "unexpected inference output 'NOPE' for model 'identity_fp32'",
    )


def test_model_errors_fail_only_that_request(grpc_client: grpcclient.InferenceServerClient) -> None:
    bad = _input("INPUT0", np.array([[-1.0]], np.float32), "FP32")
    _expect_error(
        lambda: grpc_client.infer("raise_error", [bad]),
        "StatusCode.INTERNAL",
        "Failed to process the request(s) for model 'raise_error_0'",
        "ValueError: negative input is not allowed",
    )
    nan = _input("INPUT0", np.array([[np.nan]], np.float32), "FP32")
    _expect_error(lambda: grpc_client.infer("raise_error", [nan]), "StatusCode.INVALID_ARGUMENT", "input contains NaN")
    good = _input("INPUT0", np.array([[1.5, 2.5]], np.float32), "FP32")
    np.testing.assert_array_equal(grpc_client.infer("raise_error", [good]).as_numpy("OUTPUT0"), [[1.5, 2.5]])
    assert grpc_client.is_server_ready()


def test_log_settings(grpc_client: grpcclient.InferenceServerClient) -> None:
    settings = grpc_client.get_log_settings(as_json=True)["settings"]
    assert set(settings) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    assert settings["log_info"]["bool_param"] is True
    updated = grpc_client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"}, as_json=True)
    assert updated["settings"]["log_verbose_level"]["uint32_param"] == 1
    assert updated["settings"]["log_format"]["string_param"] == "ISO8601"
    grpc_client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
    _expect_error(
        lambda: grpc_client.update_log_settings({"log_file": "/tmp/x.log"}),
        "StatusCode.UNIMPLEMENTED",
        "log_file can not be changed via network",
    )
    _expect_error(
        lambda: grpc_client.update_log_settings({"log_format": "xml"}),
        "StatusCode.INVALID_ARGUMENT",
        "invalid argument for log_format",
    )
