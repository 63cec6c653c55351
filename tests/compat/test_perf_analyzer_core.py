"""The real perf_analyzer against Trireme over gRPC on the identity model: the issue's concurrency sweep."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_perf_analyzer_stream import PERF_ANALYZER, perf, success_and_fail
from tests.conftest import copy_example

pytestmark = pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed")


def test_perf_analyzer_concurrency_sweep(start_server: Any, tmp_path: Path) -> None:
    copy_example(tmp_path, "identity_fp32")
    server = start_server(repos=[tmp_path])
    output = perf(server.url, "-m", "identity_fp32", "--concurrency-range", "1:8:1")
    for c in range(1, 9):
        assert f"Concurrency: {c}, throughput:" in output, output
    ok, failed = success_and_fail(server.url, "identity_fp32")
    assert ok >= 8 * 50 and failed == 0
    # perf_analyzer read the server-side statistics (we advertise the "statistics" extension)
    assert "Server:" in output and "Inference count:" in output
