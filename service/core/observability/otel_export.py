"""OpenTelemetry mode: finished traces become spans exported over OTLP/HTTP, as Triton structures them.

Per request: one top-level span for the front end (receive to send), a model span (REQUEST_START to REQUEST_END)
and a compute span (COMPUTE_START to COMPUTE_END), each timestamp also recorded as a span event; ensemble steps
and BLS calls add their own model and compute spans under their parent's model span. A W3C `traceparent` the
client sent becomes the top-level span's parent. Spans are built after the request is answered, so the
request path itself never calls the SDK. The SDK is imported only in this mode (extra `otel`).
"""

from __future__ import annotations

import time
from typing import Any

from service.core.observability.trace_settings import OtelSettings
from service.core.observability.tracer import Trace

_FRONTEND = frozenset(
    (
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    )
)


class OtelExporter:
    """Turns finished Trace trees into spans and hands them to a batch span processor."""

    def __init__(self, settings: OtelSettings, span_exporter: Any = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as e:  # pragma: no cover - depends on the installed extras
            raise RuntimeError("trace mode 'opentelemetry' needs the otel extra: pip install 'trireme[otel]'") from e
        if span_exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter(endpoint=settings.url)
        self._provider = TracerProvider(resource=Resource.create(dict(settings.resource)))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                span_exporter,
                max_queue_size=settings.bsp_max_queue_size,
                schedule_delay_millis=settings.bsp_schedule_delay_ms,
                max_export_batch_size=min(settings.bsp_max_export_batch_size, settings.bsp_max_queue_size),
            )
        )
        self._tracer = self._provider.get_tracer("trireme")
        self._propagator = TraceContextTextMapPropagator()
        # Trace stamps are monotonic; spans need wall-clock ns
        self._offset = time.time_ns() - time.monotonic_ns()

    def export(self, root: Trace) -> None:
        """Emit the spans of a finished request and of everything it caused."""
        from opentelemetry import trace as otel_trace

        parent_ctx = self._propagator.extract({"traceparent": root.remote_parent}) if root.remote_parent else None
        front = [(n, ns) for n, ns in root.stamps if n in _FRONTEND]
        if front:
            start = min(ns for _, ns in root.stamps)
            end = max(ns for _, ns in root.stamps)
            top = self._tracer.start_span("InferRequest", context=parent_ctx, start_time=self._wall(start))
            for name, ns in front:
                top.add_event(name, timestamp=self._wall(ns))
            self._model_span(root, otel_trace.set_span_in_context(top))
            top.end(end_time=self._wall(end))
        else:
            self._model_span(root, parent_ctx)

    def _model_span(self, trace: Trace, ctx: Any) -> None:
        from opentelemetry import trace as otel_trace

        stamps = [(n, ns) for n, ns in trace.stamps if n not in _FRONTEND]
        if not stamps:
            return
        span = self._tracer.start_span(
            trace.model_name,
            context=ctx,
            start_time=self._wall(min(ns for _, ns in stamps)),
            attributes={
                "triton.model_name": trace.model_name,
                "triton.model_version": trace.model_version,
                "triton.trace_id": trace.id,
                "triton.trace_parent_id": trace.parent_id,
                "triton.request_id": trace.request_id,
            },
        )
        compute = [(n, ns) for n, ns in stamps if n.startswith("COMPUTE_")]
        for name, ns in stamps:
            if not name.startswith("COMPUTE_"):
                span.add_event(name, timestamp=self._wall(ns))
        span_ctx = otel_trace.set_span_in_context(span)
        if compute:
            c = self._tracer.start_span(
                "compute", context=span_ctx, start_time=self._wall(min(ns for _, ns in compute))
            )
            for name, ns in compute:
                c.add_event(name, timestamp=self._wall(ns))
            c.end(end_time=self._wall(max(ns for _, ns in compute)))
        for child in trace.children:
            self._model_span(child, span_ctx)
        span.end(end_time=self._wall(max(ns for _, ns in stamps)))

    def _wall(self, monotonic_ns: int) -> int:
        return monotonic_ns + self._offset

    def shutdown(self) -> None:
        """Flush and stop the span processor."""
        self._provider.shutdown()
