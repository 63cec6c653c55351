"""Per model-version inference statistics, in the shape of ModelStatistics (Triton's statistics extension)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Duration:
    """A count and a total duration in ns."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """Record `count` events that took `ns` in total."""
        self.count += count
        self.ns += ns


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

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One model execution of `batch_size` inferences."""
        self.execution_count += 1
        self.inference_count += batch_size
        b = self.batch_stats.get(batch_size)
        if b is None:
            b = self.batch_stats[batch_size] = BatchStats()
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_request(self, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """Per-request queue and compute durations of a request that was executed."""
        self.queue.add(queue_ns)
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)

    def record_end(self, ok: bool, total_ns: int) -> None:
        """A request finished (final response), successfully or not."""
        (self.success if ok else self.fail).add(total_ns)
