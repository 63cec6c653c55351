"""DirectScheduler: the scheduler of models without dynamic or sequence batching (one request per execution)."""

from __future__ import annotations

from collections import deque

from service.core.observability.stats import ModelStats
from service.core.scheduling.scheduler import UNLOADING_MESSAGE, Clock, InstanceScheduler
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool
from service.types import InferRequest


class DirectScheduler(InstanceScheduler):
    """Models without dynamic or sequence batching: one request per execution, FIFO, first idle instance.

    Pipelined (depth 2): each instance holds its next request while it runs the current one.
    """

    depth = 2

    def __init__(
        self, pool: InstancePool, stats: ModelStats, max_queue_size: int = 0, clock: Clock | None = None
    ) -> None:
        super().__init__(pool, stats, clock)
        self.queue: deque[InferRequest] = deque()
        self.max_queue_size = max_queue_size

    def enqueue(self, request: InferRequest) -> None:
        # requests handed to a busy instance that have not started still count as queued
        if self.max_queue_size and len(self.queue) + self.handed_over_count() >= self.max_queue_size:
            raise ServiceError(
                ErrorCode.UNAVAILABLE,
                f"[request id: {request.id or '<id_unknown>'}] Exceeds maximum queue size",
            )
        self.track(request)
        if not self.queue:
            worker = self._take_slot()
            if worker is not None:
                self._dispatch(worker, [request])
                return
        self.queue.append(request)
        self._pump()

    def pending_count(self) -> int:
        return len(self.queue) + self.handed_over_count()

    def _pump(self) -> None:
        if self.queue:  # nothing queued (the common case after each execution): no slot or batch lookups
            super()._pump()

    def _next_batch(self) -> list[InferRequest] | None:
        while self.queue:
            req = self.queue.popleft()
            if not req.cancelled:
                return [req]
        return None

    async def stop(self) -> None:
        """Answer what is still queued (the version is being unloaded and its instances are stopping)."""
        queued, self.queue = self.queue, deque()
        for req in queued:
            self.reject(req, ErrorCode.UNAVAILABLE, UNLOADING_MESSAGE)

    def cancel(self, request: InferRequest) -> None:
        if request in self.queue:
            self.queue.remove(request)
            self.stats.cancelled += 1
            self.reject(request, ErrorCode.CANCELLED, "request cancelled by the client")
        else:
            self.cancel_running(request)
