"""Priority levels and per-level queue policies of the dynamic batcher (Triton's ModelQueuePolicy)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from protos import model_config_pb2 as mc
from service.types import InferRequest


@dataclass(slots=True, frozen=True)
class QueuePolicy:
    """One level's policy: queue timeout, what to do on timeout, and the queue's size limit."""

    default_timeout_us: int = 0  # 0: requests never time out in the queue
    delay_on_timeout: bool = False  # timeout_action DELAY (else REJECT)
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unlimited

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> QueuePolicy:
        """From a config's ModelQueuePolicy message."""
        return cls(
            policy.default_timeout_microseconds,
            policy.timeout_action == mc.ModelQueuePolicy.DELAY,
            policy.allow_timeout_override,
            policy.max_queue_size,
        )

    def timeout_us(self, request_timeout_us: int) -> int:
        """The queue timeout of a request: the default, lowered by the request's own `timeout` when allowed.

        As in Triton, an override only ever shortens a non-zero default (a default of 0 means no timeout).
        """
        timeout = self.default_timeout_us
        if self.allow_timeout_override and 0 < request_timeout_us < timeout:
            timeout = request_timeout_us
        return timeout


@dataclass(slots=True, eq=False)
class LevelQueue:
    """The requests of one priority level: unexpired ones first, then those delayed by their timeout."""

    policy: QueuePolicy
    queue: deque[InferRequest] = field(default_factory=deque)
    delayed: deque[InferRequest] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)

    def full(self) -> bool:
        """Whether max_queue_size is reached."""
        limit = self.policy.max_queue_size
        return bool(limit) and len(self) >= limit

    def remove(self, request: InferRequest) -> bool:
        """Take `request` out of whichever deque holds it; False when it is not queued here."""
        for q in (self.queue, self.delayed):
            try:
                q.remove(request)
            except ValueError:
                continue
            return True
        return False


class PriorityQueues:
    """Priority levels 1..N (1 first), each a LevelQueue with its own policy; level 0 when N == 0."""

    def __init__(self, batching: mc.ModelDynamicBatching) -> None:
        default = QueuePolicy.from_config(batching.default_queue_policy)
        count = max(1, batching.priority_levels)
        self.priority_levels = batching.priority_levels
        self.levels = [
            LevelQueue(
                QueuePolicy.from_config(batching.priority_queue_policy[k + 1])
                if (k + 1) in batching.priority_queue_policy
                else default
            )
            for k in range(count)
        ]
        self.default_index = batching.default_priority_level - 1 if batching.priority_levels else 0
        self.size = 0

    def index_for(self, priority: int) -> int:
        """The level index of a request priority (0 or out of range: the default level)."""
        if 0 < priority <= self.priority_levels:
            return priority - 1
        return self.default_index

    def __iter__(self) -> Iterator[InferRequest]:
        """Requests in dispatch order: by level, unexpired before delayed within a level."""
        for level in self.levels:
            yield from level.queue
            yield from level.delayed

    def head(self) -> InferRequest | None:
        """The request that would be dispatched next."""
        for level in self.levels:
            if level.queue:
                return level.queue[0]
            if level.delayed:
                return level.delayed[0]
        return None

    def take(self, count: int) -> list[InferRequest]:
        """Pop the first `count` requests in dispatch order."""
        out: list[InferRequest] = []
        for level in self.levels:
            for q in (level.queue, level.delayed):
                while q and len(out) < count:
                    out.append(q.popleft())
            if len(out) == count:
                break
        self.size -= len(out)
        return out
