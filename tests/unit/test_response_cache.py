"""ResponseCache and its key: LRU order, the byte budget, and what the key covers."""

from __future__ import annotations

import pytest

from service.config.flags import parse_cache_config
from service.core.pipeline.response_cache import ENTRY_OVERHEAD_BYTES, ResponseCache, request_key
from service.types import InferRequest, InputTensor, OutputTensor, RequestedOutput, ShmRef


def _request(data: bytes = b"abcd", shape: list[int] | None = None, **kw: object) -> InferRequest:
    tensor = InputTensor("IN", "FP32", shape or [1], data)
    return InferRequest("m", "1", inputs=[tensor], **kw)  # type: ignore[arg-type]


def _no_shm(request: InferRequest, name: str) -> memoryview | None:
    raise AssertionError("no shm input here")


def test_key_covers_model_version_names_types_shapes_bytes_and_outputs() -> None:
    base = request_key(_request(), _no_shm)
    assert base is not None and len(base) == 16
    assert request_key(_request(), _no_shm) == base
    variants = [
        _request(b"abce"),
        _request(shape=[1, 1]),
        InferRequest("m", "2", inputs=[InputTensor("IN", "FP32", [1], b"abcd")]),
        InferRequest("n", "1", inputs=[InputTensor("IN", "FP32", [1], b"abcd")]),
        InferRequest("m", "1", inputs=[InputTensor("IN2", "FP32", [1], b"abcd")]),
        InferRequest("m", "1", inputs=[InputTensor("IN", "INT32", [1], b"abcd")]),
        _request(outputs=[RequestedOutput("OUT")]),
        _request(outputs=[RequestedOutput("OUT", classification=2)]),
    ]
    keys = {request_key(r, _no_shm) for r in variants}
    assert base not in keys and len(keys) == len(variants)


def test_asking_for_every_output_by_name_is_asking_for_all() -> None:
    every = frozenset({"A", "B"})
    implicit = request_key(_request(), _no_shm, every)
    named = request_key(_request(outputs=[RequestedOutput("B"), RequestedOutput("A")]), _no_shm, every)
    assert implicit == named
    assert request_key(_request(outputs=[RequestedOutput("A")]), _no_shm, every) != implicit


def test_key_is_none_for_outputs_in_shm_and_non_host_inputs() -> None:
    ref = ShmRef("r", "system", "/k", 0, 4)
    assert request_key(_request(outputs=[RequestedOutput("OUT", shm=ref)]), _no_shm) is None
    cuda = InferRequest("m", "1", inputs=[InputTensor("IN", "FP32", [1], shm=ShmRef("r", "cuda", "", 0, 4))])
    assert request_key(cuda, lambda r, n: None) is None
    host = InferRequest("m", "1", inputs=[InputTensor("IN", "FP32", [1], shm=ref)])
    assert request_key(host, lambda r, n: memoryview(b"abcd")) == request_key(_request(), _no_shm)


def _out(nbytes: int) -> list[OutputTensor]:
    return [OutputTensor("OUT", "UINT8", [nbytes], b"x" * nbytes)]


def test_lru_eviction_and_budget() -> None:
    entry = ENTRY_OVERHEAD_BYTES + 16 + 100
    cache = ResponseCache(budget_bytes=entry * 2)
    k1, k2, k3 = (bytes([i]) * 16 for i in range(3))
    assert cache.insert(k1, _out(100), {}) and cache.insert(k2, _out(100), {})
    assert cache.lookup(k1) is not None  # k1 now most recent
    assert cache.insert(k3, _out(100), {"p": 1})
    assert cache.lookup(k2) is None and cache.lookup(k1) is not None
    hit = cache.lookup(k3)
    assert hit is not None and hit.parameters == (("p", 1),) and hit.outputs[0].data == b"x" * 100
    assert cache.used_bytes == entry * 2 and len(cache) == 2
    assert cache.counters.evictions == 1 and cache.counters.hits == 3 and cache.counters.misses == 1


def test_oversize_entries_are_skipped_without_evicting() -> None:
    cache = ResponseCache(budget_bytes=1000)
    assert cache.insert(b"a" * 16, _out(10), {})
    assert not cache.insert(b"b" * 16, _out(1000), {})
    assert len(cache) == 1 and cache.counters.skipped_oversize == 1


def test_stored_bytes_are_a_copy() -> None:
    buf = bytearray(b"1234")
    cache = ResponseCache(budget_bytes=1000)
    cache.insert(b"k" * 16, [OutputTensor("OUT", "UINT8", [4], memoryview(buf))], {})
    buf[:] = b"zzzz"
    hit = cache.lookup(b"k" * 16)
    assert hit is not None and hit.outputs[0].data == b"1234"


def test_parse_cache_config() -> None:
    assert parse_cache_config([]) is None
    assert parse_cache_config(["local,size=1048576"]) == 1048576
    for bad in (["redis,host=x"], ["local,bytes=1"], ["local,size=-1"], ["local,size=\uff11"]):
        with pytest.raises(ValueError):
            parse_cache_config(bad)
