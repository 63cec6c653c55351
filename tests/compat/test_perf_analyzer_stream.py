"""The real perf_analyzer against Trireme with --streaming (identity model) and --sequence-length (sequences)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from load.tools import tool
from tests.conftest import copy_example, write_model
from tests.integration.test_stream_models import ACCUMULATE_PY, accumulate_config

PERF_ANALYZER = str(tool("perf_analyzer"))

pytestmark = pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed")


def write_repo(repo: Path) -> None:
    """identity_fp32 and a sequence accumulator (direct strategy, 4 slots)."""
    copy_example(repo, "identity_fp32")
    write_model(repo, "seq_acc", accumulate_config("seq_acc", 4), ACCUMULATE_PY)


def perf(url: str, *args: str) -> str:
    """Run perf_analyzer over gRPC; returns its output after checking it succeeded without errors."""
    command = [PERF_ANALYZER, "-i", "grpc", "-u", url, "--measurement-mode", "count_windows"]
    # -s 999: these tests check what perf_analyzer sees, not speed; on a loaded machine the default stability
    # rule ("Failed to obtain stable measurement") fails runs that were answered correctly
    command += ["--measurement-request-count", "50", "-s", "999", "--max-trials", "10", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Throughput:" in output and "error" not in output.lower(), output
    return output


def success_and_fail(url: str, model: str) -> tuple[int, int]:
    """(success count, fail count) of a model."""
    client = grpcclient.InferenceServerClient(url)
    try:
        s = client.get_inference_statistics(model).model_stats[0].inference_stats
        return s.success.count, s.fail.count
    finally:
        client.close()


def test_perf_analyzer_streaming_identity(start_server: Any, tmp_path: Path) -> None:
    write_repo(tmp_path)
    server = start_server(repos=[tmp_path])
    perf(server.url, "-m", "identity_fp32", "--streaming", "--concurrency-range", "4")
    ok, failed = success_and_fail(server.url, "identity_fp32")
    assert ok >= 50 and failed == 0


def test_perf_analyzer_sequences(start_server: Any, tmp_path: Path) -> None:
    write_repo(tmp_path)
    server = start_server(repos=[tmp_path])
    perf(server.url, "-m", "seq_acc", "--sequence-length", "10", "--concurrency-range", "4")
    perf(server.url, "-m", "seq_acc", "--sequence-length", "5", "--streaming", "--concurrency-range", "2")
    ok, failed = success_and_fail(server.url, "seq_acc")
    assert ok >= 100 and failed == 0
