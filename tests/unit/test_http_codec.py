"""The HTTP codec's pure translations: JSON/binary request bodies -> InferRequest, InferResponse -> body."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.core.engine import TensorMetadata
from service.errors import ErrorCode, ServiceError
from service.frontend.http import codec
from service.types import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, InferResponse, OutputTensor
from shm.tensor import deserialize_bytes, serialize_bytes


def decode(header: dict, binary: bytes = b"", has_header: bool = False):  # type: ignore[no-untyped-def]
    return codec.decode_infer(header, memoryview(binary), "m", "", has_header)


def test_nested_and_flat_json_data_give_the_same_bytes() -> None:
    nested = {"inputs": [{"name": "X", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]}
    flat = {"inputs": [{"name": "X", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}]}
    a, b = decode(nested)[0].inputs[0], decode(flat)[0].inputs[0]
    assert a.data == b.data == np.array([1, 2, 3, 4], np.int32).tobytes()


def test_bool_bytes_and_type_errors() -> None:
    req, _ = decode({"inputs": [{"name": "B", "shape": [2], "datatype": "BOOL", "data": [True, False]}]})
    assert req.inputs[0].data == b"\x01\x00"
    with pytest.raises(ServiceError) as e:
        decode({"inputs": [{"name": "B", "shape": [2], "datatype": "BOOL", "data": [1, 0]}]})
    assert e.value.code == ErrorCode.INTERNAL
    req, _ = decode({"inputs": [{"name": "S", "shape": [1, 2], "datatype": "BYTES", "data": [["a", "é"]]}]})
    assert deserialize_bytes(req.inputs[0].data) == [b"a", "é".encode()]  # type: ignore[arg-type]
    with pytest.raises(ServiceError, match="FP16 data via JSON"):
        decode({"inputs": [{"name": "H", "shape": [1], "datatype": "FP16", "data": [1.0]}]})
    with pytest.raises(ServiceError, match="Shape does not match"):
        decode({"inputs": [{"name": "X", "shape": [3], "datatype": "FP32", "data": [1.0, 2.0]}]})


def test_request_parameters_and_output_choices() -> None:
    header = {
        "id": "r1",
        "parameters": {"sequence_id": 9, "sequence_start": True, "sequence_end": True, "priority": 2,
                       "timeout": 500, "binary_data_output": True, "colour": "red", "n": 3, "x": 0.5},
        "inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}],
        "outputs": [{"name": "A", "parameters": {"binary_data": False}},
                    {"name": "B", "parameters": {"classification": 2}}],
    }  # fmt: skip
    req, choice = decode(header)
    assert (req.id, req.sequence_id, req.priority, req.timeout_us) == ("r1", 9, 2, 500)
    assert req.flags == FLAG_SEQUENCE_START | FLAG_SEQUENCE_END
    assert req.parameters == {"colour": "red", "n": 3, "x": 0.5}
    assert choice.default is True and choice.binary == {"A": False}
    assert [(o.name, o.classification) for o in req.outputs] == [("A", 0), ("B", 2)]
    with pytest.raises(ServiceError, match="reserved for Triton usage"):
        decode({"parameters": {"triton_x": 1}, "inputs": []})
    with pytest.raises(ServiceError, match="can't set both"):
        decode({"inputs": [], "outputs": [{"name": "A", "parameters": {"binary_data": True,
                                                                        "shared_memory_region": "r",
                                                                        "shared_memory_byte_size": 4}}]})  # fmt: skip


def test_binary_section_is_split_in_input_order() -> None:
    a, b = np.arange(3, dtype=np.float32).tobytes(), serialize_bytes([b"xy"])
    header = {
        "inputs": [
            {"name": "A", "shape": [3], "datatype": "FP32", "parameters": {"binary_data_size": len(a)}},
            {"name": "J", "shape": [1], "datatype": "INT64", "data": [7]},
            {"name": "S", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(b)}},
            {"name": "E", "shape": [0], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
        ]
    }
    req, _ = decode(header, a + b, has_header=True)
    assert [bytes(t.data) for t in req.inputs] == [a, np.int64(7).tobytes(), b, b""]  # type: ignore[arg-type]
    with pytest.raises(ServiceError, match="only one of the following fields"):
        decode({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "data": [1],
                            "parameters": {"binary_data_size": 4}}]}, b"\0" * 4, True)  # fmt: skip


def test_raw_request_shapes() -> None:
    body = memoryview(np.arange(6, dtype=np.float32).tobytes())
    req, choice = codec.decode_raw(body, "m", "", [TensorMetadata("X", "FP32", [-1, -1])], True)
    assert req.inputs[0].shape == [1, 6] and choice.default is True
    req, _ = codec.decode_raw(body, "m", "", [TensorMetadata("X", "FP32", [2, -1])], False)
    assert req.inputs[0].shape == [2, 3]
    req, _ = codec.decode_raw(memoryview(b"hello"), "m", "", [TensorMetadata("S", "BYTES", [-1, 1])], True)
    assert req.inputs[0].shape == [1, 1] and deserialize_bytes(req.inputs[0].data) == [b"hello"]  # type: ignore[arg-type]
    with pytest.raises(ServiceError, match="does not fit"):
        codec.decode_raw(memoryview(b"12345"), "m", "", [TensorMetadata("X", "FP32", [-1])], False)


def test_response_json_binary_and_shm_outputs() -> None:
    resp = InferResponse(
        "m",
        "1",
        "id7",
        [
            OutputTensor("J", "FP32", [2], np.array([0.5, 1.5], np.float32).tobytes()),
            OutputTensor("B", "INT8", [3], b"\x01\x02\x03"),
            OutputTensor("Z", "FP32", [0], b""),
            OutputTensor("S", "FP32", [4], None),  # written to the client's shared memory
            OutputTensor("T", "BYTES", [2], serialize_bytes([b"a", b"bc"])),
        ],
        parameters={"p": True},
    )
    body, length = codec.encode_response(resp, codec.OutputChoice(False, {"B": True, "Z": True}))
    header = json.loads(body[:length])
    assert body[length:] == b"\x01\x02\x03"
    assert header["id"] == "id7" and header["parameters"] == {"p": True}
    outs = {o["name"]: o for o in header["outputs"]}
    assert outs["J"]["data"] == [0.5, 1.5] and outs["T"]["data"] == ["a", "bc"]
    assert outs["B"]["parameters"] == {"binary_data_size": 3} and "data" not in outs["B"]
    assert outs["Z"]["parameters"] == {"binary_data_size": 0}
    assert outs["S"] == {"name": "S", "datatype": "FP32", "shape": [4]}
    body, length = codec.encode_response(InferResponse("m", "1", "", resp.outputs[:1]), codec.OutputChoice())
    assert length == -1 and "id" not in json.loads(body)
