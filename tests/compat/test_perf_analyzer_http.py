"""HTTP load tools against Trireme: the real perf_analyzer with `-i http` (concurrency sweep 1..8, and with
--shared-memory system) and ApacheBench (`ab -k -c 5 -n 500 -p body.json`, the tutorials' load test)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.compat.test_perf_analyzer_stream import PERF_ANALYZER
from tests.conftest import copy_example, shm_entries
from tests.integration.http_models import LINEAR_CONFIG, LINEAR_PY

needs_perf_analyzer = pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed")


def perf_http(url: str, *args: str) -> str:
    """Run perf_analyzer over HTTP; returns its output after checking it succeeded without errors."""
    command = [PERF_ANALYZER, "-i", "http", "-u", url, "--measurement-mode", "count_windows"]
    command += ["--measurement-request-count", "50", "-s", "999", "--max-trials", "20", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=280)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Throughput:" in output and "error" not in output.lower(), output
    return output


def http_stats(http_url: str, model: str) -> dict[str, Any]:
    r = requests.get(f"http://{http_url}/v2/models/{model}/stats", timeout=30)
    return r.json()["model_stats"][0]["inference_stats"]


@pytest.mark.anchors
@pytest.mark.slow
@needs_perf_analyzer
def test_perf_analyzer_http_concurrency_sweep(start_server: Any, tmp_path: Path) -> None:
    copy_example(tmp_path, "identity_fp32")
    server = start_server(repos=[tmp_path])
    output = perf_http(server.http_url, "-m", "identity_fp32", "--concurrency-range", "1:8:1")
    for c in range(1, 9):
        assert f"Concurrency: {c}, throughput:" in output, output
    stats = http_stats(server.http_url, "identity_fp32")
    assert stats["success"]["count"] >= 8 * 50 and stats["fail"]["count"] == 0
    assert "Server:" in output and "Inference count:" in output  # it read our statistics over HTTP


@pytest.mark.anchors
@pytest.mark.slow
@needs_perf_analyzer
@pytest.mark.usefixtures("machine_wide_shm_names")  # perf_analyzer's segment names are machine-wide (conftest.py)
def test_perf_analyzer_http_system_shared_memory(start_server: Any, tmp_path: Path) -> None:
    before = shm_entries()
    copy_example(tmp_path, "identity_fp32_any")
    server = start_server(repos=[tmp_path])
    perf_http(
        server.http_url,
        "-m",
        "identity_fp32_any",
        "--shape",
        "INPUT0:16",
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "1024",
        "--concurrency-range",
        "1:8:1",
    )
    stats = http_stats(server.http_url, "identity_fp32_any")
    assert stats["success"]["count"] >= 100 and stats["fail"]["count"] == 0
    assert requests.get(f"http://{server.http_url}/v2/systemsharedmemory/status", timeout=30).json() == []
    assert {n for n in shm_entries() - before if n.startswith(("INPUT0", "OUTPUT0"))} == set()


@pytest.mark.skipif(shutil.which("ab") is None, reason="ApacheBench (ab, apache2-utils) is not installed")
def test_apache_bench_json_posts(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "linear" / "1").mkdir(parents=True)
    (repo / "linear" / "config.pbtxt").write_text(LINEAR_CONFIG)
    (repo / "linear" / "1" / "model.py").write_text(LINEAR_PY)
    server = start_server(repos=[repo])
    body = tmp_path / "body.json"
    data = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    body.write_text(json.dumps({"inputs": [{"name": "INPUT0", "shape": [3, 3], "datatype": "FP32", "data": data}]}))
    url = f"http://{server.http_url}/v2/models/linear/versions/1/infer"
    command = ["ab", "-k", "-c", "5", "-n", "500", "-p", str(body), "-T", "application/json", url]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"Complete requests:\s+500\b", run.stdout), run.stdout
    assert re.search(r"Failed requests:\s+0\b", run.stdout), run.stdout
    assert "Non-2xx responses" not in run.stdout, run.stdout
    assert re.search(r"Keep-Alive requests:\s+500\b", run.stdout), run.stdout
    stats = http_stats(server.http_url, "linear")
    assert stats["success"]["count"] == 500 and stats["fail"]["count"] == 0
