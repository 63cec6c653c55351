"""The real perf_analyzer with --shared-memory system against Trireme: 16-float and 1 MiB tensors."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from load.tools import tool
from tests.conftest import shm_entries

PERF_ANALYZER = str(tool("perf_analyzer"))

pytestmark = [
    pytest.mark.anchors,
    # perf_analyzer's segment names are machine-wide: one such test at a time on this machine (tests/conftest.py)
    pytest.mark.usefixtures("machine_wide_shm_names"),
    pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed"),
]


@pytest.mark.parametrize(("elements", "output_bytes"), [(16, 102400), (262144, 1 << 20)])
def test_perf_analyzer_system_shared_memory(start_server: Any, elements: int, output_bytes: int) -> None:
    before = shm_entries()
    server = start_server()
    command = [
        PERF_ANALYZER,
        "-m",
        "identity_fp32_any",
        "-i",
        "grpc",
        "-u",
        server.url,
        "--shape",
        f"INPUT0:{elements}",
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        str(output_bytes),
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        "30",
        "-s",
        "999",
        "--max-trials",
        "10",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Throughput:" in output and "error" not in output.lower(), output

    client = grpcclient.InferenceServerClient(server.url)
    try:
        stats = client.get_inference_statistics("identity_fp32_any", as_json=True)["model_stats"][0]
        assert int(stats["inference_stats"]["success"]["count"]) >= 30
        assert "fail" not in stats["inference_stats"] or not stats["inference_stats"]["fail"].get("count")
        # perf_analyzer unregistered its regions on exit, and they are gone from /dev/shm
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
    finally:
        client.close()
    leftovers = {n for n in shm_entries() - before if n.startswith(("INPUT0", "OUTPUT0"))}
    assert leftovers == set()
