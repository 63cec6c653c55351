"""DynamicBatcher: Triton's dynamic batching (preferred sizes, queue delay, priorities, queue policies).

Semantics follow Triton's dynamic batcher (docs/batching.md). Batches form only when an instance is idle; one
loop timer per batcher wakes it for the queue delay or the nearest request timeout (no per-request timers or wait_for).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any

from protos import model_config_pb2 as mc
from service.core.observability.stats import ModelStats
from service.core.scheduling.drain import DrainSignal
from service.core.scheduling.queue_policy import PriorityQueues
from service.core.scheduling.scheduler import UNLOADING_MESSAGE, Clock, InstanceScheduler, TimerHandle
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool
from service.types import InferRequest, InferResponse, ResponseCallback

NOT_QUEUED, QUEUED, DELAYED = 0, 1, 2
TIMEOUT_MESSAGE = "Request timeout expired"
CANCELLED_MESSAGE = "request cancelled by the client"


class _OrderSlot:
    """Responses of one request held back until every earlier request has finished (preserve_ordering)."""

    __slots__ = ("deliver", "done", "held")

    def __init__(self, deliver: ResponseCallback | None) -> None:
        self.deliver = deliver
        self.held: list[InferResponse] = []
        self.done = False


class DynamicBatcher(InstanceScheduler):
    """Gathers queued requests into batches for models with `dynamic_batching`."""

    def __init__(
        self, pool: InstancePool, stats: ModelStats, config: mc.ModelConfig, clock: Clock | None = None
    ) -> None:
        super().__init__(pool, stats, clock)
        db = config.dynamic_batching
        self.batching = config.max_batch_size > 0
        self.max_batch_size = max(1, config.max_batch_size)
        preferred = sorted({s for s in db.preferred_batch_size if 0 < s <= self.max_batch_size})
        self.preferred = frozenset(preferred or [self.max_batch_size])
        self.max_preferred = max(self.preferred)
        self.delay_ns = db.max_queue_delay_microseconds * 1000
        self.preserve_ordering = db.preserve_ordering
        self.queues = PriorityQueues(db)
        # inputs whose shapes must match across a batch: any variable dim and no ragged batching
        self.equal_shape_inputs = frozenset(
            t.name for t in config.input if any(d < 0 for d in t.dims) and not t.allow_ragged_batch
        )
        self.has_optional_inputs = any(t.optional for t in config.input)
        self._check_inputs = bool(self.equal_shape_inputs) or self.has_optional_inputs
        self._deadlines: list[tuple[int, int, InferRequest]] = []
        self._seq = itertools.count()
        self._timer: TimerHandle | None = None
        self._timer_at = 0
        self._wake_at = 0
        self._order: deque[_OrderSlot] = deque()
        self._queue_drain = DrainSignal()  # stop() waits for the queue to be sent

    # ---- enqueue -----------------------------------------------------------------------------------------
    def enqueue(self, request: InferRequest) -> None:
        queues = self.queues
        index = queues.index_for(request.priority) if queues.priority_levels else 0
        level = queues.levels[index]
        if level.full():
            raise ServiceError(
                ErrorCode.UNAVAILABLE,
                f"[request id: {request.id or '<id_unknown>'}] Exceeds maximum queue size",
            )
        self.track(request)
        if self.preserve_ordering:
            self._hold(request)
        if self.idle and not queues.size and not self.delay_ns:
            # fast path: nothing to wait for and nobody ahead
            self._dispatch(self.idle.popleft(), [request])
            return
        track: Any = request.context
        now = self.clock.now_ns()
        track.enqueue_ns = now
        track.level = index
        track.state = QUEUED
        level.queue.append(request)
        queues.size += 1
        timeout_us = level.policy.timeout_us(request.timeout_us)
        if timeout_us:
            heapq.heappush(self._deadlines, (now + timeout_us * 1000, next(self._seq), request))
        self._pump()

    def pending_count(self) -> int:
        return self.queues.size + self.handed_over_count()

    # ---- batching ----------------------------------------------------------------------------------------
    def _pump(self) -> None:
        self._wake_at = 0
        if self._deadlines:
            self._expire(self.clock.now_ns())
        while self.idle and self.queues.size:
            batch = self._next_batch()
            if not batch:
                break
            self._dispatch(self.idle.popleft(), batch)
        if not self.queues.size:
            self._queue_drain.empty()
        self._arm_timer()

    def _input_key(self, request: InferRequest) -> tuple[Any, ...]:
        """What must be equal for two requests to share a batch (shapes of variable inputs, input set)."""
        names = self.equal_shape_inputs
        skip = 1 if self.batching else 0
        key = tuple(sorted((t.name, tuple(t.shape[skip:])) for t in request.inputs if t.name in names))
        if self.has_optional_inputs:
            return key, frozenset(t.name for t in request.inputs)
        return key

    def _next_batch(self) -> list[InferRequest] | None:
        """Form the next batch as Triton's dynamic batcher does, or set a wake-up time and return None."""
        queues = self.queues
        if not queues.size:
            return None
        pending = 0  # batch size of the requests taken so far
        count = 0
        best_count = 0  # requests in the best (preferred, or capped at max preferred) prefix
        send_now = False
        key: Any = None
        for req in queues:
            size = req.batch_size if self.batching and req.batch_size > 0 else 1
            if count == 0:
                if self._check_inputs:
                    key = self._input_key(req)
            else:
                if pending + size > self.max_preferred and best_count == 0:
                    best_count = count
                if pending + size > self.max_batch_size:
                    send_now = True
                    break
                if self._check_inputs and self._input_key(req) != key:
                    send_now = True
                    break
            pending += size
            count += 1
            if pending in self.preferred:
                best_count = count
        head = queues.head()
        assert head is not None
        oldest: Any = head.context
        now = self.clock.now_ns()
        delay_exceeded = self.delay_ns != 0 and now - oldest.enqueue_ns >= self.delay_ns
        if best_count and not delay_exceeded:
            return self._take(best_count)
        if send_now or pending >= self.max_preferred or delay_exceeded or not self.delay_ns:
            return self._take(count)
        self._wake_at = oldest.enqueue_ns + self.delay_ns
        return None

    def _take(self, count: int) -> list[InferRequest]:
        batch = self.queues.take(count)
        for req in batch:
            req.context.state = NOT_QUEUED
        return batch

    # ---- timeouts and timer ------------------------------------------------------------------------------
    def _expire(self, now: int) -> None:
        """Apply the timeout action to every queued request whose queue timeout has passed."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, req = heapq.heappop(deadlines)
            track: Any = req.context
            if track.state != QUEUED:
                continue
            level = self.queues.levels[track.level]
            level.queue.remove(req)
            if level.policy.delay_on_timeout:
                track.state = DELAYED
                level.delayed.append(req)
            else:
                track.state = NOT_QUEUED
                self.queues.size -= 1
                self.reject(req, ErrorCode.UNAVAILABLE, TIMEOUT_MESSAGE)

    def _arm_timer(self) -> None:
        """Keep one timer armed for the earliest of the queue-delay wake-up and the nearest timeout."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].context.state != QUEUED:
            heapq.heappop(deadlines)
        when = self._wake_at
        if deadlines and (not when or deadlines[0][0] < when):
            when = deadlines[0][0]
        if not when:
            return
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.clock.call_later(max(0, when - self.clock.now_ns()) / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    # ---- preserve_ordering -------------------------------------------------------------------------------
    def _hold(self, request: InferRequest) -> None:
        """Route the request's responses through an in-order release queue."""
        slot = _OrderSlot(request.on_response)
        self._order.append(slot)
        flush = self._flush

        def on_response(response: InferResponse) -> None:
            slot.held.append(response)
            if response.final:
                slot.done = True
            flush()

        request.on_response = on_response

    def _flush(self) -> None:
        order = self._order
        while order:
            slot = order[0]
            if slot.held:
                held, slot.held = slot.held, []
                if slot.deliver is not None:
                    for response in held:
                        slot.deliver(response)
            if not slot.done:
                return
            order.popleft()

    # ---- cancellation and shutdown -----------------------------------------------------------------------
    def cancel(self, request: InferRequest) -> None:
        track: Any = request.context
        if track is not None and track.state != NOT_QUEUED:
            self.queues.levels[track.level].remove(request)
            track.state = NOT_QUEUED
            self.queues.size -= 1
            self.stats.cancelled += 1
            self.reject(request, ErrorCode.CANCELLED, CANCELLED_MESSAGE)
        else:
            self.cancel_running(request)

    async def stop(self) -> None:
        """Send what is queued without waiting for the queue delay, then reject what is left."""
        self.delay_ns = 0
        if self.queues.size:
            self._pump()
            await self._queue_drain.wait(bool(self.queues.size), 30.0)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for req in self.queues.take(self.queues.size):
            req.context.state = NOT_QUEUED
            self.reject(req, ErrorCode.UNAVAILABLE, UNLOADING_MESSAGE)
