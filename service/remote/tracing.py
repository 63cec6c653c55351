"""Triton tracing across front-end processes: the front end stamps, the core samples and writes.

A front-end process cannot own a trace file or sampling counters (rates must hold over all front ends), so its
`RemoteTracer` gives every request it would hand to the sampler a `ForwardedTrace`: a Trace that only collects
the front end's stamps (GRPC_WAITREAD_*, HTTP_RECV_*, ...). They travel to the core with the request
(`wire.pack_request`); the core's one Tracer decides there, as `Tracer.sample` does in one process, and keeps
the trace of a sampled request until the front end sends the rest of its stamps (GRPC_SEND_*, HTTP_SEND_*) when
it finishes the call (`CoreTraces.end`). The final response says whether the core sampled the request, so that
end frame is sent only for traced requests (and for calls that ended without a final response: cancelled, or
failed before or while starting, where the core's answer does not say).
`enabled` is the core's: one byte of shared memory (`TraceSwitch`) that the core sets whenever its tracer may
have turned on or off (settings changed through any front end, trace_count used up), read by every front end
per request: a change is seen by all once the call that made it returns.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from typing import Any

from service.core.observability.trace_settings import TraceSettings
from service.core.observability.tracer import Trace, Tracer

# what a front end sends when it finishes a call it traced: ("t", request id, model, traceparent, stamps)
END = "t"


class TraceSwitch:
    """Whether the core's tracer is on: one byte in a memfd the core creates and its front ends inherit."""

    def __init__(self, fd: int = -1) -> None:
        if fd < 0:
            fd = os.memfd_create("trireme-tracing", os.MFD_CLOEXEC)
            os.ftruncate(fd, 1)
        self.fd = fd
        self.map = mmap.mmap(fd, 1)

    def set(self, on: bool) -> None:
        self.map[0] = on


class ForwardedTrace(Trace):
    """A front end's side of a trace: its stamps, and where to send them when the call is over."""

    __slots__ = ("rid", "sampled", "send")

    def __init__(self, tracer: RemoteTracer, model_name: str, traceparent: str) -> None:
        super().__init__(tracer, 0, model_name, tracer.global_settings)
        self.remote_parent = traceparent
        self.rid = 0  # the request's id on the wire once sent to the core (0: never sent)
        self.sampled: bool | None = None  # what the core's final response said (None: no answer came)
        self.send: Callable[[Any], None] | None = tracer.send

    def forwarded(self, rid: int) -> tuple[str, list[tuple[str, int]]]:
        """The request leaves as `rid`: what travels with it (traceparent, the stamps so far)."""
        self.rid = rid
        stamps, self.stamps = self.stamps, []
        return self.remote_parent, stamps

    def finish(self) -> None:
        """The call is over: the rest of the stamps go to the core, which writes the trace if it sampled it."""
        send, self.send = self.send, None
        if send is not None and self.sampled is not False:
            with contextlib.suppress(ConnectionError):  # the core is gone (this front end exits): nobody writes it
                send((END, self.rid, self.model_name, self.remote_parent, self.stamps))


class RemoteTracer(Tracer):
    """A front end's tracer: on while the core's is; samples nothing itself (the core does)."""

    def __init__(self, send: Callable[[Any], None], switch: TraceSwitch) -> None:
        self.switch = switch.map
        super().__init__(TraceSettings())
        self.send = send

    @property  # type: ignore[override]
    def enabled(self) -> bool:
        return self.switch[0] == 1

    @enabled.setter
    def enabled(self, value: bool) -> None:  # Tracer's own refresh: the core's switch decides here
        pass

    def sample(self, model_name: str, traceparent: str = "") -> Trace | None:
        return ForwardedTrace(self, model_name, traceparent) if self.enabled else None


class CoreTraces:
    """The core's side for one front end: its requests' traces from sampling until the front end's end frame."""

    def __init__(self, tracer: Callable[[], Tracer]) -> None:
        self.tracer = tracer  # the engine's current tracer (--trace-config replaces it at start)
        self.open: dict[int, Trace] = {}

    def begin(self, rid: int, request: Any, forwarded: tuple[str, list[tuple[str, int]]]) -> None:
        """Sample a request the front end marked; a sampled one gets a Trace with the front end's stamps."""
        traceparent, stamps = forwarded
        trace = self.tracer().sample(request.model_name, traceparent)
        if trace is not None:
            trace.stamps.extend(stamps)
            request.trace = trace
            self.open[rid] = trace

    def end(self, rid: int, model_name: str, traceparent: str, stamps: list[tuple[str, int]]) -> None:
        """The front end finished the call: add its last stamps and finish the trace.

        A call that failed before reaching the core (rid 0) is sampled here, as one process samples it."""
        trace = self.open.pop(rid, None) if rid else self.tracer().sample(model_name, traceparent)
        if trace is not None:
            trace.stamps.extend(stamps)
            trace.finish()

    def close(self) -> None:
        """The front end is gone: finish what it left open (its send stamps will not come)."""
        open_traces, self.open = self.open, {}
        for trace in open_traces.values():
            trace.finish()
