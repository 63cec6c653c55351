"""pb_utils.MetricFamily and pb_utils.Metric: Triton's custom-metrics API for Python models.

Creating a family or a metric, and reading a value, ask the server (a round trip, as in Triton); increments,
sets and observations are checked here and queued, then sent in batches (after each execute, before a round
trip, and by a background flusher) so a model can update metrics per request without a frame per update.
The server keeps the values and exports them on the metrics endpoint. `sink` is installed by the worker.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections import deque
from typing import Any

from service.worker.pb_utils.errors import TritonModelException

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
_INCREMENT, _SET, _OBSERVE, _DELETE, _FAMILY_DELETE = 0, 1, 2, 3, 4  # ipc.METRIC_* op codes
_KIND_NAMES = {COUNTER: "COUNTER", GAUGE: "GAUGE", HISTOGRAM: "HISTOGRAM"}
_CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' object "
    "should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


class MetricsSink:
    """Where metric requests go: `call` (answered) and `post` (batched); the worker installs a real one."""

    def __init__(self) -> None:
        self.ops: deque[tuple[int, int, float]] = deque()

    def call(self, op: str, **fields: Any) -> Any:
        """Send a request (with the queued updates) and return the reply; raises RuntimeError on refusal."""
        raise RuntimeError("custom metrics are only available in a model loaded by the server")

    def post(self, op: int, handle: int, value: float) -> None:
        """Queue one operation (thread-safe, no lock: deque.append is atomic; safe from __del__)."""
        self.ops.append((op, handle, value))

    def update(self, op: int, handle: int, value: float) -> None:
        """A value update the model made: the server must hold it before the call returns (a model that reads
        /metrics next sees it, as in Triton); a worker's sink sends it at once."""
        self.post(op, handle, value)

    def take(self) -> list[tuple[int, int, float]]:
        """Remove and return the queued updates, oldest first."""
        ops = []
        with contextlib.suppress(IndexError):
            while True:
                ops.append(self.ops.popleft())
        return ops


class _State:
    """Where metric requests go: the calling thread's sink (in-process instances: one per instance thread),
    else the process's (a worker process has one instance); installed by the worker."""

    def __init__(self) -> None:
        self.default = MetricsSink()
        self.local = threading.local()

    @property
    def sink(self) -> MetricsSink:
        """The sink of the calling thread."""
        return getattr(self.local, "sink", None) or self.default


state = _State()


_CALL_ERRORS = {
    "family": "Error when creating MetricFamily: ",
    "metric": "Error when creating Metric: ",
    "value": "Failed to get metric value: ",
}


def _error(message: str) -> Exception:
    return TritonModelException(message)


def _call(op: str, sink: MetricsSink | None = None, **fields: Any) -> Any:
    try:
        return (sink or state.sink).call(op, **fields)
    except RuntimeError as e:
        raise _error(_CALL_ERRORS[op] + str(e)) from None


class Metric:
    """One metric of a family (fixed labels); created with MetricFamily.Metric()."""

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None, buckets: list[float] | None) -> None:
        self._kind = family.kind
        self._cleared = False
        self._handle = 0
        if labels is not None and not isinstance(labels, dict):
            raise _error("labels must be a dict of str to str")
        labels = {str(k): str(v) for k, v in (labels or {}).items()}
        if self._kind == HISTOGRAM:
            if buckets is None:
                raise _error("Error when creating Metric: Missing required buckets for histogram metric")
            values = [float(b) for b in buckets]
            if any(a >= b for a, b in itertools.pairwise(values)):
                raise _error("Error when creating Metric: histogram buckets must be in strictly increasing order")
            buckets = values
        else:
            buckets = None  # only histograms have buckets
        self._sink = family._sink  # the metric belongs to its family's instance, whichever thread uses it
        reply = _call("metric", self._sink, handle=family._handle, labels=labels, buckets=buckets)
        self._handle = reply.handle
        family._metrics.add(self)

    def _check(self, action: str) -> None:
        if self._cleared:
            raise _error(f"Failed to {action} metric value: {_CLEARED}")

    def increment(self, value: float) -> None:
        """Add `value` (counters: non-negative) to a counter or gauge."""
        self._check("increment")
        if self._kind == HISTOGRAM:
            raise _error("Failed to increment metric value: histogram metrics can only be observed")
        if self._kind == COUNTER and value < 0:
            raise _error("Failed to increment metric value: counter metrics cannot be decremented")
        self._sink.update(_INCREMENT, self._handle, float(value))

    def set(self, value: float) -> None:
        """Set a gauge."""
        self._check("set")
        if self._kind != GAUGE:
            raise _error(
                f"Failed to set metric value: set is only supported by GAUGE metrics, not {_KIND_NAMES[self._kind]}"
            )
        self._sink.update(_SET, self._handle, float(value))

    def observe(self, value: float) -> None:
        """Record one observation of a histogram."""
        self._check("observe")
        if self._kind != HISTOGRAM:
            raise _error(
                f"Failed to observe metric value: observe is only supported by HISTOGRAM metrics, not "
                f"{_KIND_NAMES[self._kind]}"
            )
        self._sink.update(_OBSERVE, self._handle, float(value))

    def value(self) -> float:
        """The current value, as the server holds it (every update made so far is applied first)."""
        self._check("get")
        if self._kind == HISTOGRAM:
            raise _error("Failed to get metric value: histogram metrics have no single value")
        return float(_call("value", self._sink, handle=self._handle).value)

    def _clear(self) -> None:
        if not self._cleared and self._handle:
            self._cleared = True
            with contextlib.suppress(Exception):
                self._sink.post(_DELETE, self._handle, 0.0)

    def __del__(self) -> None:
        self._clear()


class MetricFamily:
    """A named family of metrics of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._handle = 0
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        if kind not in _KIND_NAMES:
            raise _error(f"Error when creating MetricFamily: unknown metric kind {kind!r}")
        self.name = name
        self.description = description
        self.kind = kind
        self._sink = state.sink
        reply = _call("family", self._sink, name=str(name), description=str(description), kind=int(kind))
        self._handle = reply.handle

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        """A metric of this family with these labels (the same labels give the same underlying metric)."""
        return Metric(self, labels, buckets)

    def __del__(self) -> None:
        if not self._handle:
            return
        for metric in list(self._metrics):
            metric._clear()
        with contextlib.suppress(Exception):
            self._sink.post(_FAMILY_DELETE, self._handle, 0.0)


class Flusher:
    """A daemon thread that sends queued updates every `interval_s` (updates made outside execute())."""

    def __init__(self, flush: Any, interval_s: float = 0.25) -> None:
        self._flush = flush
        self._interval_s = interval_s
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="metrics-flusher", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(Exception):
                self._flush()

    def stop(self) -> None:
        """Stop the thread (the worker flushes once more itself)."""
        self._stop.set()
