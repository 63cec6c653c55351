"""Large ModelInfer messages without long stalls of the event loop: tensor bytes are sliced, not parsed.

protobuf copies every `bytes` field while parsing, again on each access, and again while serialising, all
holding the GIL: for a 100 MiB tensor that kept the loop (every other client) waiting for ~1 s on this VM.
Above LARGE_BYTES a ModelInferRequest is split at the wire level: `raw_input_contents` (field 7) become
memoryviews of the received buffer (no copy) and only the rest is parsed by protobuf. A response whose outputs
hold LARGE_BYTES or more is serialised here: protobuf writes the small part, and the output bytes are copied
once into the final message (protobuf would copy them twice, and the worker's arena block into bytes before
that); from THREAD_COPY_BYTES on by numpy on a worker thread (numpy releases the GIL while copying).
"""

from __future__ import annotations

import asyncio
import ctypes
from dataclasses import dataclass

import numpy as np

from protos import grpc_service_pb2 as pb
from service.frontend.grpc.params import set_param
from service.frontend.grpc.varints import read_varint, varint_bytes
from service.ipc.blocks import THREAD_COPY_BYTES
from service.types import InferResponse

# messages this large take the sliced paths: from here on the copies they save cost more than their Python calls
# (the worker lends its output arena blocks from the same size on: service/ipc/blocks.py LEND_BYTES)
LARGE_BYTES = 256 << 10
_RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
_RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents: field 6, wire type 2

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


@dataclass(slots=True)
class SplitRequest:
    """A large ModelInferRequest: everything but the raw contents parsed, the raw contents as views."""

    msg: pb.ModelInferRequest
    raws: list[memoryview]


def _varint(raw: bytes, pos: int, end: int) -> tuple[int, int]:
    value, pos = read_varint(raw, pos, end)
    if pos < 0:
        raise ValueError("truncated or malformed varint")
    return value, pos


def parse_request(raw: bytes) -> pb.ModelInferRequest | SplitRequest:
    """ModelInferRequest.FromString for small messages; SplitRequest (no tensor copy) for large ones."""
    if len(raw) <= LARGE_BYTES:
        return pb.ModelInferRequest.FromString(raw)
    view = memoryview(raw)
    rest: list[memoryview] = []
    raws: list[memoryview] = []
    pos, end = 0, len(raw)
    while pos < end:
        start = pos
        key, pos = _varint(raw, pos, end)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(raw, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = _varint(raw, pos, end)
            if key >> 3 == _RAW_INPUT_FIELD:
                if pos + n > end:
                    raise ValueError("truncated message")
                raws.append(view[pos : pos + n])
                pos += n
                continue
            pos += n
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("truncated message")
        rest.append(view[start:pos])
    return SplitRequest(pb.ModelInferRequest.FromString(b"".join(rest)), raws)


def serialize(message: pb.ModelInferResponse | bytes) -> bytes:
    """The ModelInfer response serializer: messages as protobuf does, pre-serialised large ones as they are."""
    return message if type(message) is bytes else message.SerializeToString()  # type: ignore[union-attr]


def response_bytes(resp: InferResponse) -> int:
    """Payload bytes of a response's outputs."""
    n = 0
    for o in resp.outputs:  # a loop, not sum(<generator>): this runs per response
        if o.data is not None:
            n += len(o.data)
    return n


def _header(resp: InferResponse) -> tuple[bytes, list[tuple[bytes, memoryview]]]:
    """The response without raw contents (protobuf), and (field prefix, bytes) per output."""
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    for name, value in resp.parameters.items():
        set_param(msg.parameters[name], value)
    parts = []
    for o in resp.outputs:
        msg.outputs.add(name=o.name, datatype=o.datatype, shape=o.shape)
        data = memoryview(o.data if o.data is not None else b"").cast("B")
        parts.append((_RAW_OUTPUT_TAG + varint_bytes(len(data)), data))
    return msg.SerializeToString(), parts


def _fill(target: np.ndarray, pieces: list[tuple[int, memoryview]]) -> None:
    for offset, data in pieces:
        np.copyto(target[offset : offset + len(data)], np.frombuffer(data, np.uint8))


def writable_bytes(size: int) -> tuple[bytes, memoryview]:
    """A new bytes object of `size` bytes, uninitialised, and a writable view of its own buffer: a large message
    is written once, straight into the bytes object its reader gets (no bytearray copied into bytes at the end).
    Fill it through the view before anyone else sees it; keep the bytes object alive while the view is used (the
    view does not hold it)."""
    out: bytes = _new_bytes(None, size)
    address = ctypes.cast(ctypes.c_char_p(out), ctypes.c_void_p).value  # c_char_p points into it, no copy
    return out, memoryview((ctypes.c_ubyte * size).from_address(address or 0)).cast("B")


async def serialize_large(resp: InferResponse) -> bytes:
    """The serialised ModelInferResponse, its tensor bytes copied once (by a thread from THREAD_COPY_BYTES on)."""
    head, parts = _header(resp)
    total = len(head) + sum(len(prefix) + len(data) for prefix, data in parts)
    out, view = writable_bytes(total)
    writable = np.frombuffer(view, np.uint8)
    small: list[tuple[int, memoryview]] = [(0, memoryview(head))]
    big: list[tuple[int, memoryview]] = []
    pos = len(head)
    for prefix, data in parts:
        small.append((pos, memoryview(prefix)))
        pos += len(prefix)
        big.append((pos, data))
        pos += len(data)
    _fill(writable, small)
    if total < THREAD_COPY_BYTES:
        _fill(writable, big)  # a thread's round trip costs more than copying this much here
    else:
        await asyncio.get_running_loop().run_in_executor(None, _fill, writable, big)
    return out
