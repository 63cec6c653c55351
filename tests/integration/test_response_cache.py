"""The response cache through a real server: hits skip the model, LRU eviction, oversize entries, statistics,
shared-memory inputs read at request time, ensembles, and the requests the cache must not answer."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.conftest import ServerProcess, running_server, write_model

# OUT = 2 * IN, CALLS = how many times this instance has run execute (a cached answer repeats the old count)
COUNTING_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            calls = np.array([self.calls], np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("CALLS", calls)]))
        return out
"""


def counting_config(name: str, extra: str = "") -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }},
             {{ name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] }} ]
    instance_group [ {{ kind: KIND_CPU count: 1 }} ]
    response_cache {{ enable: true }}
    {extra}
    """


DECOUPLED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            sender = r.get_response_sender()
            calls = np.array([self.calls], np.int64)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("CALLS", calls)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

ENSEMBLE_CONFIG = """
name: "cached_pipeline"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
response_cache { enable: true }
ensemble_scheduling { step [ { model_name: "step_model" model_version: -1
  input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } output_map { key: "CALLS" value: "N" } } ] }
"""

BUDGET = 64 * 1024  # bytes; an entry of 4096 floats (16 KiB) fits three times, not four
BIG_ELEMENTS = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("cache_repo")
    write_model(repo, "counting", counting_config("counting"), COUNTING_PY)
    write_model(repo, "lru", counting_config("lru"), COUNTING_PY)
    write_model(repo, "stats_model", counting_config("stats_model"), COUNTING_PY)
    write_model(repo, "shm_model", counting_config("shm_model"), COUNTING_PY)
    write_model(repo, "step_model", counting_config("step_model"), COUNTING_PY)
    write_model(repo, "uncached", counting_config("uncached").replace("enable: true", "enable: false"), COUNTING_PY)
    write_model(
        repo,
        "decoupled_cached",
        counting_config("decoupled_cached", "model_transaction_policy { decoupled: true }"),
        DECOUPLED_PY,
    )
    sequence = "sequence_batching { max_sequence_idle_microseconds: 5000000 }"
    write_model(repo, "sequence_cached", counting_config("sequence_cached", sequence), COUNTING_PY)
    (repo / "cached_pipeline" / "1").mkdir(parents=True)
    (repo / "cached_pipeline" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    log = tmp_path_factory.mktemp("cache_srv") / "server.log"
    with running_server([repo], log, ["--cache-config", f"local,size={BUDGET}"]) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Any]:
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def infer(client: Any, model: str, x: np.ndarray, outputs: list[str] | None = None, **kw: Any) -> Any:
    inp = grpcclient.InferInput("IN" if model != "cached_pipeline" else "X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, [inp], outputs=requested, **kw)


def calls(result: Any, name: str = "CALLS") -> int:
    return int(result.as_numpy(name)[0])


def stats(client: Any, model: str) -> Any:
    return client.get_inference_statistics(model).model_stats[0]


def test_hit_returns_the_same_bytes_without_running_the_model(client: Any) -> None:
    x = np.arange(8, dtype=np.float32)
    first = infer(client, "counting", x)
    second = infer(client, "counting", x)
    assert calls(first) == 1 and calls(second) == 1  # the model ran once
    raw_first = first.get_response().raw_output_contents
    raw_second = second.get_response().raw_output_contents
    assert list(raw_first) == list(raw_second)
    np.testing.assert_array_equal(second.as_numpy("OUT"), x * 2)
    other = infer(client, "counting", x + 1)  # different bytes: a miss, the model runs again
    assert calls(other) == 2
    assert calls(infer(client, "counting", np.arange(4, dtype=np.float32))) == 3


def test_requested_outputs_are_part_of_the_key(client: Any) -> None:
    x = np.full(3, 7, np.float32)
    only_out = infer(client, "counting", x, outputs=["OUT"])
    assert only_out.as_numpy("CALLS") is None
    both = infer(client, "counting", x)  # asks for every output: must not get the one-output response
    assert both.as_numpy("CALLS") is not None
    np.testing.assert_array_equal(both.as_numpy("OUT"), x * 2)


def test_statistics_count_hits_and_misses_as_triton_does(client: Any) -> None:
    a, b = np.zeros(4, np.float32), np.ones(4, np.float32)
    for x in (a, a, a, b, b):
        infer(client, "stats_model", x)
    s = stats(client, "stats_model")
    stat = s.inference_stats
    assert stat.cache_hit.count == 3 and stat.cache_miss.count == 2
    assert stat.success.count == 5 and stat.queue.count == 5
    assert s.execution_count == 2 and s.inference_count == 2
    assert stat.compute_infer.count == 2  # hits never reach the model
    assert stat.cache_hit.ns > 0 and stat.cache_miss.ns > 0


def test_lru_eviction_within_the_byte_budget(client: Any) -> None:
    a, b, c, d = (np.full(BIG_ELEMENTS, v, np.float32) for v in (1, 2, 3, 4))
    assert [calls(infer(client, "lru", x)) for x in (a, b, c)] == [1, 2, 3]
    assert calls(infer(client, "lru", a)) == 1  # hit: a is now the most recently used
    assert calls(infer(client, "lru", d)) == 4  # miss: stored, evicting b (least recently used)
    assert calls(infer(client, "lru", c)) == 3  # still cached
    assert calls(infer(client, "lru", a)) == 1  # still cached
    assert calls(infer(client, "lru", b)) == 5  # was evicted: the model runs again


def test_entries_larger_than_the_budget_are_never_stored(client: Any) -> None:
    small = np.full(8, 42, np.float32)
    stored = calls(infer(client, "counting", small))
    huge = np.ones(BUDGET // 4, np.float32)  # its output alone is the whole budget
    runs = [calls(infer(client, "counting", huge)) for _ in range(2)]
    assert runs == [stored + 1, stored + 2]  # ran both times: never stored
    assert calls(infer(client, "counting", small)) == stored  # and storing it was not tried at the others' cost


def test_models_without_the_config_field_are_not_cached(client: Any) -> None:
    x = np.zeros(2, np.float32)
    assert [calls(infer(client, "uncached", x)) for _ in range(3)] == [1, 2, 3]
    assert stats(client, "uncached").inference_stats.cache_miss.count == 0


def test_decoupled_and_sequence_models_bypass_the_cache(server: ServerProcess) -> None:
    results: queue.Queue[Any] = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url)
    c.start_stream(callback=lambda result, error: results.put(error or result))
    x = np.zeros(2, np.float32)
    seen = []
    for _ in range(2):
        inp = grpcclient.InferInput("IN", [2], "FP32")
        inp.set_data_from_numpy(x)
        c.async_stream_infer("decoupled_cached", [inp])
        seen.append(calls(results.get(timeout=30)))
    c.stop_stream()
    assert seen == [1, 2]
    seq = [calls(infer(c, "sequence_cached", x, sequence_id=7, sequence_start=i == 0)) for i in range(2)]
    assert seq == [1, 2]
    c.close()


def test_shared_memory_inputs_are_read_at_request_time(client: Any) -> None:
    x = np.arange(16, dtype=np.float32)
    key = f"/trireme_test_cache_in_{uuid.uuid4().hex[:12]}"  # unique: another test run may be at this test too
    handle = shm.create_shared_memory_region("cache_in", key, x.nbytes)
    try:
        client.register_system_shared_memory("cache_in", key, x.nbytes)

        def shm_infer() -> Any:
            inp = grpcclient.InferInput("IN", [16], "FP32")
            inp.set_shared_memory("cache_in", x.nbytes)
            return client.infer("shm_model", [inp])

        shm.set_shared_memory_region(handle, [x])
        assert calls(shm_infer()) == 1
        shm.set_shared_memory_region(handle, [x + 100])  # same region, new bytes: not the cached request
        changed = shm_infer()
        assert calls(changed) == 2
        np.testing.assert_array_equal(changed.as_numpy("OUT"), (x + 100) * 2)
        shm.set_shared_memory_region(handle, [x])
        assert calls(shm_infer()) == 1  # the original bytes again: a hit
        assert calls(infer(client, "shm_model", x)) == 1  # the same bytes over the wire hit the same entry
        client.unregister_system_shared_memory("cache_in")
    finally:
        shm.destroy_shared_memory_region(handle)


def test_outputs_to_shared_memory_bypass_the_cache(client: Any) -> None:
    x = np.full(4, 3, np.float32)
    key = f"/trireme_test_cache_out_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("cache_out", key, 64)
    try:
        client.register_system_shared_memory("cache_out", key, 64)
        runs = []
        for _ in range(2):
            inp = grpcclient.InferInput("IN", [4], "FP32")
            inp.set_data_from_numpy(x)
            out = grpcclient.InferRequestedOutput("OUT")
            out.set_shared_memory("cache_out", 16)
            cnt = grpcclient.InferRequestedOutput("CALLS")
            client.infer("counting", [inp], outputs=[out, cnt])
            runs.append(shm.get_contents_as_numpy(handle, np.float32, [4]).copy())
        np.testing.assert_array_equal(runs[0], x * 2)
        np.testing.assert_array_equal(runs[1], x * 2)
        client.unregister_system_shared_memory("cache_out")
    finally:
        shm.destroy_shared_memory_region(handle)
    # neither request read nor filled the cache: a plain request with the same input still misses
    before = stats(client, "counting").execution_count
    infer(client, "counting", x, outputs=["OUT", "CALLS"])
    assert stats(client, "counting").execution_count == before + 1


def test_cached_ensemble_answers_without_running_its_steps(client: Any) -> None:
    x = np.arange(5, dtype=np.float32)
    first = infer(client, "cached_pipeline", x)
    step_runs = stats(client, "step_model").execution_count
    second = infer(client, "cached_pipeline", x)
    assert calls(first, "N") == calls(second, "N") == 1
    np.testing.assert_array_equal(second.as_numpy("Y"), x * 2)
    assert stats(client, "step_model").execution_count == step_runs  # the step did not run for the hit
    ens = stats(client, "cached_pipeline").inference_stats
    assert ens.cache_hit.count == 1 and ens.cache_miss.count == 1
    # the composing model cached its own response under its own key: calling it directly hits
    direct = infer(client, "step_model", x)
    assert calls(direct) == 1
    assert stats(client, "step_model").inference_stats.cache_hit.count == 1


def test_unknown_cache_implementation_fails_at_start(start_server: Any) -> None:
    server = start_server(args=["--cache-config", "memcached,host=localhost"], wait=False)
    assert server.proc.wait(60) != 0
    assert "unsupported cache 'memcached': the 'local' and 'redis' caches are available" in server.log()
