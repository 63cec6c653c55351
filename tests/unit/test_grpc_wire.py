"""ModelInfer's plain messages at the protobuf wire level (service/frontend/grpc/wire.py) against protobuf itself:
every request the fast decoder takes must decode as protobuf + codec.py decode it, every other one must be left
to them (None), and a plain response must serialise to protobuf's own bytes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from protos import grpc_service_pb2 as pb
from service.errors import ServiceError
from service.frontend.grpc import codec, wire
from service.types import InferRequest, InferResponse, OutputTensor

NAMES = ["INPUT0", "x", "", "é名", "OUTPUT_with_a_rather_long_name" * 4]
DATATYPES = ["FP32", "INT64", "BYTES", "UINT8", ""]
DIMS = [0, 1, 16, -1, 300, 1 << 40, -(1 << 63), (1 << 63) - 1]


def _fields(req: InferRequest) -> tuple:
    return (
        req.model_name,
        req.model_version,
        req.id,
        [(t.name, t.datatype, t.shape, bytes(t.data) if t.data is not None else None, t.shm) for t in req.inputs],
        [(o.name, o.shm, o.classification) for o in req.outputs],
        req.parameters,
        req.sequence_id,
        req.flags,
        req.priority,
        req.timeout_us,
    )


PARAMETERS = [  # (key, oneof field, value): accepted and refused ones
    ("sequence_id", "int64_param", 42),
    ("sequence_id", "uint64_param", (1 << 64) - 1),
    ("sequence_id", "string_param", "corr-é"),
    ("sequence_id", "bool_param", True),
    ("sequence_start", "bool_param", True),
    ("sequence_end", "bool_param", False),
    ("sequence_end", "int64_param", 1),
    ("priority", "int64_param", 3),
    ("priority", "int64_param", -3),
    ("priority", "uint64_param", 9),
    ("timeout", "int64_param", 1000),
    ("timeout", "double_param", 1.5),
    ("triton_enable_empty_final_response", "bool_param", True),
    ("triton_other", "bool_param", True),
    ("custom", "double_param", -2.25),
    ("custom", "string_param", ""),
    ("custom", "int64_param", -(1 << 63)),
    ("custom", "uint64_param", 5),
    ("", "bool_param", False),
]

REFUSED = [
    ("sequence_id", "bool_param", True),
    ("sequence_end", "int64_param", 1),
    ("priority", "int64_param", -3),
    ("timeout", "double_param", 1.5),
    ("triton_other", "bool_param", True),
    ("custom", "uint64_param", 5),
]


def _add_parameters(rng: random.Random, msg: pb.ModelInferRequest, refused: bool) -> None:
    choices = PARAMETERS if refused else [p for p in PARAMETERS if p not in REFUSED]
    for key, which, value in rng.sample(choices, rng.randrange(1, 4)):
        setattr(msg.parameters[key], which, value)


def _plain_request(rng: random.Random) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=rng.choice(NAMES), model_version=rng.choice(["", "1", "17"]))
    if rng.random() < 0.3:
        _add_parameters(rng, msg, refused=False)
    if rng.random() < 0.5:
        msg.id = rng.choice(NAMES)
    for _ in range(rng.randrange(4)):
        msg.inputs.add(
            name=rng.choice(NAMES),
            datatype=rng.choice(DATATYPES),
            shape=[rng.choice(DIMS) for _ in range(rng.randrange(4))],
        )
        msg.raw_input_contents.append(rng.randbytes(rng.choice([0, 1, 64, 300])))
    for _ in range(rng.randrange(3)):
        msg.outputs.add(name=rng.choice(NAMES))
    return msg


def _slow(raw: bytes) -> InferRequest:
    return codec.decode_infer_request(pb.ModelInferRequest.FromString(raw))


def _agrees(raw: bytes) -> InferRequest | None:
    """The fast decoder's answer, checked against protobuf + codec.py: the same request, or None where they
    refuse the message or a parameter."""
    fast = wire.decode_plain_request(raw)
    try:
        slow = _slow(raw)
    except ServiceError:
        assert fast is None, raw
        return None
    if fast is not None:
        assert _fields(fast) == _fields(slow), raw
    return fast


def test_plain_requests_decode_as_protobuf_and_codec_decode_them() -> None:
    rng = random.Random(7)
    for _ in range(500):
        raw = _plain_request(rng).SerializeToString()
        assert _agrees(raw) is not None, raw
        assert isinstance(wire.parse_small_request(raw), InferRequest)


def test_request_parameters_are_applied_or_refused_as_protobufs_path_does() -> None:
    rng = random.Random(5)
    refused = 0
    for _ in range(500):
        msg = pb.ModelInferRequest(model_name="m")
        _add_parameters(rng, msg, refused=True)
        raw = msg.SerializeToString()
        if _agrees(raw) is None:
            refused += 1
            assert isinstance(wire.parse_small_request(raw), pb.ModelInferRequest)  # codec.py gives the error
    assert 50 < refused < 450


def test_a_parameter_given_twice_or_merged_is_read_as_protobuf_reads_it() -> None:
    first = b"\x0a\x0bsequence_id\x12\x02\x10\x05"  # int64 5
    second = b"\x0a\x0bsequence_id\x12\x02\x10\x07\x12\x04\x1a\x02ab"  # int64 7, then merged string "ab"
    raw = b"\x0a\x01m" + b"\x22" + bytes([len(first)]) + first + b"\x22" + bytes([len(second)]) + second
    fast = _agrees(raw)
    assert fast is not None and fast.sequence_id == "ab"


def test_shape_values_unpacked_and_fields_repeated_are_read_as_protobuf_reads_them() -> None:
    # an input with its shape as unpacked varints (3, -1) and a second packed run (7); model_name given twice
    tensor = b"\x0a\x02IN" + b"\x12\x04FP32" + b"\x18\x03" + b"\x18" + b"\xff" * 9 + b"\x01" + b"\x1a\x01\x07"
    raw = b"\x0a\x01a" + b"\x2a" + bytes([len(tensor)]) + tensor + b"\x3a\x02\x01\x02" + b"\x0a\x01b"
    fast = wire.decode_plain_request(raw)
    assert fast is not None
    assert _fields(fast) == _fields(_slow(raw))
    assert fast.model_name == "b" and fast.inputs[0].shape == [3, -1, 7]


TENSOR_PARAMETERS = [  # shared memory and classification, given right and wrong
    [("shared_memory_region", "string_param", "r0"), ("shared_memory_byte_size", "int64_param", 64)],
    [
        ("shared_memory_region", "string_param", "r1"),
        ("shared_memory_byte_size", "uint64_param", 8),
        ("shared_memory_offset", "int64_param", 16),
    ],
    [("shared_memory_region", "string_param", "r2")],  # no size
    [("shared_memory_offset", "int64_param", 4)],  # no region
    [("shared_memory_region", "int64_param", 1), ("shared_memory_byte_size", "int64_param", 8)],
    [("shared_memory_region", "string_param", "r"), ("shared_memory_byte_size", "string_param", "8")],
    [
        ("shared_memory_region", "string_param", "r"),
        ("shared_memory_byte_size", "int64_param", 8),
        ("shared_memory_offset", "bool_param", True),
    ],
    [("classification", "int64_param", 3)],
    [("classification", "uint64_param", 0)],
    [("classification", "string_param", "3")],
    [("classification", "int64_param", 2), ("shared_memory_region", "string_param", "r")],
    [("something_else", "bool_param", True)],
]


def _tensor_request(rng: random.Random) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    for i in range(rng.randrange(1, 4)):
        t = msg.inputs.add(name=f"IN{i}", datatype="FP32", shape=[2])
        if rng.random() < 0.5:
            for key, which, value in rng.choice(TENSOR_PARAMETERS):
                setattr(t.parameters[key], which, value)
        if rng.random() < 0.8:  # wrong counts too
            msg.raw_input_contents.append(b"\x00" * 8)
    for i in range(rng.randrange(3)):
        o = msg.outputs.add(name=f"OUT{i}")
        for key, which, value in rng.choice(TENSOR_PARAMETERS):
            setattr(o.parameters[key], which, value)
    return msg


def test_shared_memory_and_classification_parameters_are_read_or_refused_as_protobufs_path_does() -> None:
    rng = random.Random(9)
    taken = shm = 0
    for _ in range(1000):
        fast = _agrees(_tensor_request(rng).SerializeToString())
        if fast is not None:
            taken += 1
            shm += sum(t.shm is not None for t in fast.inputs) + sum(o.shm is not None for o in fast.outputs)
    assert taken > 100 and shm > 30


def _with(msg: pb.ModelInferRequest, change: str) -> pb.ModelInferRequest:
    if change == "a shared-memory input with a raw entry":
        t = msg.inputs[0]
        t.parameters["shared_memory_region"].string_param = "r"
        t.parameters["shared_memory_byte_size"].int64_param = 8
    elif change == "typed contents":
        msg.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    elif change == "a raw entry missing":
        msg.inputs.add(name="second", datatype="FP32", shape=[1])
    elif change == "a raw entry too many":
        msg.raw_input_contents.append(b"\x00")
    return msg


@pytest.mark.parametrize(
    "change",
    ["a shared-memory input with a raw entry", "typed contents", "a raw entry missing", "a raw entry too many"],
)
def test_requests_that_are_not_plain_are_left_to_protobuf(change: str) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="IN", datatype="FP32", shape=[2])
    msg.raw_input_contents.append(b"\x00" * 8)
    raw = _with(msg, change).SerializeToString()
    assert wire.decode_plain_request(raw) is None
    parsed = wire.parse_small_request(raw)
    assert isinstance(parsed, pb.ModelInferRequest)
    if change != "typed contents":
        with pytest.raises(ServiceError):  # codec.py's error
            codec.decode_infer_request(parsed)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x02\xff\xfe",  # model_name not UTF-8: protobuf refuses the message
        b"\x0a\x05ab",  # truncated
        b"\x0a",  # a key without its length
        b"\x08\x01",  # a varint where a string is expected
        b"\x42\x00",  # an unknown field (8)
        b"\x2a\x03\x22\x01\x00",  # an input with parameters' field number, malformed
        b"\x2a\x0c\x1a\x0a" + b"\xff" * 10,  # a shape value longer than ten bytes
        b"\x0a" + b"\xff" * 11,  # a length longer than ten bytes
    ],
)
def test_malformed_or_unknown_fields_are_left_to_protobuf(raw: bytes) -> None:
    assert wire.decode_plain_request(raw) is None


def test_mutated_requests_are_either_left_alone_or_decoded_as_protobuf_decodes_them() -> None:
    rng = random.Random(11)
    taken = 0
    for _ in range(3000):
        raw = bytearray(_plain_request(rng).SerializeToString())
        for _ in range(rng.randrange(1, 4)):
            if raw and rng.random() < 0.7:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            elif raw:
                del raw[rng.randrange(len(raw)) :]
        data = bytes(raw)
        fast = wire.decode_plain_request(data)
        if fast is None:
            continue
        taken += 1
        assert _agrees(data) is not None  # protobuf parses it too, to the same request
    assert taken > 300  # the mutations still leave many plain messages


def _response(rng: random.Random) -> InferResponse:
    outputs = []
    for _ in range(rng.randrange(4)):
        shape = [rng.choice(DIMS) for _ in range(rng.randrange(4))]
        kind = rng.randrange(3)
        data: bytes | memoryview | None = rng.randbytes(rng.choice([0, 3, 64]))
        if kind == 1:
            data = memoryview(np.arange(6, dtype=np.float32)).cast("B").cast("f")  # itemsize 4: bytes, not items
        elif kind == 2:
            data = None  # written into the client's shared memory
        outputs.append(OutputTensor(rng.choice(NAMES), rng.choice(DATATYPES), shape, data))
    return InferResponse(rng.choice(NAMES), rng.choice(["", "1"]), rng.choice(["", "id-1"]), outputs)


def test_plain_responses_are_protobufs_own_bytes() -> None:
    rng = random.Random(3)
    for _ in range(500):
        resp = _response(rng)
        fast = wire.encode_plain_response(resp)
        assert fast == codec.encode_infer_response(resp).SerializeToString()


def test_responses_with_parameters_or_values_protobuf_refuses_are_left_to_it() -> None:
    resp = InferResponse("m", "1", "", [OutputTensor("O", "FP32", [1], b"\x00" * 4)])
    resp.parameters["sequence_id"] = 3
    assert wire.encode_plain_response(resp) is None
    assert wire.encode_plain_response(InferResponse("m\udc80", "1", "")) is None
    assert wire.encode_plain_response(InferResponse("m", "1", "", [OutputTensor("O", "FP32", [1 << 63])])) is None
