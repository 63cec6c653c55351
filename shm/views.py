"""Numpy views over raw byte buffers: zero-copy for fixed-size datatypes, BYTES decoded via shm.tensor."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from shm.tensor import DATATYPE_TO_NUMPY, bytes_to_numpy, element_count, fixed_byte_size

_LEN = struct.Struct("<I")

Buffer = bytes | bytearray | memoryview | np.ndarray


def as_byte_view(buffer: Buffer) -> memoryview:
    """Flat unsigned-byte memoryview over any buffer (no copy)."""
    view = buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_window(offset: int, nbytes: int, size: int) -> None:
    """Raise ValueError unless [offset, offset + nbytes) lies inside a buffer of `size` bytes."""
    if offset < 0 or nbytes < 0 or offset + nbytes > size:
        raise ValueError(f"window of {nbytes} bytes at offset {offset} is outside a buffer of {size} bytes")


def tensor_byte_size(datatype: str, shape: Sequence[int]) -> int:
    """Byte size of a fixed-size tensor; ValueError for unknown datatypes, negative dims and BYTES."""
    if any(int(d) < 0 for d in shape):
        raise ValueError(f"shape {list(shape)} has a negative dimension")
    try:
        return fixed_byte_size(datatype, shape)
    except KeyError:
        raise ValueError(f"unknown datatype '{datatype}'") from None


def bytes_extent(buffer: Buffer, count: int, offset: int = 0) -> int:
    """Byte length of the first `count` length-prefixed BYTES elements starting at `offset`."""
    view = as_byte_view(buffer)
    end, pos = len(view), offset
    for i in range(count):
        if pos + 4 > end:
            raise ValueError(f"truncated length prefix of element {i} at byte {pos}")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise ValueError(f"element {i} claims {n} bytes but only {end - pos} remain")
        pos += n
    return pos - offset


def buffer_to_numpy(buffer: Buffer, datatype: str, shape: Sequence[int], offset: int = 0) -> np.ndarray:
    """Array over `buffer` at `offset`: a zero-copy view for fixed types, decoded objects for BYTES."""
    view = as_byte_view(buffer)
    if offset < 0 or offset > len(view):
        raise ValueError(f"offset {offset} is outside a buffer of {len(view)} bytes")
    if datatype == "BYTES":
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"shape {list(shape)} has a negative dimension")
        extent = bytes_extent(view, element_count(shape), offset)
        return bytes_to_numpy(view[offset : offset + extent], shape)
    nbytes = tensor_byte_size(datatype, shape)
    dtype = DATATYPE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise ValueError(f"datatype '{datatype}' has no numpy dtype")
    check_window(offset, nbytes, len(view))
    return np.frombuffer(view[offset : offset + nbytes], dtype=dtype).reshape(tuple(int(d) for d in shape))
