"""Tensor data in JSON bodies: a request input's `data` (nested or flat JSON arrays, row-major) as the tensor's raw
wire bytes, and an output's raw bytes as the value of its `data` (KServe v2's JSON tensor form). Triton's
messages and status codes for data that does not fit its datatype or shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.errors import ErrorCode, ServiceError, invalid_arg
from shm.tensor import DATATYPE_TO_NUMPY, deserialize_bytes, element_count, serialize_bytes


def _flatten_strings(data: Any, out: list[bytes]) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten_strings(item, out)
    elif isinstance(data, str):
        out.append(data.encode())
    else:
        raise ServiceError(ErrorCode.INTERNAL, "Unable to parse 'data': expected JSON strings for BYTES data")


def json_data_to_bytes(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """A JSON `data` value (nested or flat, row-major) as the tensor's raw wire bytes."""
    count = element_count(shape)
    if datatype == "BYTES":
        items: list[bytes] = []
        _flatten_strings(data, items)
        if len(items) != count:
            raise ServiceError(
                ErrorCode.INTERNAL, "Unable to parse 'data': Shape does not match true shape of 'data' field"
            )
        return serialize_bytes(items)
    dtype = DATATYPE_TO_NUMPY.get(datatype)
    if dtype is None or datatype == "FP16":
        if datatype in ("FP16", "BF16"):
            raise invalid_arg(
                f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input "
                f"'{name}'"
            )
        raise invalid_arg(f"invalid datatype '{datatype}' of input '{name}'")
    if datatype == "BOOL" and not _all_bools(data):
        raise ServiceError(ErrorCode.INTERNAL, "Unable to parse 'data': expected JSON booleans for BOOL data")
    try:
        array = np.array(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise ServiceError(ErrorCode.INTERNAL, f"Unable to parse 'data' of input '{name}': {e}") from None
    if array.size != count:
        raise ServiceError(
            ErrorCode.INTERNAL, "Unable to parse 'data': Shape does not match true shape of 'data' field"
        )
    return array.tobytes()


def _all_bools(data: Any) -> bool:
    if isinstance(data, list):
        return all(_all_bools(d) for d in data)
    return isinstance(data, bool)


def json_output_data(name: str, datatype: str, data: bytes | memoryview, count: int) -> Any:
    """An output's raw bytes as JSON `data`: its elements (text for BYTES; numpy for the orjson encoder)."""
    if datatype == "BYTES":
        try:
            return [b.decode() for b in deserialize_bytes(data, count)]
        except UnicodeDecodeError as e:  # JSON holds text: never alter the bytes (no U+FFFD), say how to get them
            raise invalid_arg(
                f"output '{name}' holds BYTES that are not valid UTF-8 (at byte {e.start} of an element) and cannot "
                "be returned as JSON; request it as binary data (output parameter 'binary_data': true)"
            ) from None
    dtype = DATATYPE_TO_NUMPY.get(datatype)
    if dtype is None:
        raise ServiceError(
            ErrorCode.INVALID_ARG, f"datatype {datatype} cannot be returned as JSON; request binary_data"
        )
    return np.frombuffer(data, dtype=dtype)
