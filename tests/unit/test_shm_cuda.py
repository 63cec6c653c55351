"""CUDA regions of shm.cuda: the CPU-only answer here, IPC round trips on a GPU machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shm.cuda import CUDA_IPC_HANDLE_SIZE, CudaRegion, CudaUnavailableError, cuda_available

REPO_ROOT = Path(__file__).resolve().parents[2]

needs_gpu = pytest.mark.skipif(not cuda_available(), reason="needs cupy and a CUDA device")

# Opens the parent's allocation in another process (a handle cannot be opened by its creator), checks the
# data through the registry as the server would, and writes an answer back.
CHILD = """
import sys
import numpy as np
from shm.cuda import CudaRegion
from shm.registry import SharedMemoryRegistry

handle, size = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
with CudaRegion.open(handle, size, 0) as region:
    assert region.to_numpy("FP32", [4]).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert int(region.cupy_view("FP32", [4], 4).sum()) == 6
registry = SharedMemoryRegistry()
registry.register_cuda("gpu", handle, 0, size)
assert registry.cuda_status()[0].byte_size == size
resolved = registry.resolve("gpu", 16, 8)
registry.write(resolved, np.array([7, 8], dtype=np.int32))
try:
    registry.register_cuda("big", handle, 0, size * 1024)
except Exception as exc:
    assert getattr(exc, "code", None) in ("INVALID_ARG", "ALREADY_EXISTS"), exc
registry.close()
"""


@pytest.mark.skipif(cuda_available(), reason="checks the CPU-only answer")
def test_without_cuda_calls_raise_clearly() -> None:
    assert cuda_available() is False
    with pytest.raises(CudaUnavailableError, match="CUDA"):
        CudaRegion.create(16)
    with pytest.raises(CudaUnavailableError):
        CudaRegion.open(b"\0" * CUDA_IPC_HANDLE_SIZE, 16, 0)


@pytest.mark.gpu
@needs_gpu
def test_create_write_read() -> None:
    with CudaRegion.create(64, device_id=0) as region:
        assert len(region.raw_handle()) == CUDA_IPC_HANDLE_SIZE
        region.copy_from_numpy(np.arange(8, dtype=np.float32), offset=8)
        np.testing.assert_array_equal(region.to_numpy("FP32", [8], offset=8), np.arange(8))
        view = region.cupy_view("FP32", [2, 4], offset=8)
        assert float(view.sum()) == 28.0
        region.write(0, np.array([b"ab", b"c"], dtype=np.object_))
        assert region.to_numpy("BYTES", [2]).tolist() == [b"ab", b"c"]
        with pytest.raises(ValueError):
            region.read(60, 8)


@pytest.mark.gpu
@needs_gpu
def test_ipc_round_trip_through_registry() -> None:
    with CudaRegion.create(64) as region:
        region.copy_from_numpy(np.arange(4, dtype=np.float32))
        subprocess.run(
            [sys.executable, "-c", CHILD, region.raw_handle().hex(), "64"],
            cwd=REPO_ROOT,
            check=True,
            timeout=120,
        )
        np.testing.assert_array_equal(region.to_numpy("INT32", [2], offset=16), [7, 8])
