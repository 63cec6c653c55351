"""service/frontend/grpc/codec: ModelInferRequest -> InferRequest (raw, typed, shm and large split requests;
Triton's messages for bad ones) and InferResponse -> ModelInferResponse."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from protos import grpc_service_pb2 as pb
from service.errors import ErrorCode, ServiceError
from service.frontend.grpc import codec
from service.frontend.grpc import large as grpc_large
from service.frontend.grpc.params import param_value
from service.ipc.blocks import THREAD_COPY_BYTES
from service.types import InferResponse, OutputTensor


def _request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="2", id="r")
    msg.inputs.add(name="RAW", datatype="FP32", shape=[2])
    msg.raw_input_contents.append(np.array([1.5, 2.5], np.float32).tobytes())
    shm = msg.inputs.add(name="SHM", datatype="INT32", shape=[4])
    shm.parameters["shared_memory_region"].string_param = "region"
    shm.parameters["shared_memory_byte_size"].int64_param = 16
    shm.parameters["shared_memory_offset"].int64_param = 64
    msg.parameters["custom"].string_param = "v"
    msg.parameters["priority"].uint64_param = 3
    out = msg.outputs.add(name="OUT")
    out.parameters["classification"].int64_param = 2
    return msg


def test_raw_and_shm_inputs_parameters_and_outputs_are_decoded() -> None:
    req = codec.decode_infer_request(_request())
    assert (req.model_name, req.model_version, req.id) == ("m", "2", "r")
    raw, shm = req.inputs
    assert (raw.name, raw.datatype, raw.shape) == ("RAW", "FP32", [2])
    assert np.frombuffer(bytes(raw.data or b""), np.float32).tolist() == [1.5, 2.5]
    assert raw.shm is None and shm.data is None and shm.shm is not None
    assert (shm.shm.region, shm.shm.offset, shm.shm.byte_size) == ("region", 64, 16)
    assert req.parameters == {"custom": "v"} and req.priority == 3
    assert [(o.name, o.classification) for o in req.outputs] == [("OUT", 2)]


def test_typed_contents_become_raw_bytes() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="INT16", shape=[3])
    t.contents.int_contents.extend([1, -2, 3])
    s = msg.inputs.add(name="S", datatype="BYTES", shape=[2])
    s.contents.bytes_contents.extend([b"ab", b""])
    x, text = codec.decode_infer_request(msg).inputs
    assert np.frombuffer(bytes(x.data or b""), np.int16).tolist() == [1, -2, 3]
    assert bytes(text.data or b"") == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"  # length-prefixed elements


def test_a_large_request_is_split_without_copying_its_tensors() -> None:
    msg = _request()
    big = np.arange(grpc_large.LARGE_BYTES // 4 + 8, dtype=np.float32)
    msg.inputs[0].shape[:] = [big.size]
    msg.raw_input_contents[0] = big.tobytes()
    wire = msg.SerializeToString()
    split = grpc_large.parse_request(wire)
    assert isinstance(split, grpc_large.SplitRequest)
    raw = codec.decode_infer_request(split).inputs[0]
    assert isinstance(raw.data, memoryview) and raw.data.obj is wire  # a view of the received bytes
    assert np.array_equal(np.frombuffer(raw.data, np.float32), big)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.raw_input_contents.append(b"x"), "raw_input_contents has 2 entries but only 1 inputs"),
        (lambda m: m.inputs.add(name="MORE", datatype="FP32", shape=[1]), "unable to find data for input tensor"),
        (lambda m: m.parameters["triton_x"].bool_param, "reserved for Triton usage"),
        (lambda m: m.parameters["priority"].CopyFrom(pb.InferParameter(string_param="hi")), "'priority' parameter"),
    ],
)
def test_bad_requests_get_triton_s_messages(edit, message: str) -> None:  # type: ignore[no-untyped-def]
    msg = _request()
    edit(msg)
    with pytest.raises(ServiceError) as e:
        codec.decode_infer_request(msg)
    assert e.value.code == ErrorCode.INVALID_ARG and message in e.value.message


def test_responses_encode_outputs_and_parameters() -> None:
    data = np.array([[1, 2]], np.int64).tobytes()
    resp = InferResponse("m", "1", "r", [OutputTensor("A", "INT64", [1, 2], data), OutputTensor("B", "FP32", [3])])
    resp.parameters = {"flag": True, "n": 4, "x": 0.5, "s": "t"}
    msg = codec.encode_infer_response(resp)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [("A", "INT64", [1, 2]), ("B", "FP32", [3])]
    assert list(msg.raw_output_contents) == [data, b""]  # B was written into the client's shm region
    assert {k: param_value(v) for k, v in msg.parameters.items()} == resp.parameters
    # the large-message serialiser writes the same message
    assert pb.ModelInferResponse.FromString(grpc_large.serialize(msg)) == msg


@pytest.mark.parametrize("nbytes", [grpc_large.LARGE_BYTES, THREAD_COPY_BYTES + 12])
def test_the_one_copy_serialiser_writes_what_protobuf_writes(nbytes: int) -> None:
    # from LARGE_BYTES on ModelInfer responses are serialised by grpc_large, copied on the loop below
    # THREAD_COPY_BYTES and by a thread from there on; a lent arena view and plain bytes alike
    big = np.random.default_rng(0).integers(0, 255, nbytes, np.uint8)
    outputs = [
        OutputTensor("A", "UINT8", [nbytes], memoryview(big)),
        OutputTensor("B", "FP32", [2], np.array([1.5, 2], np.float32).tobytes()),
        OutputTensor("C", "FP32", [3]),  # written into the client's shm region: no bytes
    ]
    resp = InferResponse("m", "1", "r", outputs, parameters={"k": "v"})
    assert grpc_large.response_bytes(resp) >= grpc_large.LARGE_BYTES
    wire = asyncio.run(grpc_large.serialize_large(resp))
    assert pb.ModelInferResponse.FromString(wire) == codec.encode_infer_response(resp)


def test_errors_map_to_service_errors() -> None:
    assert codec.error_to_service(ServiceError(ErrorCode.NOT_FOUND, "x")).code == ErrorCode.NOT_FOUND
    assert codec.error_to_service(ValueError("boom")).code == ErrorCode.INTERNAL
