"""TensorRT backend: clear load failure without a GPU (runs anywhere); engine serving and CUDA shm on a GPU."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from service.ipc.devices import visible_gpu_count
from tests.conftest import add_sub_onnx_model, copy_example

pytestmark = pytest.mark.single_pass

PLAN_CONFIG = """\
name: "{name}"
platform: "tensorrt_plan"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
"""

needs_gpu = pytest.mark.skipif(visible_gpu_count() == 0, reason="needs a CUDA GPU")


@pytest.mark.skipif(visible_gpu_count() > 0, reason="checks the behaviour on a machine without a GPU")
def test_plan_without_gpu_fails_clearly_and_the_rest_serves(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32")
    for name, with_config in (("plan_model", True), ("plan_auto", False)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.plan").write_bytes(b"not an engine")
        if with_config:
            (repo / name / "config.pbtxt").write_text(PLAN_CONFIG.format(name=name))
    server = start_server(repos=[repo], args=["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["plan_model"].state == "UNAVAILABLE"
        assert "unable to load model 'plan_model': the tensorrt backend needs a CUDA GPU" in index["plan_model"].reason
        assert index["plan_auto"].state == "UNAVAILABLE"
        assert "the tensorrt backend needs a CUDA GPU" in index["plan_auto"].reason
        assert client.is_model_ready("identity_fp32")
        x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        x.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
        out = client.infer("identity_fp32", [x]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32).reshape(1, 16))
    finally:
        client.close()


def build_add_sub_plan(path: Path) -> None:
    """An FP32 add/sub engine (INPUT0/1 [-1, 16] -> OUTPUT0/1) built from an ONNX graph with the TensorRT builder."""
    pytest.importorskip("onnx")
    trt = pytest.importorskip("tensorrt")
    from onnx import TensorProto

    model = add_sub_onnx_model(TensorProto.FLOAT)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model.SerializeToString())
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(plan))


@pytest.mark.gpu
@needs_gpu
def test_plan_serves_batches_and_cuda_shm(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_add_sub_plan(repo / "add_sub_plan" / "1" / "model.plan")
    (repo / "add_sub_plan" / "config.pbtxt").write_text(
        PLAN_CONFIG.format(name="add_sub_plan")
        + "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 5000000 }\n"
    )
    build_add_sub_plan(repo / "add_sub_auto" / "1" / "model.plan")  # no config: auto-complete from the engine
    server = start_server(repos=[repo])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        b = np.ones((2, 16), np.float32)
        for model in ("add_sub_plan", "add_sub_auto"):
            inputs = [
                grpcclient.InferInput("INPUT0", [2, 16], "FP32"),
                grpcclient.InferInput("INPUT1", [2, 16], "FP32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            done: queue.Queue[Any] = queue.Queue()
            if model == "add_sub_plan":  # preferred batch 3 rows: a 1-row request joins the 2-row one
                extra = [
                    grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
                    grpcclient.InferInput("INPUT1", [1, 16], "FP32"),
                ]
                extra[0].set_data_from_numpy(a[:1] * 3)
                extra[1].set_data_from_numpy(b[:1])
                client.async_infer(model, extra, callback=lambda result, error, q=done: q.put(error or result))
            result = client.infer(model, inputs)
            if model == "add_sub_plan":
                np.testing.assert_array_equal(done.get(timeout=30).as_numpy("OUTPUT0"), a[:1] * 3 + b[:1])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        config = client.get_model_config("add_sub_auto", as_json=True)["config"]
        assert int(config["max_batch_size"]) == 8

        # inputs in CUDA shared memory: bound in place by the backend (no host copy)
        from shm.cuda import CudaRegion

        with CudaRegion.create(2 * a.nbytes) as region:
            region.copy_from_numpy(a, 0)
            region.copy_from_numpy(b, a.nbytes)
            client.register_cuda_shared_memory("trt_in", region.raw_handle(), 0, 2 * a.nbytes)
            try:
                inputs = [
                    grpcclient.InferInput("INPUT0", [2, 16], "FP32"),
                    grpcclient.InferInput("INPUT1", [2, 16], "FP32"),
                ]
                inputs[0].set_shared_memory("trt_in", a.nbytes, 0)
                inputs[1].set_shared_memory("trt_in", a.nbytes, a.nbytes)
                result = client.infer("add_sub_auto", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            finally:
                client.unregister_cuda_shared_memory("trt_in")
    finally:
        client.close()
