"""The gRPC layer both HTTP/2 variants share: the echo's methods by path, gRPC message framing, pre-encoded response
header and trailer blocks, and running one call's handler.

The handlers are tests/bench/echo_server.py's `Echo` methods, looked up through the generated
`add_GRPCInferenceServiceServicer_to_server` (the same request deserializers and response serializers, i.e. the
generated upb classes' FromString / SerializeToString, as grpc.aio uses): only the HTTP/2 layer differs from the
grpc.aio echo. Each call runs its handler as an asyncio task, as grpc.aio does (Trireme's ModelInfer awaits its
worker, so a production server needs a task per call too).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from service.frontend.grpc.h2.frames import literal  # the h2 transport's encoder (one copy)
from tests.bench.echo_server import Echo, _Captured

SERVICE = "inference.GRPCInferenceService"
OK, UNKNOWN, INTERNAL, UNIMPLEMENTED, CANCELLED = 0, 2, 13, 12, 1
_PREFIX = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length


@dataclass(frozen=True)
class Method:
    """One unary RPC: bytes -> request, the handler coroutine function, response -> bytes."""

    deserialize: Callable[[bytes], Any]
    handler: Callable[[Any, Any], Any]
    serialize: Callable[[Any], bytes]


class _Details:
    """grpc.HandlerCallDetails for looking a method up in the generated generic handler."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def methods(echo: Echo) -> dict[bytes, Method]:
    """The :path of each RPC the echo implements -> its Method (others answer UNIMPLEMENTED, as grpc does)."""
    captured = _Captured()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(echo, captured)
    (generic,) = captured.generic
    out = {}
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if m.name not in Echo.__dict__:  # not overridden: the generated base class answers UNIMPLEMENTED
            continue
        path = f"/{SERVICE}/{m.name}"
        h = generic.service(_Details(path))
        out[path.encode()] = Method(h.request_deserializer, h.unary_unary, h.response_serializer)
    return out


STATUS_200 = b"\x88"  # indexed static entry 8, ":status: 200"
CONTENT_TYPE = literal(31, b"application/grpc")  # static name 31: content-type
RESPONSE_HEADERS = STATUS_200 + CONTENT_TYPE
OK_TRAILERS = literal(b"grpc-status", b"0")


def status_block(code: int, message: str, trailers_only: bool) -> bytes:
    """Trailers with a non-OK status; trailers_only: also :status and content-type (a response with no message)."""
    block = literal(b"grpc-status", str(code).encode()) + literal(b"grpc-message", percent(message))
    return RESPONSE_HEADERS + block if trailers_only else block


def percent(message: str) -> bytes:
    """grpc-message's percent-encoding (printable ASCII except '%' stays as is)."""
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in message.encode("utf-8"))


# ---- gRPC messages ---------------------------------------------------------------------------------------------
def unframe(body: bytes | bytearray) -> bytes | tuple[int, str]:
    """The one gRPC message of a unary request body, or (status, message) when there is not exactly one
    uncompressed message."""
    if len(body) < 5:
        return INTERNAL, "request body holds no complete gRPC message"
    flag, n = _PREFIX.unpack_from(body)
    if flag:
        return UNIMPLEMENTED, "compressed requests are not supported by this bench server"
    if n != len(body) - 5:
        return INTERNAL, "a unary request body must hold exactly one gRPC message"
    return bytes(body[5:])


def frame_message(message: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return _PREFIX.pack(0, len(message)) + message


# done(response message bytes or None, status, status message)
Done = Callable[[bytes | None, int, str], None]


def call(method: Method | None, body: bytes | bytearray, done: Done) -> asyncio.Task[Any] | None:
    """Run one unary call: the handler as a task, done(...) once it finished (not if the task is cancelled)."""
    if method is None:
        done(None, UNIMPLEMENTED, "Method not found!")
        return None
    message = unframe(body)
    if isinstance(message, tuple):
        done(None, *message)
        return None
    try:
        request = method.deserialize(message)
    except Exception:  # any parse failure is the caller's error
        done(None, INTERNAL, "Exception deserializing request!")
        return None
    task = asyncio.get_running_loop().create_task(method.handler(request, None))

    def finished(t: asyncio.Task[Any]) -> None:
        if t.cancelled():
            return
        if t.exception() is not None:
            done(None, UNKNOWN, f"Unexpected {type(t.exception()).__name__}")
            return
        done(method.serialize(t.result()), OK, "")

    task.add_done_callback(finished)
    return task
