"""pb_utils constants, Triton datatype <-> numpy conversions and BYTES tensor (de)serialization."""

from __future__ import annotations

from typing import Any

import numpy as np

from shm.tensor import deserialize_bytes, serialize_bytes_array

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_TRITON_INT_TO_NUMPY: dict[int, Any] = {
    1: bool,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """numpy type for a config type string such as 'TYPE_FP32'."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy type for a TRITONSERVER_DataType ordinal (1..13)."""
    return _TRITON_INT_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TRITONSERVER_DataType ordinal for a numpy type, or None."""
    if data_type in (np.object_, np.bytes_) or data_type is bytes:
        return 13
    for k, v in _TRITON_INT_TO_NUMPY.items():
        if v is data_type or (v is not bool and np.dtype(v) == np.dtype(data_type)):
            return k
    if np.dtype(data_type) == np.dtype(np.bool_):
        return 1
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Length-prefixed serialization of a BYTES tensor, as a uint8 numpy array (() for empty input)."""
    if input_tensor.size == 0:
        return ()
    return np.frombuffer(serialize_bytes_array(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    """1-D object array of bytes from a length-prefixed buffer."""
    raw = encoded_tensor.tobytes() if isinstance(encoded_tensor, np.ndarray) else bytes(encoded_tensor)
    items = deserialize_bytes(raw)
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out
