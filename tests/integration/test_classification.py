"""Triton's classification extension through tritonclient: top-k "value:index:label" strings per batch item."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import write_model
from tests.integration.models import elementwise_py

CONFIG = """
    name: "scores"
    backend: "python"
    max_batch_size: 4
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
"""
IDENTITY = elementwise_py(inp="IN", out="OUT")


def test_top_k_with_labels(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    model_dir = write_model(tmp_path, "scores", CONFIG, IDENTITY)
    (model_dir / "labels.txt").write_text("cat\ndog\nbird\n")  # index 3 has no label
    server = start_server([tmp_path])
    client = grpcclient.InferenceServerClient(server.url)
    x = grpcclient.InferInput("IN", [2, 4], "FP32")
    x.set_data_from_numpy(np.array([[0.1, 0.7, 0.2, 0.9], [0.5, 0.25, 0.75, 0.0]], np.float32))
    result = client.infer("scores", [x], outputs=[grpcclient.InferRequestedOutput("OUT", class_count=2)])
    top = result.as_numpy("OUT")
    assert top.shape == (2, 2)
    assert [v.decode() for v in top[0]] == ["0.900000:3", "0.700000:1:dog"]
    assert [v.decode() for v in top[1]] == ["0.750000:2:bird", "0.500000:0:cat"]
    # class_count larger than the number of elements: all of them, sorted
    result = client.infer("scores", [x], outputs=[grpcclient.InferRequestedOutput("OUT", class_count=10)])
    assert result.as_numpy("OUT").shape == (2, 4)
    # without classification the raw scores come back
    np.testing.assert_allclose(client.infer("scores", [x]).as_numpy("OUT")[0], [0.1, 0.7, 0.2, 0.9], rtol=1e-6)
    client.close()


def test_classification_and_shm_together_is_rejected(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    """tritonclient refuses to build such a request, so it is sent with tritonclient's own protos."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    write_model(tmp_path, "scores", CONFIG, IDENTITY)
    server = start_server([tmp_path])
    request = pb.ModelInferRequest(model_name="scores")
    request.inputs.add(name="IN", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.zeros((1, 4), np.float32).tobytes())
    out = request.outputs.add(name="OUT")
    out.parameters["classification"].int64_param = 1
    out.parameters["shared_memory_region"].string_param = "region"
    out.parameters["shared_memory_byte_size"].int64_param = 64
    with grpc.insecure_channel(server.url) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output can't set both 'shared_memory_region' and 'classification'" in info.value.details()
