"""Custom metrics of Python models (pb_utils.MetricFamily / Metric), kept by the server and exported on /metrics.

Models talk to this registry over their worker's control channel (ipc.MetricCall for what needs an answer,
ipc.MetricUpdate for batched increments/sets/observations). As in Triton, a family is identified by its name
(a second family of the same name and kind shares it, keeping the first description; another kind is an
error) and a metric by its family and labels (two Metric objects with the same labels share one value).
Families and metrics are reference counted per worker; references of workers that exited are dropped.
"""

from __future__ import annotations

import itertools
import logging
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prometheus_client.metrics_core import Metric as PromMetric

from service.ipc import frames as ipc

log = logging.getLogger("trireme.metrics")

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
RESERVED_PREFIXES = ("nv_", "trireme_")  # the server's own families


class MetricsError(Exception):
    """A custom-metric request the registry refuses (the model sees it as TritonModelException)."""


@dataclass(slots=True, eq=False)
class _Series:
    """One metric: a family member with fixed labels."""

    family: _Family
    labels: dict[str, str]
    buckets: tuple[float, ...] = ()
    value: float = 0.0  # counter / gauge
    counts: list[int] = field(default_factory=list)  # histogram: per bucket, +Inf last
    total: float = 0.0  # histogram sum
    refs: int = 0
    handle: int = 0


@dataclass(slots=True, eq=False)
class _Family:
    name: str
    description: str
    kind: int
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)
    refs: int = 0
    handle: int = 0


@dataclass(slots=True)
class _Owner:
    """What one worker holds: handle -> reference count."""

    families: dict[int, int] = field(default_factory=dict)
    series: dict[int, int] = field(default_factory=dict)


class CustomMetrics:
    """The registry (one per server) and the message handlers it installs on every worker."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}
        self._family_ids: dict[int, _Family] = {}
        self._series_ids: dict[int, _Series] = {}
        self._handles = itertools.count(1)
        self._owners: dict[Any, _Owner] = {}  # WorkerProcess -> what it references

    # ---- wiring ---------------------------------------------------------------------------------------
    def attach(self, worker: Any) -> None:
        """Install the metric message handlers on a new worker (RepositoryOptions.attach_worker)."""
        worker.message_handlers[ipc.MetricCall] = partial(self._on_call, worker)
        worker.message_handlers[ipc.MetricUpdate] = partial(self._on_update, worker)

    def _on_call(self, worker: Any, call: ipc.MetricCall) -> None:
        reply = ipc.MetricReply(call.id)
        try:
            self.apply(worker, call.ops)
            if call.op == "family":
                reply.handle = self.new_family(worker, call.name, call.description, call.kind)
            elif call.op == "metric":
                reply.handle = self.new_metric(worker, call.handle, call.labels, call.buckets)
            elif call.op == "value":
                reply.value = self.value(call.handle)
            else:
                raise MetricsError(f"unknown metric request '{call.op}'")
        except MetricsError as e:
            reply.error = str(e)
        try:
            worker.send(reply)
        except Exception:  # the worker is gone: nobody waits for the reply
            log.debug("metric reply to '%s' not sent", worker.spec.instance_name, exc_info=True)

    def _on_update(self, worker: Any, update: ipc.MetricUpdate) -> None:
        try:
            self.apply(worker, update.ops)
        except MetricsError as e:  # the model checked these already; a stale handle is not worth a crash
            log.warning("ignoring custom metric update from '%s': %s", worker.spec.instance_name, e)

    # ---- operations -----------------------------------------------------------------------------------
    def new_family(self, owner: Any, name: str, description: str, kind: int) -> int:
        """Create (or share) the family `name`; returns its handle."""
        if kind not in KIND_NAMES:
            raise MetricsError(f"unknown metric kind {kind}")
        if not _NAME.fullmatch(name):
            raise MetricsError(f"invalid metric family name '{name}'")
        if name.startswith(RESERVED_PREFIXES):
            raise MetricsError(f"metric family name '{name}' is reserved for the server's own metrics")
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _Family(name, description, kind, handle=next(self._handles))
            self._family_ids[family.handle] = family
        elif family.kind != kind:
            raise MetricsError(
                f"metric family '{name}' already exists with kind {KIND_NAMES[family.kind]}, not {KIND_NAMES[kind]}"
            )
        handle = family.handle
        family.refs += 1
        refs = self._owner(owner).families
        refs[handle] = refs.get(handle, 0) + 1
        return handle

    def new_metric(self, owner: Any, family_handle: int, labels: dict[str, str], buckets: list[float] | None) -> int:
        """Create (or share) the metric of a family with these labels; returns its handle."""
        family = self._family_ids.get(family_handle)
        if family is None:
            raise MetricsError("the metric family no longer exists")
        for label in labels:
            if not _LABEL.fullmatch(label) or label.startswith("__"):
                raise MetricsError(f"invalid label name '{label}'")
        bounds: tuple[float, ...] = ()
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise MetricsError("Missing required buckets for histogram metric")
            bounds = tuple(float(b) for b in buckets)
            if any(b >= c for b, c in itertools.pairwise(bounds)):
                raise MetricsError("histogram buckets must be in strictly increasing order")
        key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        series = family.series.get(key)
        if series is None:
            series = _Series(family, dict(key), bounds, counts=[0] * (len(bounds) + 1), handle=next(self._handles))
            family.series[key] = series
            self._series_ids[series.handle] = series
        elif series.buckets != bounds and family.kind == HISTOGRAM:
            raise MetricsError(f"a metric of family '{family.name}' with these labels already has other buckets")
        handle = series.handle
        series.refs += 1
        refs = self._owner(owner).series
        refs[handle] = refs.get(handle, 0) + 1
        return handle

    def value(self, handle: int) -> float:
        """The current value of a counter or gauge."""
        series = self._series(handle)
        if series.family.kind == HISTOGRAM:
            raise MetricsError("histogram metrics have no single value")
        return series.value

    def apply(self, owner: Any, ops: list[tuple[int, int, float]]) -> None:
        """Apply batched updates in order (kinds were checked by the model already)."""
        for op, handle, value in ops:
            if op == ipc.METRIC_DELETE:
                self._release_series(owner, handle)
            elif op == ipc.METRIC_FAMILY_DELETE:
                self._release_family(owner, handle)
            else:
                series = self._series(handle)
                if op == ipc.METRIC_INCREMENT:
                    series.value += value
                elif op == ipc.METRIC_SET:
                    series.value = value
                elif op == ipc.METRIC_OBSERVE:
                    series.counts[bisect_left(series.buckets, value)] += 1
                    series.total += value

    def _series(self, handle: int) -> _Series:
        series = self._series_ids.get(handle)
        if series is None:
            raise MetricsError("the metric no longer exists")
        return series

    def _owner(self, worker: Any) -> _Owner:
        owner = self._owners.get(worker)
        if owner is None:
            owner = self._owners[worker] = _Owner()
        return owner

    def _release_series(self, worker: Any, handle: int, count: int = 1) -> None:
        owner = self._owners.get(worker)
        if owner is None or owner.series.get(handle, 0) < count:
            return
        owner.series[handle] -= count
        if not owner.series[handle]:
            del owner.series[handle]
        series = self._series_ids.get(handle)
        if series is None:
            return
        series.refs -= count
        if series.refs <= 0:
            del self._series_ids[handle]
            series.family.series.pop(tuple(sorted(series.labels.items())), None)

    def _release_family(self, worker: Any, handle: int, count: int = 1) -> None:
        owner = self._owners.get(worker)
        if owner is None or owner.families.get(handle, 0) < count:
            return
        owner.families[handle] -= count
        if not owner.families[handle]:
            del owner.families[handle]
        family = self._family_ids.get(handle)
        if family is None:
            return
        family.refs -= count
        if family.refs <= 0:
            del self._family_ids[handle]
            self.families.pop(family.name, None)
            for series in family.series.values():
                self._series_ids.pop(series.handle, None)

    def drop_exited(self) -> None:
        """Release everything held by workers whose process has exited (unloaded, or crashed and replaced)."""
        for worker in [w for w in self._owners if w.exited]:
            owner = self._owners[worker]
            for handle, count in list(owner.series.items()):
                self._release_series(worker, handle, count)
            for handle, count in list(owner.families.items()):
                self._release_family(worker, handle, count)
            del self._owners[worker]

    # ---- export ---------------------------------------------------------------------------------------
    def collect(self) -> Iterator[PromMetric]:
        """One prometheus_client Metric per family with at least one metric."""
        from service.core.observability.metrics import bound_text

        self.drop_exited()
        for family in self.families.values():
            m = PromMetric(family.name, family.description, KIND_NAMES[family.kind])
            for series in family.series.values():
                if family.kind != HISTOGRAM:
                    m.add_sample(family.name, series.labels, series.value)
                    continue
                total = 0
                for bound, n in zip((*series.buckets, float("inf")), series.counts, strict=True):
                    total += n
                    le = "+Inf" if bound == float("inf") else bound_text(bound)
                    m.add_sample(family.name + "_bucket", {**series.labels, "le": le}, total)
                m.add_sample(family.name + "_count", series.labels, total)
                m.add_sample(family.name + "_sum", series.labels, series.total)
            yield m
