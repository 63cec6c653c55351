"""Triton's Model Analyzer, unchanged, drives Trireme: `model-analyzer profile --triton-launch-mode local
--triton-server-path <trireme>` starts Trireme itself, loads each config variant it writes (instance counts,
max batch size, dynamic batching) through the repository load API, measures each with perf_analyzer, and
writes its results table and summary report (docs/model_analyzer.md)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.servers import ANCHORS, ROOT, free_port
from tests.conftest import write_model

MODEL_ANALYZER = ANCHORS / "bin" / "model-analyzer"
PERF_ANALYZER = ANCHORS / "bin" / "perf_analyzer"
TRIREME = Path(sys.executable).parent / "trireme"  # the console script of `pip install -e .`
pytestmark = [
    pytest.mark.skipif(not os.access(MODEL_ANALYZER, os.X_OK), reason="model-analyzer is not installed"),
    pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed"),
    pytest.mark.skipif(not os.access(TRIREME, os.X_OK), reason="the trireme command is not installed"),
    pytest.mark.anchors,
    pytest.mark.slow,
]

CONFIG = """
name: "scale"
backend: "python"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""

# two variants next to the default config: 1 and 2 instances, max batch size 4, dynamic batching on
PROFILE = """
model_repository: {repo}
profile_models:
  scale:
    model_config_parameters:
      max_batch_size: [4]
      instance_group:
        - kind: KIND_CPU
          count: [1, 2]
      dynamic_batching: {{}}
    parameters:
      concurrency: [1, 2]
      batch_sizes: [1]
perf_analyzer_flags:  # a shared CI machine is noisy: accept looser stability than perf_analyzer's 10 %
  stability-percentage: 50
  max-trials: 5
  measurement-request-count: 100
"""


def test_a_tiny_sweep_runs_through_trireme(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "scale", CONFIG, MODEL)
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE.format(repo=repo))
    http, grpc, metrics = free_port(), free_port(), free_port()
    export = tmp_path / "results"
    cmd = [
        str(MODEL_ANALYZER), "profile", "-f", str(profile),
        "--triton-launch-mode", "local", "--triton-server-path", str(TRIREME),
        "--perf-analyzer-path", str(PERF_ANALYZER),
        "--triton-http-endpoint", f"127.0.0.1:{http}", "--triton-grpc-endpoint", f"127.0.0.1:{grpc}",
        "--triton-metrics-url", f"http://127.0.0.1:{metrics}/metrics",
        "--output-model-repository-path", str(tmp_path / "variants"), "--override-output-model-repository",
        "--export-path", str(export), "--checkpoint-directory", str(tmp_path / "checkpoints"),
        "--triton-output-path", str(tmp_path / "trireme.log"), "--run-config-search-disable",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the server Model Analyzer starts imports this tree
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    log = (tmp_path / "trireme.log").read_text(errors="replace") if (tmp_path / "trireme.log").exists() else ""
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-2000:]}\n{log[-3000:]}"
    assert "Profile complete. Profiled 3 configurations" in run.stdout + run.stderr, run.stdout[-3000:]
    with (export / "results" / "metrics-model-inference.csv").open() as f:
        rows = list(csv.DictReader(f))
    seen = {(r["Model Config Path"], r["Instance Group"], r["Concurrency"]) for r in rows}
    variants = (("scale_config_default", "1:CPU"), ("scale_config_0", "1:CPU"), ("scale_config_1", "2:CPU"))
    assert seen == {(variant, group, c) for variant, group in variants for c in ("1", "2")}, rows
    for row in rows:
        assert float(row["Throughput (infer/sec)"]) > 0 and float(row["p99 Latency (ms)"]) > 0, row
    summary = export / "reports" / "summaries" / "scale" / "result_summary.html"
    assert summary.exists() and "scale_config_" in summary.read_text()
    # each variant was loaded through Trireme's load API (explicit model control), then unloaded
    assert log.count("successfully loaded 'scale'") >= 3, log[-3000:]
    shutil.rmtree(tmp_path / "variants", ignore_errors=True)
