"""One backend directory and one repository on real Triton 2.51 and on Trireme: the same Python-based backends give
the same answers and the same args, a model parsing sys.argv with unittest.main passes on both, a host policy pins
the instance to the same core, and an unknown backend fails with the same message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.bench.servers import ANCHORS, ROOT, free_port, stop, wait_started
from tests.conftest import worker_children
from tests.integration.test_custom_backend import custom_setup  # noqa: F401 - the fixture is shared
from tests.integration.test_host_policy import thread_cores
from tests.integration.test_worker_identity import CONFIG as ARGV_CONFIG
from tests.integration.test_worker_identity import MODEL as ARGV_MODEL

TRITON = ANCHORS / "bin" / "tritonserver"
PYTHON_BACKEND = ANCHORS / "triton" / "backends" / "python"
CORE = max(os.sched_getaffinity(0))
pytestmark = [
    pytest.mark.skipif(not os.access(TRITON, os.X_OK), reason="tritonserver is not installed"),
    pytest.mark.anchors,
    pytest.mark.slow,
]


def _wait_triton(proc: subprocess.Popen[bytes], log: Path, http_port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if requests.get(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    raise TimeoutError(log.read_text(errors="replace")[-3000:])


def _children(proc: subprocess.Popen[bytes]) -> list[int]:
    return worker_children(proc.pid)


def _answers(port: int) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        x = np.arange(15, dtype=np.float32).reshape(3, 5) / 7
        t = grpcclient.InferInput("FEATURES", [3, 5], "FP32")
        t.set_data_from_numpy(x)
        wide = client.infer("linear_wide", [t]).as_numpy("SCORES")
        t = grpcclient.InferInput("X", [1], "INT32")
        t.set_data_from_numpy(np.array([1], np.int32))
        reporter = client.infer("reporter", [t]).as_numpy("INFO")
        t = grpcclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.ones(1, np.float32))
        argv = client.infer("argv_check", [t]).as_numpy("OUT")
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    finally:
        client.close()
    assert reporter is not None and argv is not None
    return {
        "wide": wide,
        "reporter": json.loads(reporter[0]),
        "argv": json.loads(argv[0]),
        "missing": index["no_such_backend"].get("reason", ""),
    }


@pytest.fixture
def both(custom_setup: Any, tmp_path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:  # noqa: F811
    backends, repo, _weights, _bias = custom_setup
    # Triton finds its python backend in the backend directory too (a copy: links may not leave the directory)
    shutil.copytree(PYTHON_BACKEND, backends / "python", symlinks=False)
    (repo / "argv_check" / "1").mkdir(parents=True)
    (repo / "argv_check" / "config.pbtxt").write_text(ARGV_CONFIG.replace("count: 2", "count: 1"))
    (repo / "argv_check" / "1" / "model.py").write_text(ARGV_MODEL)
    flags = [f"--backend-directory={backends}", f"--host-policy=cpu,cpu-cores={CORE}-{CORE}", "--exit-on-error=false"]
    triton_port, triton_http, trireme_port = free_port(), free_port(), free_port()
    triton_cmd = [str(TRITON), f"--model-repository={repo}", f"--grpc-port={triton_port}",
                  f"--http-port={triton_http}", f"--metrics-port={free_port()}", *flags]  # fmt: skip
    trireme_cmd = [sys.executable, "-m", "service", "--model-repository", str(repo), "--grpc-address", "127.0.0.1",
                   "--grpc-port", str(trireme_port), "--http-port", str(free_port()), "--metrics-port",
                   str(free_port()), *flags]  # fmt: skip
    with (tmp_path / "triton.log").open("wb") as triton_log, (tmp_path / "trireme.log").open("wb") as our_log:
        triton = subprocess.Popen(triton_cmd, stdout=triton_log, stderr=subprocess.STDOUT)
        trireme = subprocess.Popen(trireme_cmd, cwd=ROOT, stdout=our_log, stderr=subprocess.STDOUT)
    try:
        _wait_triton(triton, tmp_path / "triton.log", triton_http)
        wait_started(trireme, tmp_path / "trireme.log")
        theirs, ours = _answers(triton_port), _answers(trireme_port)
        theirs["cores"] = {c for pid in _children(triton) for c in thread_cores(pid)}
        ours["cores"] = {c for pid in _children(trireme) for c in thread_cores(pid)}
        yield theirs, ours
    finally:
        stop([triton, trireme])


def test_same_answers_args_argv_pinning_and_errors(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    theirs, ours = both
    np.testing.assert_allclose(ours["wide"], theirs["wide"], rtol=1e-6)
    assert ours["reporter"] == theirs["reporter"]  # same args, module name, model.py path and sys.argv
    assert ours["argv"] == theirs["argv"]
    assert ours["argv"]["ran"] == 1 and ours["argv"]["ok"] is True
    assert theirs["cores"] == ours["cores"] == {(CORE,)}
    expected = "unable to find backend library for backend 'nowhere', try specifying runtime on the model configuration"
    assert expected in theirs["missing"] and expected in ours["missing"]
