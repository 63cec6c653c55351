"""ModelInfer's plain messages read and written at the protobuf wire level (compiled with mypyc).

Nearly every ModelInfer request names its inputs and outputs and sends each input as one raw_input_contents entry
or places it in a registered shared-memory region; nearly every response is names, shapes and raw output bytes.
Going through protobuf's Python objects for them costs more than the rest of the gRPC front end's work per request
(each field access is a lookup by name and a new Python object). Here such messages go straight between bytes and
the core's types. Anything else (typed contents, a field this module does not take, a malformed message, a
parameter that is refused) is left to protobuf and codec.py, which give every other answer and error:
`decode_plain_request` and `encode_plain_response` return None for them, and the callers fall back. Parameters
(perf_analyzer sends one with every request) are read here and applied by codec.py's functions, as protobuf's
are.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from protos import grpc_service_pb2 as pb
from service.errors import ServiceError
from service.frontend.grpc.codec import Param, apply_request_param, classification, shm_ref
from service.frontend.grpc.varints import ONE_BYTE, read_varint, varint_bytes
from service.types import InferRequest, InferResponse, InputTensor, RequestedOutput

_INT64_MIN: Final = -(1 << 63)
_INT64_END: Final = 1 << 63
_U64: Final = (1 << 64) - 1
_DOUBLE: Final = struct.Struct("<d")
# InferParameter's oneof fields by number (bool 1, int64 2, string 3, double 4, uint64 5)
_PARAM_FIELDS: Final = ("", "bool_param", "int64_param", "string_param", "double_param", "uint64_param")


def _span(buf: bytes, pos: int, stop: int) -> tuple[int, int]:
    """(start, end) of a length-delimited field's content, its length read at pos; end -1 when the length is
    malformed or runs past stop."""
    n, pos = read_varint(buf, pos, stop)
    if pos < 0 or n > stop - pos:
        return 0, -1
    return pos, pos + n


def _text(buf: bytes, start: int, stop: int) -> str | None:
    try:
        return buf[start:stop].decode()  # protobuf's string fields are UTF-8: it refuses the message otherwise
    except UnicodeDecodeError:
        return None


def _int64(value: int) -> int | None:
    if value > _U64:  # a tenth byte beyond 64 bits: protobuf's business
        return None
    return value - (1 << 64) if value >= _INT64_END else value


def _shape(buf: bytes, pos: int, stop: int, shape: list[int]) -> bool:
    """Packed int64 values buf[pos:stop] appended to shape; False if malformed."""
    while pos < stop:
        value, pos = read_varint(buf, pos, stop)
        if pos < 0:
            return False
        dim = _int64(value)
        if dim is None:
            return False
        shape.append(dim)
    return True


def _input(buf: bytes, pos: int, stop: int) -> InputTensor | None:
    """An InferInputTensor without typed contents: its data comes from raw_input_contents unless its parameters
    place it in shared memory."""
    name = datatype = ""
    shape: list[int] = []
    params: dict[str, Param] | None = None
    while pos < stop:
        key, pos = read_varint(buf, pos, stop)
        if pos < 0:
            return None
        field, wire = key >> 3, key & 7
        if field == 3 and wire == 0:  # an unpacked shape value (parsers must take both forms)
            value, pos = read_varint(buf, pos, stop)
            dim = _int64(value) if pos >= 0 else None
            if dim is None:
                return None
            shape.append(dim)
            continue
        if wire != 2:
            return None
        pos, end = _span(buf, pos, stop)
        if end < 0:
            return None
        if field == 1:
            text = _text(buf, pos, end)
            if text is None:
                return None
            name = text
        elif field == 2:
            text = _text(buf, pos, end)
            if text is None:
                return None
            datatype = text
        elif field == 3:
            if not _shape(buf, pos, end, shape):
                return None
        elif field == 4:
            if params is None:
                params = {}
            if not _entry(buf, pos, end, params):
                return None
        else:  # typed contents
            return None
        pos = end
    tensor = InputTensor(name, datatype, shape)
    if params is not None:
        try:
            tensor.shm = shm_ref(params.get, name)
        except ServiceError:  # codec.py's error, from protobuf's path
            return None
    return tensor


def _output(buf: bytes, pos: int, stop: int) -> RequestedOutput | None:
    """An InferRequestedOutputTensor: its name and parameters (shared memory, classification)."""
    name = ""
    params: dict[str, Param] | None = None
    while pos < stop:
        key, pos = read_varint(buf, pos, stop)
        if pos < 0 or (key != 0x0A and key != 0x12):
            return None
        pos, end = _span(buf, pos, stop)
        if end < 0:
            return None
        if key == 0x0A:
            text = _text(buf, pos, end)
            if text is None:
                return None
            name = text
        else:
            if params is None:
                params = {}
            if not _entry(buf, pos, end, params):
                return None
        pos = end
    out = RequestedOutput(name)
    if params is not None:
        try:
            out.shm = shm_ref(params.get, name)
            classification(params.get("classification"), out)
        except ServiceError:  # codec.py's error, from protobuf's path
            return None
    return out


def _param(buf: bytes, pos: int, stop: int, which: str | None, value: Any) -> tuple[bool, str | None, Any]:
    """An InferParameter's bytes merged into (which, value): a oneof keeps the last field set. (ok, which, value)."""
    while pos < stop:
        key, pos = read_varint(buf, pos, stop)
        if pos < 0:
            return False, None, None
        field, wire = key >> 3, key & 7
        if field == 4 and wire == 1:
            if stop - pos < 8:
                return False, None, None
            which, value = "double_param", _DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
        elif field == 3 and wire == 2:
            pos, end = _span(buf, pos, stop)
            text = _text(buf, pos, end) if end >= 0 else None
            if text is None:
                return False, None, None
            which, value = "string_param", text
            pos = end
        elif 1 <= field <= 5 and field != 3 and field != 4 and wire == 0:
            number, pos = read_varint(buf, pos, stop)
            if pos < 0 or number > _U64:
                return False, None, None
            which = _PARAM_FIELDS[field]
            value = number != 0 if field == 1 else _int64(number) if field == 2 else number
        else:
            return False, None, None
    return True, which, value


def _entry(buf: bytes, pos: int, stop: int, params: dict[str, Param]) -> bool:
    """A `parameters` map entry (key 1, InferParameter 2) into params: the last entry of a key wins."""
    name = ""
    which: str | None = None
    value: Any = None
    while pos < stop:
        key, pos = read_varint(buf, pos, stop)
        if pos < 0 or (key != 0x0A and key != 0x12):
            return False
        pos, end = _span(buf, pos, stop)
        if end < 0:
            return False
        if key == 0x0A:
            text = _text(buf, pos, end)
            if text is None:
                return False
            name = text
        else:  # a value given twice in one entry is merged, as protobuf merges a message field
            ok, which, value = _param(buf, pos, end, which, value)
            if not ok:
                return False
        pos = end
    params[name] = (which, value)
    return True


def decode_plain_request(raw: bytes) -> InferRequest | None:
    """The InferRequest of a plain ModelInferRequest (no typed contents, no field this module does not take, no
    parameter codec.py refuses; each input not in shared memory paired with one raw_input_contents entry), as
    codec.decode_infer_request makes it from the parsed message; None for any other message."""
    model = version = rid = ""
    inputs: list[InputTensor] = []
    outputs: list[RequestedOutput] = []
    raws: list[bytes] = []
    params: dict[str, Param] | None = None
    pos, end = 0, len(raw)
    while pos < end:
        key, pos = read_varint(raw, pos, end)
        if pos < 0 or key & 7 != 2:  # every field taken here is length-delimited
            return None
        field = key >> 3
        pos, stop = _span(raw, pos, end)
        if stop < 0:
            return None
        if field == 7:
            raws.append(raw[pos:stop])
        elif field == 5:
            tensor = _input(raw, pos, stop)
            if tensor is None:
                return None
            inputs.append(tensor)
        elif field == 6:
            out = _output(raw, pos, stop)
            if out is None:
                return None
            outputs.append(out)
        elif field == 4:
            if params is None:
                params = {}
            if not _entry(raw, pos, stop, params):
                return None
        elif 1 <= field <= 3:
            text = _text(raw, pos, stop)
            if text is None:
                return None
            if field == 1:
                model = text
            elif field == 2:
                version = text
            else:
                rid = text
        else:  # a field this server does not know
            return None
        pos = stop
    taken = 0  # inputs not in shared memory take the raw entries in order
    for tensor in inputs:
        if tensor.shm is None:
            if taken == len(raws):  # codec.py's error for a missing raw entry
                return None
            tensor.data = raws[taken]
            taken += 1
    if taken != len(raws):  # ... and for an extra one
        return None
    req = InferRequest(model, version, rid, inputs, outputs)
    if params is not None:
        try:
            for name, (which, value) in params.items():
                apply_request_param(req, name, which, value)
        except ServiceError:  # refused: protobuf's path gives the error, for the parameter it meets first
            return None
    return req


def parse_small_request(raw: bytes) -> InferRequest | pb.ModelInferRequest:
    """ModelInfer's deserializer below grpc_large.LARGE_BYTES: a plain request decoded here, any other parsed by
    protobuf (which raises DecodeError for a malformed one)."""
    req = decode_plain_request(raw)
    return req if req is not None else pb.ModelInferRequest.FromString(raw)


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (one-byte tag)."""
    return ONE_BYTE[tag] + varint_bytes(len(data)) + data


def encode_plain_response(resp: InferResponse) -> bytes | None:
    """A ModelInferResponse without parameters serialised as protobuf writes it (fields in number order, empty
    strings left out, shapes packed); None for a response with parameters or a value protobuf would refuse."""
    if resp.parameters:
        return None
    parts: list[bytes] = []
    try:
        if resp.model_name:
            parts.append(_field(0x0A, resp.model_name.encode()))
        if resp.model_version:
            parts.append(_field(0x12, resp.model_version.encode()))
        if resp.id:
            parts.append(_field(0x1A, resp.id.encode()))
        for o in resp.outputs:
            tensor = b""
            if o.name:
                tensor = _field(0x0A, o.name.encode())
            if o.datatype:
                tensor += _field(0x12, o.datatype.encode())
            if o.shape:
                dims = b""
                for d in o.shape:
                    if not _INT64_MIN <= d < _INT64_END:
                        return None
                    dims += varint_bytes(d & _U64)
                tensor += _field(0x1A, dims)
            parts.append(_field(0x2A, tensor))
    except UnicodeEncodeError:  # a lone surrogate: protobuf refuses it, with its own error
        return None
    for o in resp.outputs:
        data = o.data
        parts.append(_field(0x32, b"" if data is None else data if isinstance(data, bytes) else bytes(data)))
    return b"".join(parts)
