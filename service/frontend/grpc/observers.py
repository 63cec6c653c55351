"""What watches a ModelInfer call without changing it: Triton tracing (--trace-config) and Trireme's stage
timestamps (TRIREME_STAGE_TRACE). ModelInfer has one path; each observer is told when the request was decoded,
when the engine answered, around encoding, and when the call is over (also when it failed)."""

from __future__ import annotations

from typing import Any

from service.core.facade import Facade
from service.core.observability.tracer import Trace, Tracer
from service.ipc import stagetrace
from service.types import InferRequest


def traceparent_of(context: Any) -> str:
    """The W3C `traceparent` header of a call ('' when the client sent none)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return str(value)
    return ""


def sample_trace(tracer: Tracer, request: InferRequest, traceparent: str, received_ns: int) -> Trace | None:
    """Give `request` a Trace when the sampling settings pick it (GRPC_WAITREAD_START is when it arrived)."""
    trace = tracer.sample(request.model_name, traceparent)
    if trace is not None:
        trace.stamp("GRPC_WAITREAD_START", received_ns)
        trace.stamp("GRPC_WAITREAD_END")
        request.trace = trace
    return trace


class InferObserver:
    """Hooks of one ModelInfer call; each does nothing unless an observer overrides it."""

    __slots__ = ()

    def decoded(self, request: InferRequest) -> None:
        """The request was decoded (not called when decoding failed)."""

    def resumed(self) -> None:
        """The engine answered (with outputs or an error)."""

    def encoding(self) -> None:
        """The response is about to be serialised."""

    def encoded(self) -> None:
        """The response is serialised (small or large-message path alike)."""

    def finished(self) -> None:
        """The call is over, answered or aborted."""


class TraceObserver(InferObserver):
    """Triton tracing: sampled requests get a Trace with the GRPC_* activities; finished when the call is."""

    __slots__ = ("context", "received", "trace", "tracer")

    def __init__(self, tracer: Tracer, context: Any) -> None:
        self.tracer = tracer
        self.context = context
        self.received = stagetrace.now()
        self.trace: Trace | None = None

    def decoded(self, request: InferRequest) -> None:
        self.trace = sample_trace(self.tracer, request, traceparent_of(self.context), self.received)

    def encoding(self) -> None:
        if self.trace is not None:
            self.trace.stamp("GRPC_SEND_START")

    def encoded(self) -> None:
        if self.trace is not None:
            self.trace.stamp("GRPC_SEND_END")

    def finished(self) -> None:
        if self.trace is not None:
            self.trace.finish()


class StageObserver(InferObserver):
    """Stage timestamps: one JSON line per answered request (handler, decoded, ..., resumed, encoded)."""

    __slots__ = ("handler", "recorder", "request")

    def __init__(self, recorder: stagetrace.Recorder) -> None:
        self.recorder = recorder
        self.handler = stagetrace.now()
        self.request: InferRequest | None = None

    def decoded(self, request: InferRequest) -> None:
        request.stamps = [("handler", self.handler), ("decoded", stagetrace.now())]
        self.request = request

    def resumed(self) -> None:
        if self.request is not None and self.request.stamps is not None:
            self.request.stamps.append(("resumed", stagetrace.now()))

    def encoded(self) -> None:
        if self.request is not None and self.request.stamps is not None:
            self.request.stamps.append(("encoded", stagetrace.now()))
            self.recorder.write(self.request.stamps)


NO_OBSERVERS: tuple[InferObserver, ...] = ()


def infer_observers(engine: Facade, context: Any, calls: Any = None) -> tuple[InferObserver, ...]:
    """The observers of one ModelInfer call; empty (the common case) when neither kind of tracing is on and no
    per-call option (`calls`: grpc/calls.py CallOptions, header forwarding and compression) is set."""
    recorder = stagetrace.RECORDER
    if recorder is None and not engine.tracer.enabled and calls is None:
        return NO_OBSERVERS
    observers: list[InferObserver] = [calls.observer(context)] if calls is not None else []
    if recorder is not None:
        observers.append(StageObserver(recorder))
    if engine.tracer.enabled:
        observers.append(TraceObserver(engine.tracer, context))
    return tuple(observers)
