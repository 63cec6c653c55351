"""tritonserver.Tensor: a tensor in host memory that numpy, torch and cupy take via DLPack, built from numpy
arrays, lists, strings and DLPack objects; BYTES tensors hold Triton's length-prefixed serialization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from shm.tensor import DATATYPE_TO_NUMPY, bytes_to_numpy, numpy_to_datatype, serialize_bytes_array
from trireme.tritonserver._enums import DataType, DLDeviceType, MemoryType
from trireme.tritonserver._errors import InvalidArgumentError, UnsupportedError


@dataclass
class MemoryBuffer:
    """Where a tensor's bytes live: always host memory here (`owner` keeps them alive)."""

    data_ptr: int
    memory_type: MemoryType
    memory_type_id: int
    size: int
    owner: Any

    @staticmethod
    def from_array(array: np.ndarray) -> MemoryBuffer:
        return MemoryBuffer(array.ctypes.data, MemoryType.CPU, 0, array.nbytes, array)


@dataclass
class Tensor:
    """A typed, shaped tensor (`numpy.from_dlpack(tensor)`, `torch.from_dlpack(tensor)`)."""

    data_type: DataType
    shape: Sequence[int]
    memory_buffer: MemoryBuffer

    @property
    def data_ptr(self) -> int:
        return self.memory_buffer.data_ptr

    @property
    def memory_type(self) -> MemoryType:
        return self.memory_buffer.memory_type

    @property
    def memory_type_id(self) -> int:
        return self.memory_buffer.memory_type_id

    @property
    def size(self) -> int:
        return self.memory_buffer.size

    def _array(self) -> np.ndarray:
        """The host array of this tensor (a BYTES tensor: its serialized bytes, as Triton exports them)."""
        owner = self.memory_buffer.owner
        if self.data_type == DataType.BYTES:
            return np.asarray(owner, dtype=np.uint8)
        return np.asarray(owner).reshape(tuple(self.shape))

    def __dlpack__(self, *, stream: Any = None) -> Any:
        if stream not in (None, -1):
            raise UnsupportedError("DLPack stream synchronization is not supported for host memory")
        array = self._array()
        if not array.flags.writeable:  # DLPack before 1.0 cannot signal read-only memory: export a copy
            array = array.copy()
        return array.__dlpack__()

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return DLDeviceType.kDLCPU, 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.to_bytes_array() if self.data_type == DataType.BYTES else self._array()
        return array if dtype is None else array.astype(dtype)

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy object array of `bytes` (InvalidArgumentError for other types)."""
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"Tensor has data type {self.data_type.name} not {DataType.BYTES.name}")
        return bytes_to_numpy(self._array().tobytes(), list(self.shape))

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of `str` (each element decoded as UTF-8)."""
        array = self.to_bytes_array()
        return np.array([b.decode("utf-8") for b in array.reshape(-1)], dtype=np.str_).reshape(array.shape)

    def to_host(self) -> Tensor:
        return self

    def to_device(self, device: Any) -> Tensor:
        """Host memory is the only place tensors live in Trireme's in-process API."""
        if device in (MemoryType.CPU, MemoryType.CPU_PINNED, "cpu", DLDeviceType.kDLCPU) or (
            isinstance(device, tuple) and device and device[0] in (MemoryType.CPU, DLDeviceType.kDLCPU, "cpu")
        ):
            return self
        raise UnsupportedError(f"Unsupported device: {device!r}: only host memory is supported")

    @staticmethod
    def from_string_array(string_array: list[str] | np.ndarray) -> Tensor:
        array = np.asarray(string_array)
        encoded = np.array([str(s).encode("utf-8") for s in array.reshape(-1)], dtype=np.object_)
        return Tensor.from_bytes_array(encoded.reshape(array.shape))

    @staticmethod
    def from_bytes_array(bytes_array: list[bytes] | np.ndarray) -> Tensor:
        array = np.asarray(bytes_array, dtype=np.object_)
        serialized = np.frombuffer(serialize_bytes_array(array), dtype=np.uint8)
        return Tensor(DataType.BYTES, list(array.shape), MemoryBuffer.from_array(serialized))

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        try:
            array = np.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError) as e:
            raise InvalidArgumentError(f"Object does not support DLPack protocol on host memory: {e}") from None
        return Tensor._from_numpy(array)

    @staticmethod
    def _from_numpy(obj: np.ndarray | np.generic) -> Tensor:
        array = np.asarray(obj)
        if array.dtype.kind in ("O", "S", "U"):
            if array.dtype.kind == "U":
                return Tensor.from_string_array(array)
            return Tensor.from_bytes_array(array)
        try:
            data_type = DataType[numpy_to_datatype(array.dtype)]
        except (KeyError, ValueError):
            raise InvalidArgumentError(f"Unsupported data type: {array.dtype}") from None
        array = np.ascontiguousarray(array)
        return Tensor(data_type, list(array.shape), MemoryBuffer.from_array(array))

    @staticmethod
    def _from_object(obj: Any) -> Tensor:
        """A Tensor from what a request's `inputs` may hold: Tensor, numpy, list, scalar, or a DLPack object."""
        if isinstance(obj, Tensor):
            return obj
        if isinstance(obj, (np.ndarray, np.generic)):
            return Tensor._from_numpy(obj)
        if isinstance(obj, list):
            return Tensor._from_numpy(np.array(obj))
        if hasattr(obj, "__dlpack__"):
            return Tensor.from_dlpack(obj)
        if isinstance(obj, (str, bytes, int, float, bool)):
            return Tensor._from_numpy(np.array([obj]))
        raise InvalidArgumentError(f"Input type {type(obj)} not supported. Must be one of {Tensor._SUPPORTED}")

    @staticmethod
    def _from_raw(datatype: str, shape: Sequence[int], data: bytes | bytearray | memoryview) -> Tensor:
        """A response output's wire bytes as a Tensor (no copy of fixed-size types)."""
        if datatype == "BYTES":
            array = np.frombuffer(data, dtype=np.uint8)
            return Tensor(DataType.BYTES, list(shape), MemoryBuffer.from_array(array))
        if datatype not in DATATYPE_TO_NUMPY:
            raise UnsupportedError(f"data type {datatype} has no host representation in the Python API")
        array = np.frombuffer(data, dtype=DATATYPE_TO_NUMPY[datatype]).reshape(tuple(shape))
        return Tensor(DataType[datatype], list(shape), MemoryBuffer.from_array(array))

    def _raw(self) -> bytes | memoryview:
        """This tensor's bytes in the wire layout."""
        return self._array().reshape(-1).data.cast("B") if self.size else b""

    _SUPPORTED: ClassVar[str] = "Tensor, numpy.ndarray, list, str, bytes, int, float, bool or a DLPack object"
