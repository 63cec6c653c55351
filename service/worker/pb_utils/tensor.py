"""pb_utils.Tensor: numpy-backed named tensors, DLPack in and out."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.worker.pb_utils.dtypes import numpy_to_triton_type
from service.worker.pb_utils.errors import TritonModelException, incompatible_arguments

_SIGNATURE = "triton_python_backend_utils.Tensor(name: str, data: numpy.ndarray)"


class _Capsule:
    """Wraps a bare DLPack capsule so numpy.from_dlpack can consume it (CPU tensors only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A named tensor; CPU tensors are numpy arrays (views over shared memory for request inputs)."""

    def __init__(self, name: str, data: Any, *_: Any) -> None:
        if type(name) is not str or data is None:  # Triton's argument check comes before the name's
            raise incompatible_arguments("__init__()", _SIGNATURE, (name, data))
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if isinstance(data, Tensor):
            data = data.as_numpy()
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}': expected a numpy array, got {type(data).__name__}; use from_dlpack for "
                "framework tensors"
            )
        if data.dtype.kind in ("S", "U"):
            data = data.astype(np.object_)
        elif not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        self._name = name
        self._array = data

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor as a numpy array (BYTES as an object array of bytes)."""
        return self._array

    def triton_dtype(self) -> int:
        """TRITONSERVER_DataType ordinal."""
        if self._array.dtype.kind == "O":
            return 13
        return numpy_to_triton_type(self._array.dtype.type) or 0

    def shape(self) -> list[int]:
        """The shape as a list of ints."""
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        """False for GPU tensors (cupy arrays over a client's CUDA shm region), True otherwise."""
        return isinstance(self._array, np.ndarray)

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor (CPU)."""
        if self._array.dtype.kind == "O":
            raise TritonModelException("DLPack does not support BYTES tensors")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs) if kwargs else self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A Tensor from a DLPack capsule or any object with __dlpack__ (C-contiguous CPU data)."""
        if not isinstance(name, str):
            raise incompatible_arguments("from_dlpack()", "(name: str, tensor: object) -> Tensor", (name, capsule))
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if hasattr(capsule, "__dlpack__") and hasattr(capsule, "__dlpack_device__"):
            source = capsule
        elif type(capsule).__name__ == "PyCapsule":
            source = _Capsule(capsule)
        else:
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
                "`__dlpack_device__` attributes"
            )
        array = np.from_dlpack(source)
        if not array.flags.c_contiguous:
            raise TritonModelException("DLPack tensor is not contiguous. Only contiguous DLPack tensors are supported")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _tensor_from_input(name: str, array: np.ndarray) -> Tensor:
    """Wrap a request input without the checks/copies of the public constructor."""
    t = Tensor.__new__(Tensor)
    t._name = name
    t._array = array
    return t
