"""DynamicBatcher with a fake instance pool and a hand-driven clock: batching, delays, priorities, policies."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from service.core.observability.stats import ModelStats
from service.core.scheduling.dynamic_batcher import DynamicBatcher
from service.errors import ErrorCode, ServiceError
from service.ipc import frames as ipc
from service.types import InferRequest, InferResponse, InputTensor


class FakeTimer:
    """A timer of FakeClock."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that only moves when the test says so; timers fire from advance()."""

    def __init__(self) -> None:
        self.now = 1_000_000_000
        self.timers: list[tuple[int, int, FakeTimer, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now_ns(self) -> int:
        return self.now

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer()
        heapq.heappush(self.timers, (self.now + round(delay_s * 1e9), next(self._seq), timer, callback))
        return timer

    def pending(self) -> int:
        return sum(1 for t in self.timers if not t[2].cancelled)

    def advance_us(self, us: int) -> None:
        end = self.now + us * 1000
        while self.timers and self.timers[0][0] <= end:
            when, _, timer, callback = heapq.heappop(self.timers)
            if timer.cancelled:
                continue
            self.now = max(self.now, when)
            callback()
        self.now = end


class FakeWorker:
    """A model instance that records the batches it is given; the test finishes them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.uses_bls = False
        self.batches: list[list[InferRequest]] = []
        self.on_done: Any = None
        self.cancelled: list[InferRequest] = []
        self.finished = 0

    def execute(self, batch: list[InferRequest], on_done: Any) -> None:
        self.batches.append(batch)
        self.on_done = on_done

    def cancel(self, requests: list[InferRequest]) -> None:
        self.cancelled += requests

    def finish(self, infer_ns: int = 5000, answer: bool = True) -> list[InferRequest]:
        """Answer every request of the oldest unfinished batch and report ExecDone."""
        batch = self.batches[self.finished]
        self.finished += 1
        if answer:
            for req in batch:
                assert req.on_response is not None
                req.on_response(InferResponse(req.model_name, req.model_version, req.id))
        self.on_done(self, ipc.ExecDone(len(self.batches), 100, infer_ns, 0))
        return batch


class FakePool:
    """What InstanceScheduler needs of an InstancePool."""

    def __init__(self, count: int) -> None:
        self.workers = [FakeWorker(f"w{i}") for i in range(count)]
        self.on_available: Any = None
        self.on_lost: Any = None
        self.ready = True


def make_config(text: str, max_batch_size: int = 8) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(
        f"""
        name: "m" backend: "python" max_batch_size: {max_batch_size}
        input {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }}
        output {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}
        {text}
        """,
        config,
    )
    return config


class Harness:
    """A batcher, its fake pool and clock, and every response it delivered."""

    def __init__(self, config_text: str = "dynamic_batching {}", instances: int = 1, max_batch_size: int = 8) -> None:
        self.clock = FakeClock()
        self.pool = FakePool(instances)
        self.stats = ModelStats()
        self.batcher = DynamicBatcher(
            self.pool,  # type: ignore[arg-type]
            self.stats,
            make_config(config_text, max_batch_size),
            self.clock,
        )
        self.responses: list[InferResponse] = []
        self._ids = itertools.count(1)

    @property
    def worker(self) -> FakeWorker:
        return self.pool.workers[0]

    def request(
        self, batch: int = 1, width: int = 4, priority: int = 0, timeout_us: int = 0, rid: str | None = None
    ) -> InferRequest:
        req = InferRequest(
            "m",
            "1",
            rid if rid is not None else str(next(self._ids)),
            inputs=[InputTensor("IN", "FP32", [batch, width], b"\0" * (4 * batch * width))],
            priority=priority,
            timeout_us=timeout_us,
            batch_size=batch,
            arrival_ns=self.clock.now,
        )
        req.on_response = self.responses.append
        return req

    def send(self, *args: Any, **kwargs: Any) -> InferRequest:
        req = self.request(*args, **kwargs)
        self.batcher.enqueue(req)
        return req

    def sizes(self, worker: FakeWorker | None = None) -> list[int]:
        return [sum(r.batch_size for r in b) for b in (worker or self.worker).batches]

    def errors(self) -> list[tuple[str, ErrorCode, str]]:
        return [(r.id, r.error.code, r.error.message) for r in self.responses if r.error is not None]


# ---- batch formation -------------------------------------------------------------------------------------
def test_idle_instance_with_zero_delay_dispatches_synchronously() -> None:
    h = Harness()
    h.send()
    assert h.sizes() == [1]
    assert h.clock.pending() == 0


def test_zero_delay_batches_what_queued_while_the_instance_was_busy() -> None:
    h = Harness()
    h.send()
    for _ in range(5):
        h.send()
    assert h.sizes() == [1]
    h.worker.finish()
    assert h.sizes() == [1, 5]


def test_max_batch_size_caps_a_batch() -> None:
    h = Harness(max_batch_size=4)
    h.send()
    for _ in range(6):
        h.send()
    h.worker.finish()
    h.worker.finish()
    assert h.sizes() == [1, 4, 2]


def test_request_batch_sizes_add_up() -> None:
    h = Harness(max_batch_size=8)
    h.send()
    for b in (3, 3, 3):
        h.send(batch=b)
    h.worker.finish()
    assert h.sizes() == [1, 6]  # 3+3+3 > 8: the third waits
    h.worker.finish()
    assert h.sizes() == [1, 6, 3]


def test_delay_waits_then_sends_what_is_there() -> None:
    h = Harness("dynamic_batching { max_queue_delay_microseconds: 1000 }")
    h.send()
    h.send()
    assert h.sizes() == []
    h.clock.advance_us(999)
    assert h.sizes() == []
    h.clock.advance_us(1)
    assert h.sizes() == [2]


def test_delay_is_cut_short_by_reaching_the_preferred_size() -> None:
    h = Harness("dynamic_batching { max_queue_delay_microseconds: 100000 preferred_batch_size: [ 4 ] }")
    for _ in range(3):
        h.send()
    assert h.sizes() == []
    h.send()
    assert h.sizes() == [4]
    assert h.clock.now == 1_000_000_000  # no waiting happened


def test_preferred_size_is_taken_from_a_longer_queue() -> None:
    h = Harness("dynamic_batching { preferred_batch_size: [ 2, 4 ] }")
    h.send()  # occupies the instance
    for _ in range(7):
        h.send()
    h.worker.finish()
    assert h.sizes() == [1, 4]  # largest preferred size reachable, not all 7
    h.worker.finish()
    assert h.sizes() == [1, 4, 2]
    h.worker.finish()
    assert h.sizes() == [1, 4, 2, 1]


def test_preferred_size_that_cannot_be_formed_waits_for_the_delay() -> None:
    h = Harness("dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 500 }")
    h.send(batch=3)
    h.send(batch=3)  # 3+3 would exceed the preferred size 4: the first goes alone
    assert h.sizes() == [3]
    h.clock.advance_us(500)
    h.worker.finish()
    assert h.sizes() == [3, 3]


def test_default_preferred_is_max_batch_size() -> None:
    h = Harness("dynamic_batching { max_queue_delay_microseconds: 100000 }", max_batch_size=4)
    for _ in range(4):
        h.send()
    assert h.sizes() == [4]


def test_shape_incompatible_requests_go_in_separate_batches() -> None:
    h = Harness()
    h.send()
    h.send(width=4)
    h.send(width=4)
    h.send(width=5)
    h.send(width=4)
    h.worker.finish()
    assert [[r.inputs[0].shape[1] for r in b] for b in h.worker.batches[1:]] == [[4, 4]]
    h.worker.finish()
    assert h.sizes() == [1, 2, 1]
    h.worker.finish()
    assert h.sizes() == [1, 2, 1, 1]


def test_several_instances_each_get_batches() -> None:
    h = Harness(instances=2)
    h.send()
    h.send()
    assert [h.sizes(w) for w in h.pool.workers] == [[1], [1]]
    for _ in range(3):
        h.send()
    h.pool.workers[1].finish()
    assert h.sizes(h.pool.workers[1]) == [1, 3]


# ---- priorities --------------------------------------------------------------------------------------------
def test_higher_priority_levels_drain_first() -> None:
    h = Harness("dynamic_batching { priority_levels: 3 default_priority_level: 2 }", max_batch_size=2)
    h.send(rid="busy")
    h.send(rid="low", priority=3)
    h.send(rid="default0", priority=0)
    h.send(rid="high", priority=1)
    h.send(rid="out_of_range", priority=7)
    h.send(rid="high2", priority=1)
    order = []
    for _ in range(3):
        h.worker.finish()
        order.append([r.id for r in h.worker.batches[-1]])
    assert order == [["high", "high2"], ["default0", "out_of_range"], ["low"]]


# ---- queue policies ------------------------------------------------------------------------------------------
def test_max_queue_size_rejects_with_tritons_message() -> None:
    h = Harness("dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    h.send()  # running, not queued
    h.send()
    h.send()
    with pytest.raises(ServiceError) as e:
        h.send(rid="r9")
    assert e.value.code == ErrorCode.UNAVAILABLE
    assert e.value.message == "[request id: r9] Exceeds maximum queue size"
    with pytest.raises(ServiceError) as e:
        h.send(rid="")
    assert e.value.message == "[request id: <id_unknown>] Exceeds maximum queue size"
    h.worker.finish()
    h.send()  # room again


def test_max_queue_size_is_per_priority_level() -> None:
    h = Harness(
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value { max_queue_size: 1 } } }"
    )
    h.send()
    h.send(priority=1)
    with pytest.raises(ServiceError):
        h.send(priority=1)
    h.send(priority=2)
    h.send(priority=2)


def test_timeout_reject_answers_at_once_while_the_instance_is_busy() -> None:
    h = Harness(
        "dynamic_batching { default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000 } }"
    )
    h.send(rid="running")
    h.send(rid="late")
    h.clock.advance_us(999)
    assert h.errors() == []
    h.clock.advance_us(1)
    assert h.errors() == [("late", ErrorCode.UNAVAILABLE, "Request timeout expired")]
    assert h.stats.fail.count == 1
    h.worker.finish()
    assert h.sizes() == [1]  # the expired request was never executed


def test_timeout_override_only_shortens_the_default() -> None:
    h = Harness(
        "dynamic_batching { default_queue_policy { default_timeout_microseconds: 5000 allow_timeout_override: true } }"
    )
    h.send(rid="running")
    h.send(rid="short", timeout_us=1000)
    h.send(rid="long", timeout_us=9000)
    h.clock.advance_us(1000)
    assert [e[0] for e in h.errors()] == ["short"]
    h.clock.advance_us(4000)
    assert [e[0] for e in h.errors()] == ["short", "long"]


def test_timeout_override_is_ignored_when_not_allowed_or_no_default() -> None:
    h = Harness("dynamic_batching { default_queue_policy { default_timeout_microseconds: 5000 } }")
    h.send(rid="running")
    h.send(rid="r", timeout_us=10)
    h.clock.advance_us(4999)
    assert h.errors() == []
    h2 = Harness("dynamic_batching { default_queue_policy { allow_timeout_override: true } }")
    h2.send(rid="running")
    h2.send(rid="r", timeout_us=10)
    h2.clock.advance_us(1_000_000)
    assert h2.errors() == []
    assert h2.clock.pending() == 0


def test_timeout_delay_moves_the_request_behind_unexpired_ones() -> None:
    h = Harness(
        "dynamic_batching { default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 } }",
        max_batch_size=1,
    )
    h.send(rid="running")
    h.send(rid="a")
    h.clock.advance_us(500)
    h.send(rid="b")
    h.clock.advance_us(600)  # "a" expired, "b" not
    assert h.errors() == []
    h.send(rid="c")
    order = []
    for _ in range(3):
        h.worker.finish()
        order.append(h.worker.batches[-1][0].id)
    assert order == ["b", "c", "a"]


def test_cancelled_queued_request_is_removed() -> None:
    h = Harness()
    h.send(rid="running")
    q = h.send(rid="q")
    q.cancelled = True
    h.batcher.cancel(q)
    assert h.errors() == [("q", ErrorCode.CANCELLED, "request cancelled by the client")]
    h.worker.finish()
    assert h.sizes() == [1]


def test_cancel_of_a_running_request_reaches_its_worker() -> None:
    h = Harness()
    r = h.send(rid="running")
    h.batcher.cancel(r)
    assert h.worker.cancelled == [r]


# ---- ordering and statistics ---------------------------------------------------------------------------------
def test_preserve_ordering_holds_later_responses() -> None:
    h = Harness("dynamic_batching { preserve_ordering: true }", instances=2, max_batch_size=1)
    first = h.send(rid="first")
    h.send(rid="second")
    h.pool.workers[1].finish()
    assert h.responses == []
    h.pool.workers[0].finish()
    assert [r.id for r in h.responses] == ["first", "second"]
    assert first.id == "first"


def test_statistics_count_one_execution_per_batch() -> None:
    h = Harness("dynamic_batching { max_queue_delay_microseconds: 1000 }")
    for _ in range(4):
        h.send()
    h.clock.advance_us(1000)
    h.worker.finish(infer_ns=7000)
    s = h.stats
    assert (s.execution_count, s.inference_count) == (1, 4)
    assert list(s.batch_stats) == [4]
    assert s.batch_stats[4].compute_infer.count == 1
    assert s.batch_stats[4].compute_infer.ns == 7000
    assert s.success.count == 4 and s.queue.count == 4 and s.compute_infer.count == 4
    assert s.queue.ns == 4 * 1_000_000  # each waited the 1 ms delay


def test_no_timer_left_when_the_queue_empties() -> None:
    h = Harness("dynamic_batching { max_queue_delay_microseconds: 1000 preferred_batch_size: [ 2 ] }")
    h.send()
    h.send()
    assert h.sizes() == [2]
    h.clock.advance_us(5000)
    assert h.clock.pending() == 0
