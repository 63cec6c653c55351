"""Datatype tables and BYTES codecs of shm.tensor, and the buffer views of shm.views."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from shm import tensor
from shm.views import buffer_to_numpy, bytes_extent

FIXED = [d for d in tensor.DATATYPE_TO_NUMPY if d != "BYTES"]


@pytest.mark.parametrize("datatype", FIXED)
def test_fixed_round_trip(datatype: str) -> None:
    dtype = tensor.DATATYPE_TO_NUMPY[datatype]
    array = (np.arange(12) % 2).astype(dtype).reshape(3, 4)
    raw = tensor.numpy_to_raw(array)
    assert len(raw) == tensor.fixed_byte_size(datatype, [3, 4]) == array.nbytes
    np.testing.assert_array_equal(tensor.raw_to_numpy(bytes(raw), datatype, [3, 4]), array)
    assert tensor.numpy_to_datatype(dtype) == datatype
    assert tensor.CONFIG_TO_DATATYPE[tensor.DATATYPE_TO_CONFIG[datatype]] == datatype


def test_config_names() -> None:
    assert tensor.CONFIG_TO_DATATYPE["TYPE_STRING"] == "BYTES"
    assert tensor.DATATYPE_TO_CONFIG["BF16"] == "TYPE_BF16"


def test_non_contiguous_and_empty_arrays() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4).T
    assert bytes(tensor.numpy_to_raw(array)) == np.ascontiguousarray(array).tobytes()
    assert tensor.numpy_to_raw(np.zeros((0, 3), np.float32)) == b""
    assert tensor.serialize_bytes_array(np.zeros((0,), np.object_)) == b""


def test_bytes_round_trip_matches_tritonclient() -> None:
    values = np.array([[b"a", b""], [b"\x00\x01\x02", "ünï".encode()]], dtype=np.object_)
    ours = tensor.serialize_bytes_array(values)
    assert ours == serialize_byte_tensor(values).item()
    np.testing.assert_array_equal(tensor.bytes_to_numpy(ours, [2, 2]), values)
    np.testing.assert_array_equal(deserialize_bytes_tensor(ours), values.reshape(-1))
    assert tensor.serialize_bytes(["é"]) == b"\x02\x00\x00\x00\xc3\xa9"
    assert tensor.numpy_to_datatype(np.dtype("S3")) == "BYTES"


@pytest.mark.parametrize(
    "buffer",
    [b"\x01\x00", b"\x05\x00\x00\x00abc", b"\x01\x00\x00\x00a\x00"],
    ids=["truncated-prefix", "length-overrun", "trailing-partial-prefix"],
)
def test_malformed_bytes_raise(buffer: bytes) -> None:
    with pytest.raises(ValueError):
        tensor.deserialize_bytes(buffer)


def test_bytes_count_mismatch() -> None:
    buffer = tensor.serialize_bytes([b"a", b"b"])
    assert tensor.deserialize_bytes(buffer, 2) == [b"a", b"b"]
    with pytest.raises(ValueError):
        tensor.deserialize_bytes(buffer, 3)
    with pytest.raises(ValueError):
        tensor.bytes_to_numpy(buffer, [1])


def test_unknown_dtype() -> None:
    with pytest.raises(ValueError):
        tensor.numpy_to_datatype(np.complex64)
    with pytest.raises(ValueError):
        tensor.fixed_byte_size("BYTES", [1])


def test_bytes_extent_stops_after_count() -> None:
    buffer = b"xx" + tensor.serialize_bytes([b"abc", b""]) + b"\xff\xff\xff\xff"
    assert bytes_extent(buffer, 2, offset=2) == 4 + 3 + 4
    assert list(buffer_to_numpy(buffer, "BYTES", [2], offset=2)) == [b"abc", b""]
    with pytest.raises(ValueError):
        bytes_extent(buffer, 3, offset=2)


def test_buffer_to_numpy_fixed_is_a_view() -> None:
    storage = bytearray(16)
    array = buffer_to_numpy(storage, "INT32", [2], offset=8)
    array[:] = [7, 8]
    assert storage[8:] == np.array([7, 8], np.int32).tobytes()
    for bad in [("INT32", [-1], 0), ("INT32", [5], 0), ("INT32", [1], 17), ("BF16", [1], 0), ("X", [1], 0)]:
        with pytest.raises(ValueError):
            buffer_to_numpy(storage, bad[0], bad[1], bad[2])
