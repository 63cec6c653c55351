"""Per model-version inference statistics, in the shape of ModelStatistics (Triton's statistics extension), plus
the latency histograms and failure reasons the metrics endpoint exports (the same counters feed both)."""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

from service.core.observability.summaries import SummaryWindow

# failure reasons of nv_inference_request_failure, in export order
REJECTED, CANCELED, BACKEND, OTHER = 0, 1, 2, 3
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# upper bounds (seconds) of the latency histograms: 100 us .. 60 s
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_LATENCY_BUCKETS_NS = tuple(int(b * 1e9) for b in LATENCY_BUCKETS_S)


# ModelStats' Duration fields, in the order of the statistics extension's InferStatistics
DURATION_FIELDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


@dataclass(slots=True)
class Duration:
    """A count and a total duration in ns."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """Record `count` events that took `ns` in total."""
        self.count += count
        self.ns += ns


class LatencyHistogram:
    """Counts of durations (ns) per bucket of LATENCY_BUCKETS_S (the last slot is +Inf); plain ints, no locks."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS_NS) + 1)
        self.sum_ns = 0

    def observe(self, ns: int) -> None:
        """Record one duration."""
        self.counts[bisect_left(_LATENCY_BUCKETS_NS, ns)] += 1
        self.sum_ns += ns

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, observations <= bound) for every bucket, +Inf last."""
        out, total = [], 0
        for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(slots=True)
class BatchStats:
    """Compute durations of executions of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelStats:
    """Counters for one model version; names follow Triton's statistics extension."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batch_stats: dict[int, BatchStats] = field(default_factory=dict)
    cancelled: int = 0
    # metrics only (not part of ModelStatistics)
    failures: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # per FAILURE_REASONS index
    request_latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # successful requests
    queue_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    compute_latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # input + infer + output
    first_response_latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # decoupled models
    load_duration_s: float = 0.0
    decoupled: bool = False  # set at load: first-response latency is recorded for decoupled models only
    summaries: SummaryWindow | None = None  # set at load when summary metrics are enabled

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, inferences: int | None = None
    ) -> None:
        """One model execution of `batch_size` inferences, `inferences` of them not failed (default: all)."""
        self.execution_count += 1
        self.inference_count += batch_size if inferences is None else inferences
        b = self.batch_stats.get(batch_size)
        if b is None:
            b = self.batch_stats[batch_size] = BatchStats()
        # Duration.add written out: this runs once per execution
        d = b.compute_input
        d.count += 1
        d.ns += input_ns
        d = b.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = b.compute_output
        d.count += 1
        d.ns += output_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_request(self, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """Per-request queue and compute durations of a request that was executed."""
        # Duration.add and LatencyHistogram.observe written out: this runs once per request
        d = self.queue
        d.count += 1
        d.ns += queue_ns
        d = self.compute_input
        d.count += 1
        d.ns += input_ns
        d = self.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = self.compute_output
        d.count += 1
        d.ns += output_ns
        h = self.queue_latency
        h.counts[bisect_left(_LATENCY_BUCKETS_NS, queue_ns)] += 1
        h.sum_ns += queue_ns
        h = self.compute_latency
        compute_ns = input_ns + infer_ns + output_ns
        h.counts[bisect_left(_LATENCY_BUCKETS_NS, compute_ns)] += 1
        h.sum_ns += compute_ns
        if self.summaries is not None:
            observe = self.summaries.observe
            observe("queue", queue_ns)
            observe("compute_input", input_ns)
            observe("compute_infer", infer_ns)
            observe("compute_output", output_ns)

    def record_end(self, ok: bool, total_ns: int, reason: int = BACKEND) -> None:
        """A request finished (final response), successfully or not (`reason`: a FAILURE_REASONS index)."""
        if ok:
            d = self.success
            d.count += 1
            d.ns += total_ns
            h = self.request_latency
            h.counts[bisect_left(_LATENCY_BUCKETS_NS, total_ns)] += 1
            h.sum_ns += total_ns
            if self.summaries is not None:
                self.summaries.observe("request", total_ns)
        else:
            self.fail.add(total_ns)
            self.failures[reason] += 1
