"""Measurement windows, perf_analyzer's stability rule, percentiles and server-side statistics deltas.

A level is measured in back-to-back windows of 1.2 x --measurement-interval (as perf_analyzer sleeps);
a request belongs to the window in which it completed. The level is stable once the last 3 windows'
throughput and stabilizing latency (average, or the --percentile value) each stay within
max/min <= 1 + stability threshold; the result merges those 3 windows.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from load.measure.modes import FLAG_DELAYED, FLAG_SEQUENCE_END, RESPONSES_SHIFT, Collected, now_ns

STAT_FIELDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
DEFAULT_PERCENTILES = (50, 90, 95, 99)
STABILITY_WINDOWS = 3


class LoadError(Exception):
    """Requests failed during a measurement (the server's message is in the text)."""


class Engine(Protocol):
    """What the profiler needs from a load engine (LocalEngine or ProcessEngine)."""

    def set_level(self, level: float) -> None: ...
    def take(self) -> Collected: ...
    def error(self) -> str | None: ...
    def stop_load(self) -> None: ...


@dataclass
class ServerStats:
    """Cumulative (or, after subtraction, per-window) counters from the ModelStatistics RPC."""

    inference_count: int = 0
    execution_count: int = 0
    count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAT_FIELDS, 0))
    ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAT_FIELDS, 0))

    @classmethod
    def from_response(cls, resp: Any, model: str, version: str = "") -> ServerStats:
        """Sum the entries for `model` (all versions, or only `version` when given)."""
        out = cls()
        for ms in resp.model_stats:
            if ms.name != model or (version and ms.version != version):
                continue
            out.inference_count += ms.inference_count
            out.execution_count += ms.execution_count
            for f in STAT_FIELDS:
                d = getattr(ms.inference_stats, f)
                out.count[f] += d.count
                out.ns[f] += d.ns
        return out

    def combine(self, other: ServerStats, sign: int) -> ServerStats:
        """self + sign * other, field by field."""
        return ServerStats(
            self.inference_count + sign * other.inference_count,
            self.execution_count + sign * other.execution_count,
            {f: self.count[f] + sign * other.count[f] for f in STAT_FIELDS},
            {f: self.ns[f] + sign * other.ns[f] for f in STAT_FIELDS},
        )

    def avg_us(self, name: str) -> float:
        """Average duration of one stage in microseconds (0 without samples)."""
        n = self.count[name]
        return self.ns[name] / n / 1000.0 if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form with averages in microseconds."""
        compute = sum(self.avg_us(f) for f in ("compute_input", "compute_infer", "compute_output"))
        return {
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "success_count": self.count["success"],
            "avg_request_us": self.avg_us("success"),
            "avg_queue_us": self.avg_us("queue"),
            "avg_compute_input_us": self.avg_us("compute_input"),
            "avg_compute_infer_us": self.avg_us("compute_infer"),
            "avg_compute_output_us": self.avg_us("compute_output"),
            "avg_overhead_us": max(0.0, self.avg_us("success") - self.avg_us("queue") - compute),
        }


@dataclass
class Measurement:
    """One window, or several merged: client latencies (sorted, ns) and counters."""

    duration_ns: int
    latencies: np.ndarray
    batch_size: int
    sequences: int = 0
    delayed: int = 0
    responses: int = 0
    send_ns: int = 0
    recv_ns: int = 0
    completed: int = 0
    sent: int = 0
    cpu_ns: int = 0
    server: ServerStats | None = None

    @property
    def request_count(self) -> int:
        """Requests that completed inside the window(s)."""
        return len(self.latencies)

    @property
    def infer_per_sec(self) -> float:
        """Inferences (requests x batch size) per second."""
        return self.request_count * self.batch_size / (self.duration_ns / 1e9) if self.duration_ns else 0.0

    def percentile_ns(self, p: float) -> int:
        """perf_analyzer's percentile: the sorted sample at index round(p/100 * (n-1))."""
        n = len(self.latencies)
        return int(self.latencies[int(p / 100.0 * (n - 1) + 0.5)]) if n else 0

    @property
    def avg_ns(self) -> float:
        """Mean latency in ns."""
        return float(self.latencies.mean()) if len(self.latencies) else 0.0

    @property
    def std_ns(self) -> float:
        """Sample standard deviation of latency in ns."""
        return float(self.latencies.std(ddof=1)) if len(self.latencies) > 1 else 0.0


def merge(parts: Iterable[Measurement]) -> Measurement:
    """Several windows as one measurement (latencies pooled, counters and server deltas summed)."""
    items = list(parts)
    server: ServerStats | None = None
    if all(m.server is not None for m in items):
        server = ServerStats()
        for m in items:
            assert m.server is not None
            server = server.combine(m.server, 1)
    return Measurement(
        duration_ns=sum(m.duration_ns for m in items),
        latencies=np.sort(np.concatenate([m.latencies for m in items])),
        batch_size=items[0].batch_size,
        sequences=sum(m.sequences for m in items),
        delayed=sum(m.delayed for m in items),
        responses=sum(m.responses for m in items),
        send_ns=sum(m.send_ns for m in items),
        recv_ns=sum(m.recv_ns for m in items),
        completed=sum(m.completed for m in items),
        sent=sum(m.sent for m in items),
        cpu_ns=sum(m.cpu_ns for m in items),
        server=server,
    )


@dataclass
class LevelResult:
    """The outcome of profiling one concurrency or request-rate level."""

    mode: str
    level: float
    stable: bool
    merged: Measurement
    window_rates: list[float]
    percentile: int | None = None
    over_latency_threshold: bool = False
    unstable_reason: str = ""

    @property
    def stabilizing_latency_ns(self) -> float:
        """The latency the stability rule used (the --percentile value, else the average)."""
        return float(self.merged.percentile_ns(self.percentile)) if self.percentile else self.merged.avg_ns


def _stabilizing(m: Measurement, percentile: int | None) -> float:
    if not m.request_count:
        return math.inf
    return float(m.percentile_ns(percentile)) if percentile else m.avg_ns


def is_stable(windows: list[Measurement], threshold: float, percentile: int | None) -> bool:
    """perf_analyzer's rule over the last 3 windows: max/min <= 1 + threshold for rate and latency."""
    if len(windows) < STABILITY_WINDOWS:
        return False
    last = windows[-STABILITY_WINDOWS:]
    rates = [w.infer_per_sec for w in last]
    lats = [_stabilizing(w, percentile) for w in last]
    if min(rates) <= 0 or any(math.isinf(x) for x in lats) or min(lats) <= 0:
        return False
    return max(rates) / min(rates) <= 1 + threshold and max(lats) / min(lats) <= 1 + threshold


def instability_reason(windows: list[Measurement], threshold: float, percentile: int | None) -> str:
    """Why the last 3 windows are not stable, in words ('' when they are), e.g. 'throughput varied 31 % ...'."""
    last = windows[-STABILITY_WINDOWS:]
    if len(last) < STABILITY_WINDOWS:
        return f"only {len(last)} of the {STABILITY_WINDOWS} windows needed were measured"
    if any(not w.request_count for w in last):
        return "a window completed no request (a stalled server, or -p shorter than one request)"
    allowed = f"more than the {threshold * 100:g} % allowed (-s)"
    name = f"p{percentile} latency" if percentile else "average latency"
    parts = []
    for what, values, unit in (
        ("throughput", [w.infer_per_sec for w in last], "infer/s"),
        (name, [_stabilizing(w, percentile) / 1000.0 for w in last], "usec"),
    ):
        spread = max(values) / min(values) - 1 if min(values) > 0 else math.inf
        if spread > threshold:
            parts.append(f"{what} varied {spread * 100:.0f} % ({min(values):.0f}-{max(values):.0f} {unit})")
    if not parts:
        return ""
    return " and ".join(parts) + f" over the last {STABILITY_WINDOWS} windows, " + allowed


Progress = Callable[[str], None]
StatsFn = Callable[[], "ServerStats | None"]


class Profiler:
    """Measures levels on an engine, window by window, until stable or out of trials."""

    def __init__(
        self,
        engine: Engine,
        stats_fn: StatsFn,
        *,
        mode: str,
        batch_size: int = 1,
        window_ms: int = 5000,
        stability: float = 0.10,
        max_trials: int = 10,
        percentile: int | None = None,
        latency_threshold_ms: float = 0.0,
        progress: Progress | None = None,
        on_window: Callable[[int, Measurement], None] | None = None,
    ) -> None:
        self.engine = engine
        self.stats_fn = stats_fn
        self.mode = mode
        self.batch_size = batch_size
        self.window_ms = window_ms
        self.stability = stability
        self.max_trials = max_trials
        self.percentile = percentile
        self.latency_threshold_ms = latency_threshold_ms
        self.progress = progress
        self.on_window = on_window
        self._pending = np.empty((0, 3), dtype=np.int64)
        self._last: Collected | None = None

    def _check(self) -> None:
        err = self.engine.error()
        if err:
            raise LoadError(err)

    def _wait(self, seconds: float, label: str) -> None:
        """Sleep through a window, failing fast on request errors and refreshing the progress line."""
        deadline = time.monotonic() + seconds
        while True:
            self._check()
            left = deadline - time.monotonic()
            if self.progress is not None:
                done = 1.0 - max(0.0, left) / seconds
                bar = "#" * int(done * 20)
                self.progress(f"{label} [{bar:<20}]")
            if left <= 0:
                return
            time.sleep(min(0.25, left))

    def begin(self, level: float) -> None:
        """Switch the engine to `level` and reset the window bookkeeping."""
        self.engine.set_level(level)
        self._last = self.engine.take()
        self._check()
        self._pending = np.empty((0, 3), dtype=np.int64)

    def measure_window(self, window_start: int, server_before: ServerStats | None, label: str) -> Measurement:
        """Wait one window and summarize the requests that completed in it."""
        self._wait(self.window_ms * 1.2 / 1000.0, label)
        window_end = now_ns()
        server_after = self.stats_fn()
        got = self.engine.take()
        if got.error:
            raise LoadError(got.error)
        prev = self._last if self._last is not None else Collected(np.empty((0, 3), dtype=np.int64))
        self._last = got
        records = np.concatenate([self._pending, got.records]) if len(self._pending) else got.records
        ends = records[:, 1]
        inside = (ends >= window_start) & (ends <= window_end)
        self._pending = records[ends > window_end]
        valid = records[inside]
        flags = valid[:, 2]
        server = None
        if server_before is not None and server_after is not None:
            server = server_after.combine(server_before, -1)
        return Measurement(
            duration_ns=window_end - window_start,
            latencies=np.sort(valid[:, 1] - valid[:, 0]),
            batch_size=self.batch_size,
            sequences=int(np.count_nonzero(flags & FLAG_SEQUENCE_END)),
            delayed=int(np.count_nonzero(flags & FLAG_DELAYED)),
            responses=int((flags >> RESPONSES_SHIFT).sum()),
            send_ns=got.send_ns - prev.send_ns,
            recv_ns=got.recv_ns - prev.recv_ns,
            completed=got.completed - prev.completed,
            sent=got.sent - prev.sent,
            cpu_ns=got.cpu_ns - prev.cpu_ns,
            server=server,
        )

    def measure_once(self, level: float, warmup_s: float, label: str) -> Measurement:
        """Load `level`, warm up, measure one window, then stop the load (compare mode)."""
        self.begin(level)
        self._wait(warmup_s, f"{label} (warm-up)")
        self._last = self.engine.take()
        self._pending = np.empty((0, 3), dtype=np.int64)
        try:
            return self.measure_window(now_ns(), self.stats_fn(), label)
        finally:
            self.engine.set_level(0)

    def profile(self, level: float) -> LevelResult:
        """Measure one level until 3 consecutive windows are stable (or max_trials windows passed)."""
        self.begin(level)
        windows: deque[Measurement] = deque(maxlen=STABILITY_WINDOWS)
        rates: list[float] = []
        stable = False
        over = False
        server_before = self.stats_fn()
        window_start = now_ns()
        name = "concurrency" if self.mode == "concurrency" else "request rate"
        for trial in range(self.max_trials):
            last = f" last {rates[-1]:.1f} infer/s" if rates else ""
            w = self.measure_window(window_start, server_before, f"{name} {level:g}: window {trial + 1}{last}")
            window_start += w.duration_ns
            server_before = server_before.combine(w.server, 1) if server_before and w.server else self.stats_fn()
            windows.append(w)
            rates.append(w.infer_per_sec)
            if self.on_window is not None:
                self.on_window(trial, w)
            stable = is_stable(list(windows), self.stability, self.percentile)
            if self.latency_threshold_ms > 0 and len(windows) == STABILITY_WINDOWS:
                limit = self.latency_threshold_ms * 1e6
                over = all(_stabilizing(x, self.percentile) >= limit for x in windows)
            if stable or over:
                break
        reason = "" if stable else instability_reason(list(windows), self.stability, self.percentile)
        return LevelResult(self.mode, level, stable, merge(windows), rates, self.percentile, over, reason)

    def sweep(self, levels: Iterable[float], allow_unstable: bool = False) -> tuple[list[LevelResult], str | None]:
        """Profile levels in order; stop (returning why) at an unstable level or the latency limit."""
        results: list[LevelResult] = []
        for level in levels:
            r = self.profile(level)
            if r.over_latency_threshold:
                return results, f"measured latency went over the set limit of {self.latency_threshold_ms:g} msec"
            if not r.stable and not allow_unstable:
                return results, (
                    f"failed to obtain stable measurement within {self.max_trials} measurement windows for "
                    f"{'concurrency' if self.mode == 'concurrency' else 'request rate'} {level:g}: "
                    f"{r.unstable_reason}; try a longer -p, a larger -s or -r, or --allow-unstable"
                )
            results.append(r)
        return results, None
