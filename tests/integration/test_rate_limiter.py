"""--rate-limit through a real server: instances of two models that share a resource never run at once beyond
its count (the models record when each execution starts and ends), explicit counts, and the load failure."""

from __future__ import annotations

import itertools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, write_model

# START/END: wall-clock seconds at which this execution began and ended (every instance on the same clock)
TIMED_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        start = time.time()
        time.sleep(0.4)
        end = time.time()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("START", np.array([start])),
                                            pb_utils.Tensor("END", np.array([end]))]) for _ in requests]
"""


def timed_config(name: str, need: int, count: int = 2) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    output [ {{ name: "START" data_type: TYPE_FP64 dims: [ 1 ] }}, {{ name: "END" data_type: TYPE_FP64 dims: [ 1 ] }} ]
    instance_group [ {{ kind: KIND_CPU count: {count}
                        rate_limiter {{ resources [ {{ name: "R" count: {need} }} ] priority: 1 }} }} ]
    """


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("rl_repo")
    write_model(repo, "model_a", timed_config("model_a", 1), TIMED_PY)
    write_model(repo, "model_b", timed_config("model_b", 1), TIMED_PY)
    write_model(repo, "greedy", timed_config("greedy", 3, count=1), TIMED_PY)
    return repo


def intervals(url: str, per_model: int = 4) -> list[tuple[float, float]]:
    """Send `per_model` concurrent requests to each of model_a and model_b; the execution intervals."""

    def one(model: str) -> tuple[float, float]:
        c = grpcclient.InferenceServerClient(url)
        try:
            inp = grpcclient.InferInput("IN", [1], "FP32")
            inp.set_data_from_numpy(np.ones(1, np.float32))
            r = c.infer(model, [inp], client_timeout=120)
            return float(r.as_numpy("START")[0]), float(r.as_numpy("END")[0])
        finally:
            c.close()

    models = ["model_a", "model_b"] * per_model
    with ThreadPoolExecutor(len(models)) as pool:
        return list(pool.map(one, models))


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_shared_resource_serialises_instances_of_two_models(start_server: Any, repo: Path) -> None:
    args = ["--rate-limit=execution_count", "--model-control-mode=explicit"]
    server = start_server([repo], [*args, "--load-model=model_a", "--load-model=model_b"])
    spans = intervals(server.url)
    assert most_at_once(spans) == 1, sorted(spans)  # R exists once (the most any instance asks for)
    ordered = sorted(spans)
    assert all(prev[1] <= cur[0] for prev, cur in itertools.pairwise(ordered))


def test_explicit_count_allows_that_many_and_refuses_an_instance_that_needs_more(start_server: Any, repo: Path) -> None:
    args = ["--rate-limit=execution_count", "--rate-limit-resource=R:2", "--model-control-mode=explicit"]
    server = start_server([repo], [*args, "--load-model=model_a", "--load-model=model_b"])
    spans = intervals(server.url)
    assert most_at_once(spans) == 2, sorted(spans)  # two copies of R: two of the four instances at once
    c = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.load_model("greedy")
        assert (
            'Resource count for "R" is limited to 2 which will prevent scheduling of one or more model instances, '
            "the minimum required count is 3" in e.value.message()
        )
        assert not c.is_model_ready("greedy")
        assert c.is_model_ready("model_a")  # the others keep serving
    finally:
        c.close()


def test_without_the_limiter_the_same_requests_overlap(start_server: Any, repo: Path) -> None:
    # the control of the first test: the limiter, not the test's timing, keeps the executions apart
    server = start_server([repo], ["--model-control-mode=explicit", "--load-model=model_a", "--load-model=model_b"])
    assert most_at_once(intervals(server.url)) >= 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--rate-limit-resource=R", "--rate-limit-resource option format is '<resource_name>:<count>:<device>'"),
        ("--rate-limit-resource=R:many", "Invalid option value. Got many"),
        ("--rate-limit=sometimes", "invalid argument for --rate-limit"),
    ],
)
def test_bad_flags_stop_the_server_with_tritons_message(flag: str, message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve", flag], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert message in out.stderr
