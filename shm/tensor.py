"""Triton datatypes <-> numpy dtypes, and the BYTES length-prefixed serialization every transport shares."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

# Protocol datatype strings and the numpy dtype each maps to. BYTES uses object arrays of `bytes`.
DATATYPE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

# reverse lookup, also for non-native byte orders of the same type (numpy dtypes hash by equality)
_NUMPY_TO_DATATYPE: dict[np.dtype, str] = {dt: name for name, dt in DATATYPE_TO_NUMPY.items() if name != "BYTES"}

# Element size in bytes; BYTES is variable (0 here) and BF16 has no numpy dtype but a fixed size.
ELEMENT_SIZE: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "INT8": 1,
    "UINT16": 2,
    "INT16": 2,
    "FP16": 2,
    "BF16": 2,
    "UINT32": 4,
    "INT32": 4,
    "FP32": 4,
    "UINT64": 8,
    "INT64": 8,
    "FP64": 8,
    "BYTES": 0,
}

# config.pbtxt enum names (TYPE_X) <-> protocol strings; TYPE_STRING is BYTES.
CONFIG_TO_DATATYPE: dict[str, str] = {f"TYPE_{d}": d for d in ELEMENT_SIZE if d != "BYTES"}
CONFIG_TO_DATATYPE["TYPE_STRING"] = "BYTES"
DATATYPE_TO_CONFIG: dict[str, str] = {v: k for k, v in CONFIG_TO_DATATYPE.items()}

_LEN = struct.Struct("<I")


def numpy_to_datatype(dtype: np.dtype | type) -> str:
    """Protocol datatype string for a numpy dtype (object/bytes/str arrays are BYTES)."""
    if isinstance(dtype, np.dtype):  # an array's dtype (per response): no conversion call first
        name = _NUMPY_TO_DATATYPE.get(dtype)
        if name is not None:
            return name
    dt = np.dtype(dtype)
    name = _NUMPY_TO_DATATYPE.get(dt)
    if name is not None:
        return name
    if dt.kind in ("O", "S", "U"):
        return "BYTES"
    raise ValueError(f"numpy dtype {dt} has no Triton datatype")


def element_count(shape: Sequence[int]) -> int:
    """Number of elements in a tensor of this shape (1 for a scalar shape [])."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def fixed_byte_size(datatype: str, shape: Sequence[int]) -> int:
    """Byte size of a fixed-size tensor; raises KeyError for unknown datatypes and ValueError for BYTES."""
    size = ELEMENT_SIZE[datatype]
    if size == 0:
        raise ValueError("BYTES tensors have no fixed byte size")
    return size * element_count(shape)


def element_bytes(value: object) -> bytes:
    """One BYTES element as Triton's Python backend and tritonclient serialize it: a `bytes` object as is, any
    other object (str, int, float, bool, None, numpy scalars, bytes subclasses, bytearray) as `str(value)` in UTF-8.
    So the int 2 is b"2", not bytes(2)."""
    if type(value) is bytes:
        return value
    return str(value).encode("utf-8")


def serialize_bytes(values: Iterable[object]) -> bytes:
    """Length-prefix each element (uint32 little-endian) and concatenate; elements as `element_bytes` makes them."""
    parts: list[bytes] = []
    for v in values:
        b = element_bytes(v)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def serialize_bytes_array(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor (any shape) in row-major order."""
    return serialize_bytes(array.reshape(-1, order="C").tolist())


def deserialize_bytes(buffer: bytes | bytearray | memoryview, count: int | None = None) -> list[bytes]:
    """Split a length-prefixed buffer into its elements.

    Raises ValueError when a prefix runs past the end, or when `count` is given and does not match.
    """
    view = memoryview(buffer)
    out: list[bytes] = []
    pos, end = 0, len(view)
    while pos < end:
        if pos + 4 > end:
            raise ValueError(f"truncated length prefix at byte {pos}")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise ValueError(f"element {len(out)} claims {n} bytes but only {end - pos} remain")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if count is not None and len(out) != count:
        raise ValueError(f"expected {count} elements but found {len(out)}")
    return out


def bytes_to_numpy(buffer: bytes | bytearray | memoryview, shape: Sequence[int]) -> np.ndarray:
    """Object array of `bytes` with the given shape from a serialized BYTES buffer."""
    items = deserialize_bytes(buffer, element_count(shape))
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = items
    return arr.reshape(tuple(shape))


def raw_to_numpy(buffer: bytes | bytearray | memoryview, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """View (no copy) of raw little-endian bytes as an array; BYTES is deserialized."""
    if datatype == "BYTES":
        return bytes_to_numpy(buffer, shape)
    array = np.frombuffer(buffer, DATATYPE_TO_NUMPY[datatype])
    if len(shape) == 1 and len(array) == shape[0]:
        return array  # already that shape: no reshape (a numpy call per input, per request)
    return array.reshape(tuple(shape))


def numpy_to_raw(array: np.ndarray) -> bytes | memoryview:
    """Raw bytes of an array in the wire layout; a C-contiguous array is returned as a memoryview (no copy)."""
    if array.dtype.kind in ("O", "S", "U"):
        return serialize_bytes_array(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array.data.cast("B") if array.size else b""
