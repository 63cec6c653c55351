"""DirectScheduler with a fake instance pool and clock: one request per execution, FIFO, queue limit, stats."""

from __future__ import annotations

import pytest

from service.core.scheduler import DirectScheduler
from service.core.stats import ModelStats
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest, InferResponse, InputTensor
from tests.unit.test_dynamic_batcher import FakeClock, FakePool


def make(instances: int = 1, max_queue_size: int = 0) -> tuple[DirectScheduler, FakePool, FakeClock, list]:
    clock, pool = FakeClock(), FakePool(instances)
    responses: list[InferResponse] = []
    sched = DirectScheduler(pool, ModelStats(), max_queue_size, clock)  # type: ignore[arg-type]
    return sched, pool, clock, responses


def request(clock: FakeClock, responses: list, rid: str, rows: int = 1) -> InferRequest:
    req = InferRequest("m", "1", rid, inputs=[InputTensor("IN", "FP32", [rows, 2], b"\0" * 8 * rows)], batch_size=rows)
    req.arrival_ns = clock.now
    req.on_response = responses.append
    return req


def test_one_request_per_execution_in_arrival_order() -> None:
    sched, pool, clock, responses = make()
    for rid in ("a", "b", "c"):
        sched.enqueue(request(clock, responses, rid, rows=2))
    w = pool.workers[0]
    # pipelined: the instance holds its next request while it runs the first
    assert [[r.id for r in b] for b in w.batches] == [["a"], ["b"]]
    w.finish()
    assert [[r.id for r in b] for b in w.batches] == [["a"], ["b"], ["c"]]
    w.finish()
    w.finish()
    assert [[r.id for r in b] for b in w.batches] == [["a"], ["b"], ["c"]]
    assert (sched.stats.execution_count, sched.stats.inference_count) == (3, 6)
    assert list(sched.stats.batch_stats) == [2]


def test_requests_spread_over_idle_instances() -> None:
    sched, pool, clock, responses = make(instances=2)
    sched.enqueue(request(clock, responses, "a"))
    sched.enqueue(request(clock, responses, "b"))
    assert [len(w.batches) for w in pool.workers] == [1, 1]


def test_queue_limit_and_queue_time() -> None:
    sched, pool, clock, responses = make(max_queue_size=1)
    sched.enqueue(request(clock, responses, "a"))
    sched.enqueue(request(clock, responses, "b"))  # handed to the busy instance, still counts as queued
    with pytest.raises(ServiceError) as e:
        sched.enqueue(request(clock, responses, "c"))
    assert (e.value.code, e.value.message) == (ErrorCode.UNAVAILABLE, "[request id: c] Exceeds maximum queue size")
    clock.advance_us(300)
    pool.workers[0].finish()
    pool.workers[0].finish()
    assert sched.stats.queue.count == 2
    assert sched.stats.queue.ns == 300_000  # "b" waited 300 µs, "a" none
    assert sched.stats.success.count == 2
