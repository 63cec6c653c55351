"""CUDA shared-memory regions over cupy IPC handles; cupy is imported lazily so CPU-only hosts import fine."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from shm.tensor import DATATYPE_TO_NUMPY, numpy_to_raw
from shm.views import buffer_to_numpy, check_window, tensor_byte_size

CUDA_IPC_HANDLE_SIZE = 64


class CudaUnavailableError(RuntimeError):
    """cupy is not installed or no CUDA device is present."""


def _cupy() -> Any:
    """Import cupy, or raise CudaUnavailableError explaining why CUDA shared memory cannot be used."""
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError as exc:
        raise CudaUnavailableError(
            "CUDA shared memory needs cupy (pip install cupy-cuda12x) and a CUDA device; cupy is not installed"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise CudaUnavailableError(f"CUDA shared memory needs a CUDA device: {exc}") from exc
    if count < 1:
        raise CudaUnavailableError("CUDA shared memory needs a CUDA device; none is present")
    return cupy


def require_cuda() -> None:
    """Return when CUDA shared memory can be used here; CudaUnavailableError says why it cannot."""
    _cupy()


def cuda_available() -> bool:
    """True when cupy imports and at least one CUDA device is present."""
    try:
        _cupy()
    except CudaUnavailableError:
        return False
    return True


def allocation_size(ptr: int) -> int | None:
    """Size of the device allocation containing `ptr` (cuMemGetAddressRange), or None if unknown."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    rc = libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    return int(size.value) if rc == 0 else None


class CudaRegion:
    """A device buffer shared between processes through a cudaIpcMemHandle_t."""

    def __init__(self, cupy: Any, memory: Any, ptr: int, byte_size: int, device_id: int, opened: bool) -> None:
        """Wrap a device allocation; use create() or open() instead of calling this directly."""
        self._cupy = cupy
        self._memory = memory
        self._ptr = ptr
        self._byte_size = byte_size
        self._device_id = device_id
        self._opened = opened

    @classmethod
    def create(cls, byte_size: int, device_id: int = 0) -> CudaRegion:
        """Allocate `byte_size` bytes with cudaMalloc (not the cupy pool, so IPC handles are valid)."""
        if byte_size <= 0:
            raise ValueError("byte_size must be > 0")
        cupy = _cupy()
        with cupy.cuda.Device(device_id):
            memory = cupy.cuda.Memory(byte_size)
        return cls(cupy, memory, int(memory.ptr), byte_size, device_id, opened=False)

    @classmethod
    def open(cls, raw_handle: bytes, byte_size: int, device_id: int) -> CudaRegion:
        """Open another process's allocation from its 64-byte IPC handle.

        Raises CudaUnavailableError without cupy/GPU, ValueError when `byte_size` exceeds the allocation
        or arguments are malformed, and cupy's CUDARuntimeError when the handle cannot be opened.
        """
        cupy = _cupy()
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(f"raw_handle must be {CUDA_IPC_HANDLE_SIZE} bytes, got {len(raw_handle)}")
        if byte_size < 0 or device_id < 0:
            raise ValueError("byte_size and device_id must be >= 0")
        runtime = cupy.cuda.runtime
        with cupy.cuda.Device(device_id):
            ptr = int(runtime.ipcOpenMemHandle(bytes(raw_handle)))
            available = allocation_size(ptr)
            if available is not None and byte_size > available:
                runtime.ipcCloseMemHandle(ptr)
                raise ValueError(f"byte_size {byte_size} exceeds the {available}-byte allocation")
        memory = cupy.cuda.UnownedMemory(ptr, byte_size, None, device_id)
        return cls(cupy, memory, ptr, byte_size, device_id, opened=True)

    @property
    def byte_size(self) -> int:
        """Size of the region in bytes."""
        return self._byte_size

    @property
    def device_id(self) -> int:
        """CUDA device ordinal holding the region."""
        return self._device_id

    @property
    def ptr(self) -> int:
        """Device pointer of the region's first byte."""
        self._check_open()
        return self._ptr

    def _check_open(self) -> None:
        if self._memory is None:
            raise ValueError("CUDA shared memory region is closed")

    def raw_handle(self) -> bytes:
        """The 64-byte cudaIpcMemHandle_t another process passes to open()."""
        self._check_open()
        with self._cupy.cuda.Device(self._device_id):
            return bytes(self._cupy.cuda.runtime.ipcGetMemHandle(self._ptr))

    def write(self, offset: int, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Copy host bytes (or an array in wire layout) to the region at `offset`; returns the size."""
        self._check_open()
        raw = numpy_to_raw(data) if isinstance(data, np.ndarray) else data
        host = np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)
        check_window(offset, host.size, self._byte_size)
        if host.size:
            kind = self._cupy.cuda.runtime.memcpyHostToDevice
            with self._cupy.cuda.Device(self._device_id):
                self._cupy.cuda.runtime.memcpy(self._ptr + offset, host.ctypes.data, host.size, kind)
        return int(host.size)

    def copy_from_numpy(self, array: np.ndarray, offset: int = 0) -> int:
        """Copy a host array (BYTES serialized) into the region at `offset`; returns bytes written."""
        return self.write(offset, array)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """Host copy (uint8 array) of `nbytes` bytes at `offset`."""
        self._check_open()
        check_window(offset, nbytes, self._byte_size)
        host = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            kind = self._cupy.cuda.runtime.memcpyDeviceToHost
            with self._cupy.cuda.Device(self._device_id):
                self._cupy.cuda.runtime.memcpy(host.ctypes.data, self._ptr + offset, nbytes, kind)
        return host

    def to_numpy(self, datatype: str, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """Host copy of a tensor at `offset` (BYTES decoded)."""
        if datatype == "BYTES":
            return buffer_to_numpy(self.read(offset, self._byte_size - offset), datatype, shape)
        return buffer_to_numpy(self.read(offset, tensor_byte_size(datatype, shape)), datatype, shape)

    def cupy_view(self, datatype: str, shape: Sequence[int], offset: int = 0) -> Any:
        """Device array over the region at `offset` (no copy); it must not outlive close()."""
        self._check_open()
        dtype = DATATYPE_TO_NUMPY.get(datatype)
        if dtype is None or datatype == "BYTES":
            raise ValueError(f"datatype '{datatype}' cannot be viewed as a device array")
        check_window(offset, tensor_byte_size(datatype, shape), self._byte_size)
        memptr = self._cupy.cuda.MemoryPointer(self._memory, offset)
        return self._cupy.ndarray(tuple(int(d) for d in shape), dtype=dtype, memptr=memptr)

    def close(self) -> None:
        """Close the IPC mapping (opened regions) or free the allocation (created regions); idempotent."""
        memory, self._memory = self._memory, None
        if memory is None:
            return
        if self._opened:
            with self._cupy.cuda.Device(self._device_id):
                self._cupy.cuda.runtime.ipcCloseMemHandle(self._ptr)
        del memory

    def __enter__(self) -> CudaRegion:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
