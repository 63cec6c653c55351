"""Prometheus metric families built at scrape time from the core's counters: Triton's names, labels and HELP
strings, plus Trireme's latency histograms, queue depth and instance restarts (docs/metrics.md).

Nothing here runs per request: schedulers and workers only bump plain ints in `stats.ModelStats` and
`InstancePool.restarts`; a scrape reads them and builds `prometheus_client` Metric objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from protos import model_config_pb2 as mc
from service.core.observability.stats import FAILURE_REASONS, LatencyHistogram, ModelStats
from service.core.observability.summaries import DEFAULT_QUANTILES, parse_quantiles


class ModelVersionView(Protocol):
    """What a scrape reads of a model version (the repository's ModelVersion; observability sits below it)."""

    stats: ModelStats
    config: mc.ModelConfig

    @property
    def decoupled(self) -> bool: ...
    @property
    def scheduler(self) -> Any: ...  # a Scheduler or None (pending_count, instance gauges)
    @property
    def pool(self) -> Any: ...  # an InstancePool or None (restarts)


# (labels, model version) of every READY version, sorted by model name and version
VersionList = Sequence[tuple[dict[str, str], ModelVersionView]]

log = logging.getLogger("trireme.metrics")

_DURATION_COUNTERS = (
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached "
     "requests)", "success"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached "
     "requests)", "queue"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include "
     "cached requests)", "compute_input"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not "
     "include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does "
     "not include cached requests)", "compute_output"),
)  # fmt: skip
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", "cache_hit", "ns"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     "cache_miss", "ns"),
)  # fmt: skip
_SUMMARIES = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached "
     "requests)", "request", "success"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached "
     "requests)", "queue", "queue"),
    ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include "
     "cached requests)", "compute_input", "compute_input"),
    ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not "
     "include cached requests)", "compute_infer", "compute_infer"),
    ("nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does "
     "not include cached requests)", "compute_output", "compute_output"),
)  # fmt: skip
_HISTOGRAMS = (
    ("trireme_request_duration_seconds", "End-to-end duration of successful inference requests, in seconds",
     "request_latency"),
    ("trireme_queue_duration_seconds", "Time requests waited in the scheduler before an instance took them, in "
     "seconds", "queue_latency"),
    ("trireme_compute_duration_seconds", "Compute time per request (input + infer + output), in seconds",
     "compute_latency"),
)  # fmt: skip


@dataclass(slots=True)
class MetricsConfig:
    """--metrics-config settings (Triton's keys) and the other metrics flags."""

    counter_latencies: bool = True  # the nv_inference_*_duration_us counters
    summary_latencies: bool = False  # nv_inference_*_summary_us
    summary_quantiles: list[tuple[float, float]] = field(default_factory=lambda: list(DEFAULT_QUANTILES))
    histogram_latencies: bool = False  # nv_inference_first_response_histogram_ms (decoupled models)
    trireme_histograms: bool = True  # trireme_*_duration_seconds histograms
    interval_ms: int = 2000  # how often CPU/GPU gauges are sampled
    cpu_metrics: bool = True
    gpu_metrics: bool = True


def parse_metrics_config(entries: list[str], config: MetricsConfig | None = None) -> MetricsConfig:
    """Apply `key=value` entries of --metrics-config; unknown keys and bad values only warn (as Triton logs)."""
    config = config or MetricsConfig()
    for entry in entries:
        key, sep, value = entry.partition("=")
        key, value = key.strip(), value.strip().strip('"')
        if not sep:
            log.warning("ignoring --metrics-config '%s': expected <setting>=<value>", entry)
        elif key in ("counter_latencies", "summary_latencies", "histogram_latencies", "trireme_histograms"):
            if value.lower() not in ("true", "false"):
                log.warning("ignoring --metrics-config %s=%s: expected true or false", key, value)
            else:
                setattr(config, key, value.lower() == "true")
        elif key == "summary_quantiles":
            quantiles = parse_quantiles(value)
            if quantiles:
                config.summary_quantiles = quantiles
            else:
                log.warning("ignoring --metrics-config summary_quantiles=%s: expected q:error[,q:error...]", value)
        else:
            log.warning("ignoring unsupported --metrics-config setting '%s'", key)
    return config


def _metric(name: str, doc: str, kind: str) -> Metric:
    return Metric(name, doc, kind)


def add_histogram(
    metric: Metric, labels: dict[str, str], histogram: LatencyHistogram, divisor: float = 1e9, bound_scale: float = 1.0
) -> None:
    """Samples of one histogram series: cumulative buckets (le), _count and _sum (ns / `divisor`)."""
    cumulative = histogram.cumulative()
    for bound, count in cumulative:
        le = "+Inf" if bound == float("inf") else bound_text(bound * bound_scale)
        metric.add_sample(metric.name + "_bucket", {**labels, "le": le}, count)
    metric.add_sample(metric.name + "_count", labels, cumulative[-1][1])
    metric.add_sample(metric.name + "_sum", labels, histogram.sum_ns / divisor)


def bound_text(bound: float) -> str:
    """A bucket bound as Triton (prometheus-cpp) prints it: 1 not 1.0, 0.25 as is."""
    rounded = round(bound, 9)
    return str(int(rounded)) if rounded.is_integer() else repr(rounded)


class CoreCollector:
    """A prometheus_client Collector over every READY model version (`ready_versions`: the repository's)."""

    def __init__(
        self,
        ready_versions: Callable[[], VersionList],
        config: MetricsConfig,
        system: Any = None,
        cache_enabled: bool = False,
        cache_failures: Callable[[], int] | None = None,
    ) -> None:
        self.ready_versions = ready_versions
        self.config = config
        self.system = system  # SystemSampler (CPU/GPU gauges) or None
        self.cache_enabled = cache_enabled  # the server has a response cache (--cache-config)
        self.cache_failures = cache_failures  # failed operations of a Redis response cache

    def versions(self) -> VersionList:
        """(labels, model version) of every READY version, sorted by model name and version."""
        return self.ready_versions()

    def collect(self) -> Iterator[Metric]:
        """Every family, in Triton's order, then Trireme's."""
        config = self.config
        versions = self.versions()

        def counter(name: str, doc: str, value: Callable[[ModelStats], float]) -> Metric:
            m = _metric(name, doc, "counter")
            for labels, mv in versions:
                m.add_sample(name, labels, value(mv.stats))
            return m

        yield counter(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            lambda s: s.success.count,
        )
        failure = _metric(
            "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter"
        )
        for labels, mv in versions:
            for index, reason in enumerate(FAILURE_REASONS):
                failure.add_sample(failure.name, {**labels, "reason": reason}, mv.stats.failures[index])
        yield failure
        yield counter(
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            lambda s: s.inference_count,
        )
        yield counter(
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            lambda s: s.execution_count,
        )
        if config.counter_latencies:
            for name, doc, attr in _DURATION_COUNTERS:
                yield counter(name, doc, lambda s, a=attr: getattr(s, a).ns // 1000)  # type: ignore[misc]
            cached = [(labels, mv) for labels, mv in versions if mv.config.response_cache.enable]
            if self.cache_enabled and cached:
                for name, doc, attr, field_name in _CACHE_COUNTERS:
                    m = _metric(name, doc, "counter")
                    for labels, mv in cached:
                        value = getattr(getattr(mv.stats, attr), field_name)
                        m.add_sample(name, labels, value // 1000 if field_name == "ns" else value)
                    yield m
        pending = _metric(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            "gauge",
        )
        for labels, mv in versions:
            pending.add_sample(pending.name, labels, mv.scheduler.pending_count() if mv.scheduler else 0)
        yield pending
        load = _metric("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        for labels, mv in versions:
            load.add_sample(load.name, labels, mv.stats.load_duration_s)
        yield load
        if config.histogram_latencies:
            first = _metric(
                "nv_inference_first_response_histogram_ms",
                "Duration from request to first response in milliseconds",
                "histogram",
            )
            for labels, mv in versions:
                if mv.decoupled:
                    add_histogram(first, labels, mv.stats.first_response_latency, 1e6, 1000.0)
            yield first
        if self.system is not None:
            yield from self.system.collect()
        if config.summary_latencies:
            yield from self._summaries(versions)
        yield from self._trireme(versions)

    def _summaries(self, versions: VersionList) -> Iterator[Metric]:
        for name, doc, phase, attr in _SUMMARIES:
            m = _metric(name, doc, "summary")
            for labels, mv in versions:
                window = mv.stats.summaries
                if window is None:
                    continue
                total = getattr(mv.stats, attr)
                m.add_sample(name + "_count", labels, total.count)
                m.add_sample(name + "_sum", labels, total.ns // 1000)
                for q, value in window.quantiles(phase, self.config.summary_quantiles):
                    m.add_sample(name, {**labels, "quantile": bound_text(q)}, value)
            yield m

    def _trireme(self, versions: VersionList) -> Iterator[Metric]:
        if self.config.trireme_histograms:
            for name, doc, attr in _HISTOGRAMS:
                m = _metric(name, doc, "histogram")
                for labels, mv in versions:
                    add_histogram(m, labels, getattr(mv.stats, attr))
                yield m
            first = _metric(
                "trireme_first_response_duration_seconds",
                "Time from a request's arrival to its first response (decoupled models), in seconds",
                "histogram",
            )
            for labels, mv in versions:
                if mv.decoupled:
                    add_histogram(first, labels, mv.stats.first_response_latency)
            yield first
        depth = _metric(
            "trireme_queue_depth",
            "Requests accepted by the model and not done executing yet (queued or executing)",
            "gauge",
        )
        for labels, mv in versions:
            s = mv.scheduler
            depth.add_sample(depth.name, labels, s.pending_count() + s.executing_count() if s else 0)
        yield depth
        restarts = _metric(
            "trireme_instance_restarts_total",
            "Model instances (worker processes) restarted after they exited unexpectedly",
            "counter",
        )
        for labels, mv in versions:
            restarts.add_sample(restarts.name, labels, mv.pool.restarts if mv.pool is not None else 0)
        yield restarts
        if self.cache_failures is not None:
            failures = _metric(
                "trireme_cache_failures_total",
                "Operations of the Redis response cache that failed (those requests were served as misses)",
                "counter",
            )
            failures.add_sample(failures.name, {}, self.cache_failures())
            yield failures
