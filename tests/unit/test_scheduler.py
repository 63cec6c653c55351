"""DirectScheduler with a fake instance pool and clock: one request per execution, FIFO, queue limit, stats,
drain and instance release (model lifecycle)."""

from __future__ import annotations

import asyncio

import pytest

from service.core.observability.stats import ModelStats
from service.core.scheduling.direct import DirectScheduler
from service.core.scheduling.scheduler import UNLOADING_MESSAGE
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


def test_drain_waits_for_every_final_response_and_stop_answers_the_queue() -> None:
    async def scenario() -> None:
        sched, pool, clock, responses = make(max_queue_size=0)
        for rid in ("a", "b", "c"):
            sched.enqueue(request(clock, responses, rid))
        assert sched.outstanding == 3
        drain = asyncio.ensure_future(sched.drain(5.0))
        pool.workers[0].finish()
        await asyncio.sleep(0)
        assert not drain.done() and sched.outstanding == 2
        assert await sched.drain(0.01) is False  # bounded
        pool.workers[0].finish()
        pool.workers[0].finish()
        assert await drain is True and sched.outstanding == 0
        sched.enqueue(request(clock, responses, "d"))
        sched.enqueue(request(clock, responses, "e"))
        sched.enqueue(request(clock, responses, "f"))  # queued: the instance holds d and e
        await sched.stop()
        assert responses[-1].id == "f" and responses[-1].error is not None
        assert responses[-1].error.message == UNLOADING_MESSAGE

    asyncio.run(scenario())


def test_a_released_instance_gets_no_new_work() -> None:
    async def scenario() -> None:
        sched, pool, clock, responses = make(instances=2)
        w0, w1 = pool.workers
        await sched.release_worker(w1, 1.0)  # type: ignore[arg-type]
        for rid in ("a", "b", "c", "d"):
            sched.enqueue(request(clock, responses, rid))
        assert w1.batches == [] and len(w0.batches) == 2
        sched.add_worker(w1)  # type: ignore[arg-type]
        assert len(w1.batches) == 2

    asyncio.run(scenario())
