"""The minimal HTTP/2 unary client (load/transports/h2.py) against a real gRPC C-core server started in this process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from load.servers import free_port
from load.transports.client import InputTensor, build_infer_request
from load.transports.h2 import _hpack_int, header_block
from load.transports.streams import H2Transport
from protos import grpc_service_pb2 as pb


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    req = pb.ModelInferRequest.FromString(request)
    if req.model_name == "fail":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the model said no")
    resp = pb.ModelInferResponse(model_name=req.model_name, id=req.id)
    resp.raw_output_contents.extend(req.raw_input_contents)
    return resp.SerializeToString()


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)],
    )
    handler = grpc.unary_unary_rpc_method_handler(_echo, request_deserializer=None, response_serializer=None)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler}),)
    )
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None).wait(10)


def _body(model: str, payload: bytes) -> bytes:
    tensor = InputTensor("IN", "UINT8", (len(payload),), data=payload)
    return build_infer_request(model, "", [tensor]).SerializeToString()


class _Results:
    def __init__(self, expected: int) -> None:
        self.items: list[tuple[str | None, int]] = []
        self._lock = threading.Lock()
        self._expected = expected
        self.done = threading.Event()

    def __call__(self, t_end: int, err: str | None, responses: int, recv_ns: int) -> None:
        with self._lock:
            self.items.append((err, responses))
            if len(self.items) == self._expected:
                self.done.set()


def _transport(url: str) -> tuple[H2Transport, Any]:
    channel = grpc.insecure_channel(url)
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer", request_serializer=None, response_deserializer=None
    )
    return H2Transport(url, call), channel


@pytest.mark.parametrize("size", [16, 70_000, 3 * 1024 * 1024])
def test_unary_calls_in_flight(echo_url: str, size: int) -> None:
    """Many concurrent calls; large ones need several frames and window updates in both directions."""
    transport, channel = _transport(echo_url)
    count = 8 if size > 100_000 else 64
    results = _Results(count)
    try:
        for i in range(count):
            transport.submit(_body("echo", bytes([i % 251]) * size), results)
        assert results.done.wait(60)
    finally:
        transport.close()
        channel.close()
    assert results.items == [(None, 1)] * count


def test_failures_carry_the_servers_message(echo_url: str) -> None:
    transport, channel = _transport(echo_url)
    results = _Results(2)
    try:
        transport.submit(_body("fail", b"x"), results)
        transport.submit(_body("echo", b"y"), results)
        assert results.done.wait(30)
    finally:
        transport.close()
        channel.close()
    errors = sorted(e or "" for e, _ in results.items)
    assert errors[0] == "" and errors[1] == "INVALID_ARGUMENT: the model said no"


def test_connection_refused() -> None:
    with pytest.raises(ConnectionError, match="cannot connect"):
        H2Transport(f"127.0.0.1:{free_port()}", None)


def test_hpack_encoding() -> None:
    assert _hpack_int(10, 5, 0) == b"\x0a"
    assert _hpack_int(1337, 5, 0) == b"\x1f\x9a\x0a"  # RFC 7541 C.1.2
    block = header_block("h:1", "/a/B")
    assert block.startswith(b"\x83\x86")  # :method POST, :scheme http (static table)
    assert b"\x04\x04/a/B" in block and b"\x01\x03h:1" in block
    assert block.endswith(b"\x00\x02te\x08trailers")
