"""The repository the reliability probes use, and starting Trireme or real Triton on it as a Target."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.bench.servers import ANCHORS, free_port
from tests.reliability.tally import Target

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("identity_fp32", "identity_fp32_any", "add_sub", "identity_bytes", "raise_error")
# `slow`: OUT = IN + 1 and PID = the process that ran it (the probe kills that one); `sleepy`: 1 s per batch
MODELS = {
    "slow": (
        """
        name: "slow"
        backend: "python"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        dynamic_batching { max_queue_delay_microseconds: 1000 }
        """,
        0.01,
    ),
    "sleepy": (
        """
        name: "sleepy"
        backend: "python"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 200000 }
        """,
        1.0,
    ),
}
MODEL_PY = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({sleep})
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            pid = np.full(x.shape, os.getpid(), np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1), pb_utils.Tensor("PID", pid)]))
        return out
"""


def build_repo(repo: Path) -> Path:
    """Example models plus `slow` and `sleepy`."""
    for name in EXAMPLES:
        shutil.copytree(ROOT / "service" / "example_models" / name, repo / name, dirs_exist_ok=True)
    for name, (config, sleep) in MODELS.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        (repo / name / "1" / "model.py").write_text(MODEL_PY.replace("{sleep}", str(sleep)))
    return repo


def start(kind: str, repo: Path, log: Path, extra: list[str] | None = None, timeout_s: float = 180) -> Target:
    """Trireme (`python -m service serve`) or real Triton 2.51 on repo, ready to serve."""
    grpc_port, http_port = free_port(), free_port()
    if kind == "trireme":
        cmd = [sys.executable, "-m", "service", "serve", "--model-repository", str(repo),
               "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
               "--http-address", "127.0.0.1", "--http-port", str(http_port),
               "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()),
               "--allow-client-shm=true"]  # fmt: skip
        ready = "Started GRPCInferenceService"
    else:
        cmd = [str(ANCHORS / "bin" / "tritonserver"), f"--model-repository={repo}", f"--grpc-port={grpc_port}",
               f"--http-port={http_port}", "--allow-metrics=false", "--exit-timeout-secs=30"]  # fmt: skip
        ready = "Started HTTPService"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = log.open("wb")
    proc = subprocess.Popen(cmd + (extra or []), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    target = Target(kind, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", proc, log, out)
    deadline = time.monotonic() + timeout_s
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(target)
            raise RuntimeError(f"{kind} did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    return target


def stop(target: Target, timeout_s: float = 60) -> int:
    """SIGTERM and wait (SIGKILL after timeout_s); the exit status."""
    children = target.children()
    if target.proc.poll() is None:
        target.proc.send_signal(signal.SIGTERM)
        try:
            target.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            target.proc.kill()
            target.proc.wait()
    for pid in children:  # a child that outlived its server (it should not) is not left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if target.log_file is not None:
        target.log_file.close()
    return int(target.proc.returncode)
