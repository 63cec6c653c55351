"""Dynamic batching through a real server: batches, statistics, queue timeouts, queue size, stacking helper."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import write_model
from tests.integration.models import elementwise_py

COUNT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            size = np.full((x.shape[0], 1), n, np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x), pb_utils.Tensor("N", size)]))
        return responses
"""

SLOW_MODEL = elementwise_py(inp="IN", out="OUT", setup="time.sleep(1.0)")

STACKED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    @pb_utils.batched
    def execute(self, inputs):
        self.calls += 1
        x = inputs["IN"]
        return {"OUT": x * 2, "N": np.full((x.shape[0], 1), self.calls, np.int32)}
"""


def config(name: str, batching: str, outputs: str = "") -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 8
    input {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }}
    output {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }}
    {outputs}
    {batching}
    """


N_OUTPUT = 'output { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }'


def make_input(rows: int, value: float = 1.0) -> grpcclient.InferInput:
    t = grpcclient.InferInput("IN", [rows, 4], "FP32")
    t.set_data_from_numpy(np.full((rows, 4), value, np.float32))
    return t


def send_concurrently(client: grpcclient.InferenceServerClient, model: str, rows: list[int]) -> list[Any]:
    """Fire one async request per entry of `rows` (its batch size) and collect results in order."""
    done: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    for i, n in enumerate(rows):
        client.async_infer(
            model,
            [make_input(n, float(i))],
            callback=lambda result, error, i=i: done.put((i, result, error)),
            request_id=f"r{i}",
        )
    results: list[Any] = [None] * len(rows)
    for _ in rows:
        i, result, error = done.get(timeout=30)
        results[i] = error if error is not None else result
    return results


@pytest.fixture
def batching_server(tmp_path: Path, start_server: Any) -> Any:
    repo = tmp_path / "repo"
    write_model(
        repo,
        "count4",
        config(
            "count4", "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }", N_OUTPUT
        ),
        COUNT_MODEL,
    )
    write_model(repo, "count0", config("count0", "dynamic_batching { }", N_OUTPUT), COUNT_MODEL)
    write_model(
        repo,
        "slow_timeout",
        config(
            "slow_timeout",
            "dynamic_batching { default_queue_policy { timeout_action: REJECT "
            "default_timeout_microseconds: 60000000 allow_timeout_override: true } }",
        ),
        SLOW_MODEL,
    )
    write_model(
        repo,
        "slow_bounded",
        config("slow_bounded", "dynamic_batching { default_queue_policy { max_queue_size: 1 } }"),
        SLOW_MODEL,
    )
    write_model(
        repo,
        "stacked",
        config(
            "stacked",
            "dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 5000000 }",
            N_OUTPUT,
        ),
        STACKED_MODEL,
    )
    server = start_server(repos=[repo])
    client = grpcclient.InferenceServerClient(server.url)
    yield client
    client.close()


def test_concurrent_requests_run_as_one_batch(batching_server: Any) -> None:
    client = batching_server
    results = send_concurrently(client, "count4", [1, 1, 1, 1])
    for i, r in enumerate(results):
        assert not isinstance(r, Exception), r
        assert r.as_numpy("N").tolist() == [[4]]
        np.testing.assert_array_equal(r.as_numpy("OUT"), np.full((1, 4), float(i), np.float32))
    stats = client.get_inference_statistics("count4", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 1
    assert int(stats["inference_count"]) == 4
    assert [int(b["batch_size"]) for b in stats["batch_stats"]] == [4]
    assert int(stats["batch_stats"][0]["compute_infer"]["count"]) == 1
    inf = stats["inference_stats"]
    assert int(inf["success"]["count"]) == 4
    assert int(inf["queue"]["count"]) == 4
    assert int(inf["compute_infer"]["count"]) == 4


def test_zero_delay_model_answers_a_single_request(batching_server: Any) -> None:
    client = batching_server
    result = client.infer("count0", [make_input(3, 2.0)])
    assert result.as_numpy("N").tolist() == [[1], [1], [1]]
    stats = client.get_inference_statistics("count0", as_json=True)["model_stats"][0]
    assert (int(stats["execution_count"]), int(stats["inference_count"])) == (1, 3)
    assert [int(b["batch_size"]) for b in stats["batch_stats"]] == [3]


def test_queue_timeout_rejects_without_waiting_for_the_running_batch(batching_server: Any) -> None:
    client = batching_server
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer(
        "slow_timeout", [make_input(1)], callback=lambda result, error: done.put(error), request_id="first"
    )
    time.sleep(0.2)  # let the first request reach the model
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        client.infer("slow_timeout", [make_input(1)], request_id="late", timeout=100_000)
    waited = time.monotonic() - start
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == "Request timeout expired"
    assert waited < 0.7, f"the timeout was answered after {waited:.2f} s, i.e. after the running batch"
    assert done.get(timeout=10) is None
    stats = client.get_inference_statistics("slow_timeout", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["fail"]["count"]) == 1
    assert int(stats["execution_count"]) == 1


def test_full_queue_is_unavailable(batching_server: Any) -> None:
    client = batching_server
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("slow_bounded", [make_input(1)], callback=lambda result, error: done.put(error), request_id="a")
    time.sleep(0.2)  # "a" is running; the queue is empty again
    client.async_infer("slow_bounded", [make_input(1)], callback=lambda result, error: done.put(error), request_id="b")
    time.sleep(0.2)  # "b" is queued
    with pytest.raises(InferenceServerException) as e:
        client.infer("slow_bounded", [make_input(1)], request_id="c")
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == "[request id: c] Exceeds maximum queue size"
    assert [done.get(timeout=10), done.get(timeout=10)] == [None, None]


def test_stacking_helper_runs_the_batch_in_one_call(batching_server: Any) -> None:
    client = batching_server
    results = send_concurrently(client, "stacked", [1, 2, 3])
    for i, (r, rows) in enumerate(zip(results, [1, 2, 3], strict=True)):
        assert not isinstance(r, Exception), r
        np.testing.assert_array_equal(r.as_numpy("OUT"), np.full((rows, 4), 2.0 * i, np.float32))
        assert r.as_numpy("N").tolist() == [[1]] * rows  # every request saw the first (and only) call
    stats = client.get_inference_statistics("stacked", as_json=True)["model_stats"][0]
    assert (int(stats["execution_count"]), int(stats["inference_count"])) == (1, 6)
