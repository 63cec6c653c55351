"""The metrics endpoint next to real Triton 2.51: same traffic to both, then the same families (type and HELP),
the same label sets and the same counts; and perf_analyzer --collect-metrics runs clean against Trireme."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.bench.servers import ANCHORS, free_port, stop
from tests.conftest import copy_example
from tests.integration.metrics_scrape import Scrape, scrape

TRITON = ANCHORS / "bin" / "tritonserver"
PERF_ANALYZER = ANCHORS / "bin" / "perf_analyzer"
pytestmark = [
    pytest.mark.skipif(not os.access(TRITON, os.X_OK), reason="tritonserver is not installed"),
    pytest.mark.slow,
]
# server-wide families that depend on the machine, not on the traffic
MACHINE = {"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"}


def _traffic(url: str) -> None:
    """Identity requests of batch sizes 1, 2, 1, a raise_error request that makes execute raise and one whose
    error response the model returns (a success for Triton's counters)."""
    client = grpcclient.InferenceServerClient(url)
    for rows in (1, 2, 1):
        t = grpcclient.InferInput("INPUT0", [rows, 16], "FP32")
        t.set_data_from_numpy(np.ones((rows, 16), np.float32))
        client.infer("identity_fp32", [t])
    t = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    t.set_data_from_numpy(-np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("raise_error", [t])
    t.set_data_from_numpy(np.full((1, 3), np.nan, np.float32))
    with pytest.raises(InferenceServerException, match="input contains NaN"):
        client.infer("raise_error", [t])
    client.close()


@pytest.fixture(scope="module")
def triton_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    repo = tmp_path_factory.mktemp("repo")
    copy_example(repo, "identity_fp32", "raise_error")
    port, metrics_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("log") / "triton.log"
    cmd = [str(TRITON), f"--model-repository={repo}", f"--grpc-port={port}", f"--http-port={free_port()}",
           f"--metrics-port={metrics_port}"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "Started Metrics Service" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        _traffic(f"127.0.0.1:{port}")
        time.sleep(3)  # Triton's python backend reports some statistics after the response has gone out
        yield scrape(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop([proc])


@pytest.fixture(scope="module")
def trireme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import running_server

    repo = tmp_path_factory.mktemp("repo")
    copy_example(repo, "identity_fp32", "raise_error")
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as server:
        _traffic(server.url)
        yield server


def test_same_families_labels_and_counts(triton_scrape: Scrape, trireme: Any) -> None:
    ours = scrape(trireme.metrics_url)
    for name, family in triton_scrape.families.items():
        assert name in ours.families, f"Triton exports {name}, Trireme does not"
        assert ours.families[name].type == family.type, name
        assert ours.families[name].documentation == family.documentation, name
        if name in MACHINE:
            continue
        theirs_labels = sorted(sorted(s.labels) for s in family.samples)
        assert sorted(sorted(s.labels) for s in ours.families[name].samples) == theirs_labels, name
    for model in ("identity_fp32", "raise_error"):
        labels = {"model": model, "version": "1"}
        for name in ("nv_inference_request_success", "nv_inference_exec_count", "nv_inference_pending_request_count",
                     "nv_inference_count"):  # fmt: skip
            assert ours.value(name, **labels) == triton_scrape.value(name, **labels), (model, name)
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            expected = triton_scrape.value("nv_inference_request_failure", reason=reason, **labels)
            assert ours.value("nv_inference_request_failure", reason=reason, **labels) == expected, (model, reason)
    labels = {"model": "identity_fp32", "version": "1"}
    assert ours.value("nv_inference_count", **labels) == triton_scrape.value("nv_inference_count", **labels) == 4
    labels = {"model": "raise_error", "version": "1"}  # the returned error counts, the raising request does not
    assert triton_scrape.value("nv_inference_request_success", **labels) == 1
    assert triton_scrape.value("nv_inference_count", **labels) == 1


@pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed")
def test_perf_analyzer_collect_metrics(trireme: Any, tmp_path: Path) -> None:
    url = trireme.metrics_url.removeprefix("http://")
    out = subprocess.run(
        [str(PERF_ANALYZER), "-m", "identity_fp32", "-u", trireme.url, "-i", "grpc", "--collect-metrics",
         "--metrics-url", url, "--metrics-interval", "500", "--concurrency-range", "1:1", "-p", "1000",
         "-s", "999", "-r", "3", "-f", str(tmp_path / "pa.csv")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with urllib.request.urlopen(trireme.metrics_url, timeout=10) as r:
        assert b"nv_inference_request_success" in r.read()
