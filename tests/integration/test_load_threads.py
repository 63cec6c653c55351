"""--model-load-thread-count bounds how many models load at once; --model-load-retry-count retries a failed load.

Each model's initialize() records when it ran (wall-clock start and end in a file), so the test counts how many
overlapped: a real measure of concurrency that does not depend on how fast the machine is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import write_model

CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [1] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [1] }}]
instance_group [{{ count: 1, kind: KIND_CPU }}]
"""

SLOW_INIT = """
import json, os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        start = time.time()
        time.sleep(0.6)
        with open(os.path.join(args["model_repository"], "ran.json"), "w") as f:
            json.dump([start, time.time()], f)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""

FLAKY_INIT = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "tries")
        tries = int(open(marker).read()) + 1 if os.path.exists(marker) else 1
        open(marker, "w").write(str(tries))
        if tries < 3:
            raise RuntimeError(f"not yet (try {tries})")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


def _max_overlap(repo: Path, names: list[str]) -> int:
    spans = [json.loads((repo / n / "ran.json").read_text()) for n in names]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("threads", [1, 3])
def test_load_thread_count_bounds_concurrent_loads(tmp_path: Path, start_server, threads: int) -> None:  # type: ignore[no-untyped-def]
    names = [f"slow_{i}" for i in range(6)]
    for n in names:
        write_model(tmp_path, n, CONFIG.format(name=n), SLOW_INIT)
    server = start_server([tmp_path], [f"--model-load-thread-count={threads}"], wait=False)
    server.wait_ready(180)
    client = grpcclient.InferenceServerClient(server.url)
    assert all(client.is_model_ready(n) for n in names)
    assert 1 <= _max_overlap(tmp_path, names) <= threads  # unbounded, all six would overlap
    client.close()


def test_load_retry_count(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    for name in ("flaky", "flaky_no_retry"):
        write_model(tmp_path / name, name, CONFIG.format(name=name), FLAKY_INIT)
    retried = start_server([tmp_path / "flaky"], ["--model-load-retry-count=2"])
    client = grpcclient.InferenceServerClient(retried.url)
    assert client.is_model_ready("flaky")  # failed twice, loaded on the third try
    assert (tmp_path / "flaky" / "flaky" / "tries").read_text() == "3"
    assert retried.log().count("retrying the load of 'flaky' version 1") == 2
    client.close()

    once = start_server([tmp_path / "flaky_no_retry"], ["--exit-on-error=false"])  # Triton's default: no retry
    client = grpcclient.InferenceServerClient(once.url)
    assert not client.is_model_ready("flaky_no_retry")
    assert (tmp_path / "flaky_no_retry" / "flaky_no_retry" / "tries").read_text() == "1"
    rows = [m for m in client.get_model_repository_index().models if m.name == "flaky_no_retry"]
    assert "not yet (try 1)" in rows[0].reason
    client.close()


def test_bad_thread_count_is_refused(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server([tmp_path], ["--model-load-thread-count=0"], wait=False)
    assert server.proc.wait(60) != 0
    assert "--model-load-thread-count must be 1 or more" in server.log()
