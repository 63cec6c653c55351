"""Scheduler interface and the shared machinery: instance dispatch, per-request tracking, statistics.

A scheduler decides when, and with which other requests, a request runs on which model instance. Responses
reach the caller through `InferRequest.on_response`; schedulers wrap it once to record statistics.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from service.core.observability import trace_hooks
from service.core.observability.stats import BACKEND, CANCELED, OTHER, REJECTED, ModelStats
from service.core.scheduling.drain import DrainSignal
from service.core.scheduling.rate_limiter import RateLimiter
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool
from service.instances.process import WorkerProcess
from service.ipc import frames as ipc
from service.types import InferRequest, InferResponse


class TimerHandle(Protocol):
    """What Clock.call_later returns: something that can be cancelled."""

    def cancel(self) -> None:
        """Stop the timer from firing."""


class Clock(Protocol):
    """Time and timers for a scheduler; injectable so tests can drive time by hand."""

    def now_ns(self) -> int:
        """Monotonic time in ns (the same clock as InferRequest.arrival_ns)."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` on the event loop after `delay_s` seconds."""


class LoopClock:
    """The production clock: time.monotonic_ns and the running event loop's timers."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    # time.monotonic_ns itself (a builtin: no Python-level call per use, several per request)
    now_ns = staticmethod(time.monotonic_ns)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        """loop.call_later."""
        return self.loop.call_later(delay_s, callback)


class _Finished:
    """Stands in for a finished request inside its response wrapper (see Scheduler.track)."""

    arrival_ns = 0


_FINISHED: Any = _Finished()


class _Track:
    """Per-request bookkeeping a scheduler keeps in `InferRequest.context`."""

    __slots__ = ("dispatch_ns", "enqueue_ns", "error", "failed", "finished", "level", "responded", "state", "worker")

    def __init__(self) -> None:
        self.dispatch_ns = 0
        self.enqueue_ns = 0
        self.failed = False
        self.error: ServiceError | None = None  # the first error response (metrics: failure reason)
        self.responded = False  # a response (not a bare final flag) was delivered
        self.finished = False
        self.worker: WorkerProcess | None = None
        self.level = 0  # priority level index (dynamic batcher)
        self.state = 0  # queue state (dynamic batcher): 0 not queued, 1 queued, 2 delayed


# subclassed by interpreted classes (ensemble, sequence batcher) when compiled with mypyc
@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler(ABC):
    """Interface every scheduler implements (direct, dynamic, sequence, ensemble)."""

    stats: ModelStats

    @abstractmethod
    def enqueue(self, request: InferRequest) -> None:
        """Accept a validated request; its responses are delivered through request.on_response.

        Raises ServiceError when the request is rejected up front (queue full, sequence errors).
        """

    def cancel(self, request: InferRequest) -> None:  # noqa: B027 - optional
        """The client gave up on `request`: drop it if queued, flag it if running."""

    @property
    def ready(self) -> bool:
        """Whether the scheduler can run requests now."""
        return True

    def pending_count(self) -> int:
        """Requests accepted but not yet handed to an instance (read by the metrics endpoint)."""
        return 0

    def executing_count(self) -> int:
        """Requests handed to an instance and not yet done executing (read by the metrics endpoint)."""
        return 0

    async def stop(self) -> None:  # noqa: B027 - optional
        """Stop timers and background tasks (the pool is stopped by its owner)."""

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every request accepted so far has had its final response; False on timeout.

        Called once the version is out of routing (no new requests arrive), before `stop`.
        """
        return True


def failure_reason(track: _Track) -> int:
    """Why a tracked request failed, as nv_inference_request_failure's `reason` label (stats.FAILURE_REASONS)."""
    error = track.error
    if error is not None and error.code == ErrorCode.CANCELLED:
        return CANCELED
    if track.dispatch_ns:
        return BACKEND  # it ran: the model, its worker or its backend failed it
    if error is not None and error.message == "Request timeout expired":
        return REJECTED
    return OTHER


UNLOADING_MESSAGE = "model is being unloaded: request was still queued"


def error_response(request: InferRequest, code: ErrorCode, message: str) -> InferResponse:
    """A final error response for `request`."""
    return InferResponse(request.model_name, request.model_version, request.id, error=ServiceError(code, message))


@mypyc_attr(allow_interpreted_subclasses=True)
class InstanceScheduler(Scheduler):
    """Base for schedulers that run batches on an InstancePool: idle tracking, dispatch and statistics.

    Subclasses implement `enqueue` (put the request in their queue, then call `_pump`) and `_next_batch`
    (take the next batch to run from their queue, or None).

    `idle` holds free execution slots: each instance appears once per slot. With `depth` 2 (pipelining, used
    for unbatched models) an instance is handed its next batch while it still runs the current one, so it
    starts that batch the moment it finishes instead of waiting for the server to see ExecDone and send more.
    An instance that has made BLS calls keeps one slot (a nested request must never queue behind its caller).
    """

    depth = 1

    def __init__(self, pool: InstancePool, stats: ModelStats, clock: Clock | None = None) -> None:
        self.pool = pool
        self.stats = stats
        self.idle: deque[WorkerProcess] = deque(w for _ in range(self.depth) for w in pool.workers)
        self.running: dict[WorkerProcess, deque[list[InferRequest]]] = {}
        self.outstanding = 0  # requests tracked and not yet answered finally (what drain() waits for)
        self._drain = DrainSignal()
        pool.on_available = self._on_available
        pool.on_lost = self._on_lost
        self.clock: Clock = clock if clock is not None else LoopClock(asyncio.get_running_loop())
        self.limiter: RateLimiter | None = None

    def use_rate_limiter(self, limiter: RateLimiter) -> None:
        """Run every batch through the server's rate limiter (called before the first request). No pipelining:
        an instance holds its resources for one execution at a time."""
        self.limiter = limiter
        self.depth = 1
        self.idle = deque(dict.fromkeys(self.idle))

    def leave_rate_limiter(self) -> None:
        """The version is being unloaded: the limiter forgets its instances; batches still staged are answered."""
        if self.limiter is not None:
            for staged in self.limiter.remove_model(self):
                for req in staged.batch:
                    self.reject(req, ErrorCode.UNAVAILABLE, UNLOADING_MESSAGE)
            self.limiter = None

    @property
    def ready(self) -> bool:
        return self.pool.ready

    # ---- hooks for subclasses ---------------------------------------------------------------------------
    @abstractmethod
    def _next_batch(self) -> list[InferRequest] | None:
        """Pop the next batch to execute, or None when nothing is ready to run."""

    def _pump(self) -> None:
        """Start batches while there are idle instances and ready work."""
        while self.idle:
            if not self._usable(self.idle[0]):
                self.idle.popleft()
                continue
            batch = self._next_batch()
            if not batch:
                return
            self._dispatch(self.idle.popleft(), batch)

    def _usable(self, worker: WorkerProcess) -> bool:
        """Whether an idle slot can take a batch: not when its instance died while idle (the pool restarts it
        and reports it available), nor a pipelined slot of an instance that makes BLS calls (its slot comes back
        when its running batch is done)."""
        return worker.alive and not (worker.uses_bls and worker in self.running)

    def _take_slot(self) -> WorkerProcess | None:
        """Pop a usable execution slot, or None."""
        while self.idle:
            worker = self.idle.popleft()
            if self._usable(worker):
                return worker
        return None

    # ---- request tracking ------------------------------------------------------------------------------
    def track(self, request: InferRequest) -> None:
        """Wrap request.on_response once to record end-to-end statistics."""
        track = _Track()
        request.context = track
        deliver = request.on_response
        stats = self.stats
        now_ns = self.clock.now_ns
        self.outstanding += 1
        first = stats.first_response_latency if stats.decoupled else None

        def on_response(response: InferResponse) -> None:
            nonlocal request
            if response.error is not None and not response.model_error and not track.failed:
                track.failed = True
                track.error = response.error
            if first is not None and not track.responded and not response.null:
                track.responded = True
                first.observe(now_ns() - request.arrival_ns)
            if response.final and not track.finished:
                track.finished = True
                self.outstanding -= 1
                if not self.outstanding and self._drain.waiter is not None:
                    self._drain.empty()
                if track.failed:
                    stats.record_end(False, now_ns() - request.arrival_ns, failure_reason(track))
                else:
                    stats.record_end(True, now_ns() - request.arrival_ns)
                # the request refers to this closure: dropping the closure's reference breaks the cycle, so a
                # finished request (and its tensors) is freed at once rather than by a later garbage collection
                request = _FINISHED
            if deliver is not None:
                deliver(response)

        request.on_response = on_response

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every tracked request has its final response (bounded by timeout_s)."""
        return await self._drain.wait(bool(self.outstanding), timeout_s)

    # ---- instance updates -------------------------------------------------------------------------------
    def add_worker(self, worker: WorkerProcess) -> None:
        """A new instance joins (instance-count update): it takes work at once."""
        self._on_available(worker)

    async def release_worker(self, worker: WorkerProcess, timeout_s: float) -> None:
        """An instance leaves (instance-count update): it gets no new batch from now on; what it runs finishes.

        Schedulers that bind work to an instance (sequences) wait here, up to timeout_s, until that work is done.
        """
        self._on_lost(worker)

    def reject(self, request: InferRequest, code: ErrorCode, message: str) -> None:
        """Answer a queued request with an error (timeouts, cancellation)."""
        if request.on_response is not None:
            request.on_response(error_response(request, code, message))

    # ---- dispatch --------------------------------------------------------------------------------------
    def _dispatch(self, worker: WorkerProcess, batch: list[InferRequest]) -> None:
        if self.limiter is not None:  # the limiter runs it when the instance's turn and resources come
            self.limiter.admit(self, worker, batch, self._run)
        else:
            self._run(worker, batch)

    def _run(self, worker: WorkerProcess, batch: list[InferRequest]) -> None:
        now = self.clock.now_ns()
        for req in batch:
            track: Any = req.context
            if track is not None:
                track.dispatch_ns = now
                track.worker = worker
            if req.stamps is not None:
                req.stamps.append(("dispatch", now))
        running = self.running.get(worker)
        if running is None:
            running = self.running[worker] = deque()
        running.append(batch)
        worker.execute(batch, self._on_done)

    def _on_done(self, worker: WorkerProcess, done: ipc.ExecDone | None) -> None:
        running = self.running.get(worker)
        batch = running.popleft() if running else []
        if self.limiter is not None:
            self.limiter.release(self, worker)
        if not running:
            self.running.pop(worker, None)
        else:  # a pipelined batch starts now: its queue time ends here, as if it had been dispatched now
            now = self.clock.now_ns()
            for req in running[0]:
                track: Any = req.context
                if track is not None:
                    track.dispatch_ns = now
        if done is not None and done.stamps:
            for req in batch:
                if req.stamps is not None:
                    req.stamps.extend((name, ns) for name, ns in done.stamps)
        if done is not None:
            if done.executed:
                self._record(batch, done)
            if worker.alive:
                missing = 1
                if worker.uses_bls:  # its pipelined slots were dropped in _pump: give back what is free now
                    missing = self.depth - len(self.running.get(worker, ())) - self.idle.count(worker)
                self.idle.extend([worker] * missing)
        self._pump()

    def _record(self, batch: list[InferRequest], done: ipc.ExecDone) -> None:
        size = ok = 0  # a loop, not sum(<generator>); nv_inference_count leaves out failed requests, as Triton's
        for r in batch:
            size += r.batch_size
            ok += r.batch_size if r.context is None or not r.context.failed else 0
        self.stats.record_execution(
            size, done.compute_input_ns, done.compute_infer_ns, done.compute_output_ns, inferences=ok
        )
        for req in batch:
            track: Any = req.context
            if req.trace is not None and track is not None:
                trace_hooks.computed(
                    req.trace, track.dispatch_ns, done.compute_input_ns, done.compute_infer_ns, done.compute_output_ns
                )
            if track is not None and not track.failed:
                self.stats.record_request(
                    track.dispatch_ns - req.arrival_ns,
                    done.compute_input_ns,
                    done.compute_infer_ns,
                    done.compute_output_ns,
                )

    def _on_available(self, worker: WorkerProcess) -> None:
        self.idle.extend(worker for _ in range(self.depth))
        self._pump()

    def _on_lost(self, worker: WorkerProcess) -> None:
        while worker in self.idle:
            self.idle.remove(worker)

    def executing_count(self) -> int:
        return sum(len(batches[0]) for batches in self.running.values() if batches)

    def handed_over_count(self) -> int:
        """Requests handed to a busy instance (pipelined) that have not started: pending, not executing."""
        return sum(len(batch) for batches in self.running.values() for batch in list(batches)[1:])

    def cancel_running(self, request: InferRequest) -> None:
        """Flag a running request as cancelled inside its worker."""
        track: Any = request.context
        if track is not None and track.worker is not None and track.worker.alive:
            track.worker.cancel([request])
