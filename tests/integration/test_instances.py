"""Instance groups through a real server: several instances and models run at once; GPU kinds without GPUs."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import write_model

TIMED_MODEL = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.kind = args["model_instance_kind"]

    def execute(self, requests):
        start = time.time()
        time.sleep(0.5)
        end = time.time()
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("T", np.array([start, end], np.float64)),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
                pb_utils.Tensor("KIND", np.array([self.kind.encode()], np.object_)),
            ])
            for r in requests
        ]
"""


def config(name: str, groups: str) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    input {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }}
    output {{ name: "T" data_type: TYPE_FP64 dims: [ 2 ] }}
    output {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }}
    output {{ name: "KIND" data_type: TYPE_STRING dims: [ 1 ] }}
    {groups}
    """


@pytest.fixture
def instance_server(tmp_path: Path, start_server: Any) -> Any:
    repo = tmp_path / "repo"
    write_model(repo, "two", config("two", "instance_group [ { count: 2 kind: KIND_CPU } ]"), TIMED_MODEL)
    write_model(repo, "other", config("other", "instance_group [ { kind: KIND_AUTO } ]"), TIMED_MODEL)
    write_model(
        repo,
        "batched_two",
        config("batched_two", "instance_group [ { count: 1 }, { count: 1 kind: KIND_MODEL } ]").replace(
            'backend: "python"', 'backend: "python"\n    dynamic_batching { }'
        ),
        TIMED_MODEL,
    )
    write_model(repo, "on_gpu", config("on_gpu", "instance_group [ { kind: KIND_GPU } ]"), TIMED_MODEL)
    write_model(repo, "gpu_one", config("gpu_one", "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]"), TIMED_MODEL)
    server = start_server(repos=[repo], args=["--exit-on-error=false", "--strict-readiness=false"])
    client = grpcclient.InferenceServerClient(server.url)
    yield server, client
    client.close()


def run_together(client: grpcclient.InferenceServerClient, models: list[str]) -> list[Any]:
    """Send one request to each model at once; results in the same order."""
    done: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    for i, model in enumerate(models):
        t = grpcclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_infer(model, [t], callback=lambda result, error, i=i: done.put((i, result, error)))
    results: list[Any] = [None] * len(models)
    for _ in models:
        i, result, error = done.get(timeout=30)
        assert error is None, error
        results[i] = result
    return results


def overlap(a: Any, b: Any) -> bool:
    (s1, e1), (s2, e2) = a.as_numpy("T"), b.as_numpy("T")
    return bool(s1 < e2 and s2 < e1)


def test_two_instances_run_two_requests_at_once(instance_server: Any) -> None:
    server, client = instance_server
    a, b = run_together(client, ["two", "two"])
    assert a.as_numpy("PID")[0] != b.as_numpy("PID")[0]
    assert overlap(a, b)
    assert len(server.worker_pids()) >= 5  # two + other + batched_two(2) instances


def test_two_models_run_at_once(instance_server: Any) -> None:
    _, client = instance_server
    a, b = run_together(client, ["two", "other"])
    assert overlap(a, b)


def test_instance_groups_with_the_dynamic_batcher(instance_server: Any) -> None:
    _, client = instance_server
    a, b = run_together(client, ["batched_two", "batched_two"])
    assert a.as_numpy("PID")[0] != b.as_numpy("PID")[0]
    assert overlap(a, b)
    kinds = sorted(r.as_numpy("KIND")[0] for r in (a, b))
    assert kinds == [b"CPU", b"MODEL"]


def test_auto_kind_becomes_cpu_without_gpus(instance_server: Any) -> None:
    _, client = instance_server
    cfg = client.get_model_config("other", as_json=True)["config"]
    assert [(g["kind"], g["count"]) for g in cfg["instance_group"]] == [("KIND_CPU", 1)]
    (result,) = run_together(client, ["other"])
    assert result.as_numpy("KIND")[0] == b"CPU"


def test_gpu_kind_without_gpus_fails_the_load(instance_server: Any) -> None:
    _, client = instance_server
    assert not client.is_model_ready("on_gpu")
    assert not client.is_model_ready("gpu_one")
    reasons = {m["name"]: m.get("reason", "") for m in client.get_model_repository_index(as_json=True)["models"]}
    assert reasons["on_gpu"] == "instance group on_gpu_0 of model on_gpu has kind KIND_GPU but no GPUs are available"
    assert reasons["gpu_one"].startswith(
        "instance group gpu_one_0 of model gpu_one specifies invalid or unsupported gpu id 1."
    )
