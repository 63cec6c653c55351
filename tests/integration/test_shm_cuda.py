"""CUDA shared memory end to end (GPU machines only): inputs reach a Python model as GPU tensors via DLPack."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from shm.cuda import CudaRegion, cuda_available
from tests.conftest import write_model
from tests.integration.models import python_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="needs cupy and a CUDA device")]

# Reports where its input lives and doubles it on the GPU (cupy through DLPack), returning a host array.
GPU_MODEL = """
import cupy
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            doubled = cupy.from_dlpack(t.to_dlpack()) * 2
            where = np.array([[0.0 if t.is_cpu() else 1.0]], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", cupy.asnumpy(doubled)),
                pb_utils.Tensor("ON_GPU", where),
            ]))
        return responses
"""
GPU_CONFIG = python_config(
    "gpu_double",
    outputs=[("OUTPUT0", "TYPE_FP32", [-1]), ("ON_GPU", "TYPE_FP32", [1])],
    max_batch_size=8,
    extra='parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }',
)


def test_cuda_region_input_and_output(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "gpu_double", GPU_CONFIG, GPU_MODEL)
    server = start_server(repos=[repo])
    client = grpcclient.InferenceServerClient(server.url)
    data = np.arange(64, dtype=np.float32).reshape(1, 64)
    with CudaRegion.create(1024) as region:
        region.copy_from_numpy(data)
        handle = base64.b64encode(region.raw_handle())
        client.register_cuda_shared_memory("gpu_in", handle, 0, 1024)
        status = client.get_cuda_shared_memory_status(as_json=True)["regions"]["gpu_in"]
        assert int(status["byte_size"]) == 1024
        inp = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
        inp.set_shared_memory("gpu_in", 256)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("gpu_in", 256, offset=512)
        result = client.infer("gpu_double", [inp], outputs=[out, grpcclient.InferRequestedOutput("ON_GPU")])
        assert result.as_numpy("ON_GPU").tolist() == [[1.0]]  # is_cpu() was False: no host copy of the input
        np.testing.assert_array_equal(region.to_numpy("FP32", [1, 64], offset=512), data * 2)
        client.unregister_cuda_shared_memory("gpu_in")
        assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
    client.close()
