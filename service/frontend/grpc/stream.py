"""ModelStreamInfer: many requests on one bidirectional stream, responses written as they complete.

Rules (Triton's, docs/streaming.md): a non-decoupled model's single response is written in request order; a
decoupled model's responses are written as produced; every response carries `triton_final_response`; a decoupled
model's bare final flag becomes an empty response only when the request set `triton_enable_empty_final_response`;
errors travel in-band in `error_message` and the stream stays open, unless the client opened the stream with the
header `triton_grpc_error: true`: then the first error ends the stream with that error's gRPC status.
When the client cancels the call or goes away, every request of the stream still queued is cancelled (it never
executes) and running ones are flagged (pb_utils `request.is_cancelled()`).

Flow control: responses not yet written (the client reads slower than the model answers) are counted in bytes;
above `buffer_bytes` the server stops reading requests until the writer catches up, so an unread stream holds a
bounded amount of memory and HTTP/2 flow control pushes back on the client. A cancelled stream drops what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import grpc

from protos import grpc_service_pb2 as pb
from service.core.facade import Facade, Submitted
from service.errors import ErrorCode, ServiceError
from service.frontend.grpc import codec
from service.frontend.grpc.calls import CallOptions
from service.frontend.grpc.observers import sample_trace, traceparent_of
from service.frontend.status import GRPC_STATUS
from service.types import InferRequest, InferResponse

log = logging.getLogger("trireme.grpc")
GRPC_ERROR_HEADER = "triton_grpc_error"  # stream header: errors end the stream with their gRPC status
MESSAGE_OVERHEAD = 256  # bytes counted per buffered response besides its tensors (ids, names, shapes)
_Out = tuple[pb.ModelStreamInferResponse, int]  # a message waiting to be written and the bytes it counts for


def _request_error(request_id: str, e: Exception) -> pb.ModelStreamInferResponse:
    """An in-band error for a request that could not be decoded or enqueued: only `id` is filled."""
    msg = pb.ModelStreamInferResponse(error_message=codec.error_to_service(e).message)
    msg.infer_response.id = request_id
    return msg


class _Slot:
    """One request of the stream: where its responses go until we know whether its model is decoupled."""

    __slots__ = ("decoupled", "message", "pending", "request")

    def __init__(self, request: InferRequest | None) -> None:
        self.request = request
        self.decoupled: bool | None = None  # None until the model version is known
        self.message: _Out | None = None  # the non-decoupled answer, once it arrived
        self.pending: list[_Out] = []  # decoupled answers that arrived before we knew


class StreamSession:
    """State of one ModelStreamInfer call: in-flight requests, the ordered queue and the outgoing messages."""

    def __init__(
        self,
        engine: Facade,
        context: grpc.aio.ServicerContext,
        buffer_bytes: int = 64 << 20,
        on_unparsable: Callable[[grpc.aio.ServicerContext], None] | None = None,
    ) -> None:
        self.engine = engine
        self.context = context
        self.calls: CallOptions | None = None  # header forwarding for every request of the stream
        self.out: deque[_Out] = deque()
        self.ordered: deque[_Slot] = deque()
        self.inflight: dict[InferRequest, Submitted] = {}
        self.wake = asyncio.Event()
        self.reading = True
        self.closed = False  # cancelled: late responses are dropped
        self.buffer_bytes = buffer_bytes
        self.buffered = 0  # bytes of the responses produced and not yet written
        self.room = asyncio.Event()  # set when buffered fell to buffer_bytes or below
        self.on_unparsable = on_unparsable
        # `triton_grpc_error: true`: the first error ends the stream with its status instead of going in-band
        metadata = context.invocation_metadata() or ()
        self.grpc_error = any(k == GRPC_ERROR_HEADER and str(v).lower() == "true" for k, v in metadata)
        self.errors: dict[int, ServiceError] = {}  # id(queued error message) -> its error, in that mode only
        self.failure: ServiceError | None = None
        self.traceparent = ""
        if engine.tracer.enabled:
            self.traceparent = traceparent_of(context)

    # ---- requests in ------------------------------------------------------------------------------------
    async def read_all(self) -> None:
        """Read requests until the client half-closes; start each one as it arrives."""
        context = self.context
        room = self.room
        try:
            while True:
                while self.buffered > self.buffer_bytes:  # the client does not read: stop reading its requests
                    room.clear()
                    await room.wait()
                msg = await context.read()
                if msg is grpc.aio.EOF:  # type: ignore[attr-defined]
                    break
                if msg is codec.UNPARSABLE:
                    if self.on_unparsable is not None:
                        self.on_unparsable(context)
                    error = ServiceError(ErrorCode.INVALID_ARG, "Unable to parse request")
                    self._answer_now(self._noted(_request_error("", error), error))
                    continue
                self.start(msg)
        finally:
            self.reading = False
            self.wake.set()

    def start(self, msg: pb.ModelInferRequest) -> None:
        """Decode and submit one request; decode and enqueue errors are answered in-band, in order."""
        received = time.monotonic_ns()
        try:
            request = codec.decode_infer_request(msg)
            if self.calls is not None:
                self.calls.forward_headers(self.context, request)
        except Exception as e:
            self._answer_now(self._noted(_request_error(msg.id, e), e))
            return
        if self.engine.tracer.enabled:
            self._sample(request, received)
        slot = _Slot(request)
        self.ordered.append(slot)
        try:
            mv = self.engine.submit(request, lambda response: self._on_response(slot, response))
        except Exception as e:
            if request.trace is not None:
                request.trace.finish()
            if not isinstance(e, ServiceError):
                log.exception(
                    "stream request failed to start", extra={"request_id": request.id, "model": request.model_name}
                )
            slot.decoupled = False
            slot.message = self._counted(self._noted(_request_error(msg.id, e), e))
            self._flush()
            return
        if mv.streams:  # decoupled, or an ensemble with a decoupled step: answers written as produced
            slot.decoupled = True
            self.ordered.remove(slot)
            self.out.extend(slot.pending)
            slot.pending.clear()
            self._flush()
        else:
            slot.decoupled = False
            if slot.pending:
                slot.message = slot.pending.pop()
                self._flush()
        if slot.request is not None:
            self.inflight[request] = mv

    def _sample(self, request: InferRequest, received_ns: int) -> None:
        sample_trace(self.engine.tracer, request, self.traceparent, received_ns)

    def _answer_now(self, message: pb.ModelStreamInferResponse) -> None:
        """An answer that is not tied to a submitted request: keeps its place behind earlier ordered answers."""
        slot = _Slot(None)
        slot.decoupled = False
        slot.message = self._counted(message)
        self.ordered.append(slot)
        self._flush()

    # ---- responses out ----------------------------------------------------------------------------------
    def _counted(self, message: pb.ModelStreamInferResponse, nbytes: int = MESSAGE_OVERHEAD) -> _Out:
        self.buffered += nbytes
        return message, nbytes

    def _on_response(self, slot: _Slot, response: InferResponse) -> None:
        request = slot.request
        if response.final and request is not None:
            self.inflight.pop(request, None)
            slot.request = None
            if request.trace is not None:  # written from here on: the stream's writer owns the send
                request.trace.stamp("GRPC_SEND_START")
                request.trace.stamp("GRPC_SEND_END")
                request.trace.finish()
        if self.closed or (response.null and (request is None or not request.enable_empty_final)):
            self.wake.set()  # may be the last in-flight request
            return
        nbytes = MESSAGE_OVERHEAD
        for o in response.outputs:
            if o.data is not None:
                nbytes += len(o.data)
        encoded = codec.encode_stream_response(response)
        if response.error is not None:
            self._noted(encoded, response.error)
        message = self._counted(encoded, nbytes)
        if slot.decoupled is False:
            slot.message = message
        elif slot.decoupled:
            self.out.append(message)
        else:
            slot.pending.append(message)  # answered before submit() returned
        self._flush()

    def _noted(self, message: pb.ModelStreamInferResponse, error: Exception) -> pb.ModelStreamInferResponse:
        """Remember which queued message is an error when errors end the stream (triton_grpc_error)."""
        if self.grpc_error:
            self.errors[id(message)] = codec.error_to_service(error)
        return message

    def _flush(self) -> None:
        ordered = self.ordered
        while ordered and ordered[0].message is not None:
            self.out.append(ordered.popleft().message)  # type: ignore[arg-type]
        self.wake.set()

    @property
    def finished(self) -> bool:
        """Client half-closed, nothing in flight, nothing left to write."""
        return not self.reading and not self.inflight and not self.ordered and not self.out

    async def write_all(self) -> None:
        """Write responses as they become available until the stream is finished."""
        out = self.out
        write = self.context.write
        limit = self.buffer_bytes
        while True:
            while out:
                message, nbytes = out.popleft()
                if self.errors and id(message) in self.errors:
                    self.failure = self.errors.pop(id(message))
                    return  # serve_stream ends the call with this error's status
                await write(message)
                self.buffered -= nbytes
                if self.buffered <= limit:
                    self.room.set()
            if self.finished:
                return
            self.wake.clear()
            if out:
                continue
            await self.wake.wait()

    def cancel_all(self) -> None:
        """The client went away: cancel what is queued, flag what runs, drop every response held."""
        self.closed = True
        self.out.clear()
        self.ordered.clear()
        self.buffered = 0
        self.room.set()
        inflight, self.inflight = self.inflight, {}
        for request, mv in inflight.items():
            try:
                self.engine.cancel(request, mv)
            except Exception:
                log.exception("cancelling a stream request failed")


async def serve_stream(
    engine: Facade,
    context: grpc.aio.ServicerContext,
    buffer_bytes: int = 64 << 20,
    on_unparsable: Callable[[grpc.aio.ServicerContext], None] | None = None,
    calls: CallOptions | None = None,
) -> None:
    """Run one ModelStreamInfer call to its end (client half-close and every request answered)."""
    session = StreamSession(engine, context, buffer_bytes, on_unparsable)
    session.calls = calls  # header forwarding (grpc/calls.py)
    reader = asyncio.get_running_loop().create_task(session.read_all())
    done = False
    try:
        await session.write_all()
        done = session.failure is None
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a write failed: the client cancelled or went away; nothing is left to tell it
        log.debug("stream write failed (client gone): %r", e)
        return
    finally:
        if not done:
            session.cancel_all()
        if not reader.done():
            reader.cancel()
        try:
            await reader
        except (asyncio.CancelledError, Exception) as e:
            if not done and not isinstance(e, asyncio.CancelledError):
                log.debug("stream reader ended with %r", e)
    if session.failure is not None:
        await context.abort(GRPC_STATUS[session.failure.code], session.failure.message)
