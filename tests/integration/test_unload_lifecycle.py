"""Unload while busy and load/unload cycles: in-flight requests finish, new ones get Triton's error, and no
worker process, file descriptor, /dev/shm segment or server memory is left behind."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service.ipc.arena import SEGMENT_PREFIX
from tests.integration.models import python_config
from tests.steady_load import tagged_config, tagged_model

MODEL = "tagged"


def _write(repo: Path) -> None:
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count=2))
    (repo / MODEL / "1" / "model.py").write_text(tagged_model(1))


def _infer(client: grpcclient.InferenceServerClient, delay_s: float = 0.0) -> np.ndarray:
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([delay_s], np.float32))
    return client.infer(MODEL, [x], client_timeout=60).as_numpy("OUTPUT0")


def _segments(pid: int) -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"{SEGMENT_PREFIX}{pid}_")}


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_no_workers(server: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while server.worker_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.worker_pids() == []


@pytest.fixture
def explicit(tmp_path: Path, start_server: Any) -> Any:
    repo = tmp_path / "repo"
    _write(repo)
    return start_server([repo], ["--model-control-mode=explicit", "--model-unload-timeout-secs=3"])


def test_unload_waits_for_in_flight_requests_and_refuses_new_ones(explicit: Any) -> None:
    server = explicit
    client = grpcclient.InferenceServerClient(server.url)
    client.load_model(MODEL)
    results: dict[int, Any] = {}

    def slow(k: int, delay_s: float) -> None:
        c = grpcclient.InferenceServerClient(server.url)
        try:
            results[k] = _infer(c, delay_s)[0]
        except InferenceServerException as e:
            results[k] = e
        c.close()

    # two requests running (one per instance); the third waits in the queue and must still be answered
    threads = [threading.Thread(target=slow, args=(k, 1.0)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    unloading = threading.Thread(target=client.unload_model, args=(MODEL,))
    unloading.start()
    time.sleep(0.2)
    with pytest.raises(InferenceServerException) as info:
        _infer(client)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert info.value.message() == f"Request for unknown model: '{MODEL}' has no available versions"
    assert {m.state for m in client.get_model_repository_index().models} == {"UNLOADING"}
    assert not client.is_model_ready(MODEL)
    unloading.join(30)
    for t in threads:
        t.join(30)
    assert time.monotonic() - t0 >= 0.5  # the unload waited for the requests
    assert results == {0: 1.0, 1: 1.0, 2: 1.0}
    (row,) = client.get_model_repository_index().models
    assert (row.state, row.reason) == ("UNAVAILABLE", "unloaded")
    _wait_no_workers(server)
    assert _segments(server.proc.pid) == set()
    client.unload_model(MODEL)  # unloading again, or a model never loaded, succeeds as in Triton
    client.unload_model("never_loaded")

    # a request still running when the unload timeout (3 s) passes fails with a clear error, not a hang
    client.load_model(MODEL)
    stuck = threading.Thread(target=slow, args=(9, 8.0))
    stuck.start()
    time.sleep(0.3)
    client.unload_model(MODEL)
    stuck.join(30)
    assert isinstance(results[9], InferenceServerException)
    assert "was unloaded before the request finished (unload timeout 3 s)" in results[9].message()
    _wait_no_workers(server)
    client.close()


def _cycles(server: Any, n: int) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    for _ in range(n):
        client.load_model(MODEL)
        assert _infer(client)[0] == 1.0
        client.unload_model(MODEL)
    client.close()


def _measure(server: Any) -> tuple[int, int, set[str], int]:
    _wait_no_workers(server)
    pid = server.proc.pid
    return len(server.worker_pids()), _fds(pid), _segments(pid), _rss_kib(pid)


def _check_leaks(explicit: Any, cycles: int) -> None:
    server = explicit
    _cycles(server, 3)  # warm: imports, gRPC channels, allocator pools
    workers0, fds0, shm0, rss0 = _measure(server)
    _cycles(server, cycles)
    workers1, fds1, shm1, rss1 = _measure(server)
    assert (workers1, shm1) == (workers0, shm0) == (0, set())
    assert fds1 <= fds0 + 2, (fds0, fds1)
    assert rss1 - rss0 < 5 * 1024, f"RSS grew by {(rss1 - rss0) / 1024:.1f} MiB over {cycles} cycles"


def test_load_unload_cycles_leave_nothing_behind(explicit: Any) -> None:
    _check_leaks(explicit, 10)


@pytest.mark.slow
def test_50_load_unload_cycles_leave_nothing_behind(explicit: Any) -> None:
    _check_leaks(explicit, 50)


ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [ {
  model_name: "tagged" model_version: -1
  input_map { key: "INPUT0" value: "IN" }
  output_map { key: "OUTPUT0" value: "OUT" }
} ] }
"""

BLS_CONFIG = python_config("caller", [("INPUT0", "TYPE_FP32", [1])], [("OUTPUT0", "TYPE_FP32", [3])])

BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            reply = pb_utils.InferenceRequest(
                model_name="tagged", requested_output_names=["OUTPUT0"], inputs=[x]
            ).exec()
            if reply.has_error():
                error = pb_utils.TritonError("BLS call failed: " + reply.error().message())
                out.append(pb_utils.InferenceResponse(error=error))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")]))
        return out
"""


def test_ensembles_and_bls_callers_of_an_unloaded_model_get_a_clear_error(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    _write(repo)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    (repo / "caller" / "1").mkdir(parents=True)
    (repo / "caller" / "config.pbtxt").write_text(BLS_CONFIG)
    (repo / "caller" / "1" / "model.py").write_text(BLS_MODEL)
    server = start_server([repo], ["--model-control-mode=explicit", "--load-model=*"])
    client = grpcclient.InferenceServerClient(server.url)

    def call(model: str, name: str, delay_s: float = 0.0) -> Any:
        x = grpcclient.InferInput(name, [1], "FP32")
        x.set_data_from_numpy(np.array([delay_s], np.float32))
        out = "OUT" if model == "ens" else "OUTPUT0"
        return client.infer(model, [x], client_timeout=30).as_numpy(out)

    assert call("ens", "IN")[0] == 1.0 and call("caller", "INPUT0")[0] == 1.0
    # a step already running when its model is unloaded finishes; the ensemble answers
    results: dict[str, Any] = {}
    t = threading.Thread(target=lambda: results.update(ens=call("ens", "IN", 1.0)))
    t.start()
    time.sleep(0.3)
    client.unload_model(MODEL)
    t.join(30)
    assert results["ens"][0] == 1.0
    for model, name in (("ens", "IN"), ("caller", "INPUT0")):
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            call(model, name)
        assert time.monotonic() - t0 < 10  # an answer, not a hang
        assert f"Request for unknown model: '{MODEL}' has no available versions" in info.value.message()
    client.close()
