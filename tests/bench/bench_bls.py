"""Benchmark: the cost of one BLS hop (a Python model calling an identity model) at c=1, Trireme vs real Triton.

Usage: .venv/bin/python tests/bench/bench_bls.py [--rounds 3] [--requests 2000]
Needs tools/install-triton-tools.sh (perf_analyzer and tritonserver in $TRIREME_TOOLS/bin).

Both servers load the same repository: `bls_identity` (Python, FP32[16] identity) and `bls_hop` (Python model
whose execute forwards its input to `bls_identity` with InferenceRequest.exec() and returns the result). The
hop cost is p50 latency(bls_hop) - p50 latency(bls_identity), measured with sequential tritonclient.grpc
calls (c=1; perf_analyzer found no stable window on this shared VM). Every round measures all four
(server, model) pairs back to back, so VM speed swings hit both sides alike. Prints the medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, start_trireme, start_triton, stop, wait_port  # noqa: E402

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

HOP_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            reply = pb_utils.InferenceRequest(
                model_name="bls_identity",
                inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0")],
                requested_output_names=["OUTPUT0"],
            ).exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")]))
        return responses
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def write_repo(repo: Path) -> None:
    """The two models, in Triton's layout (both servers read it unchanged)."""
    for name, source in (("bls_identity", IDENTITY_PY), ("bls_hop", HOP_PY)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name)))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))


def measure(model: str, port: int, requests: int) -> float:
    """Median latency (us) of `requests` sequential ModelInfer calls (c=1) with tritonclient.grpc."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        inp = grpcclient.InferInput("INPUT0", [16], "FP32")
        inp.set_data_from_numpy(np.arange(16, dtype=np.float32))
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            client.infer(model, [inp])
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000, help="sequential requests per model per round")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        repo = tmp / "repo"
        write_repo(repo)
        servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for label, start in (("trireme", start_trireme), ("triton", start_triton)):
                port = free_port()
                proc = start(repo, port, tmp / f"{label}.log")
                servers[label] = (proc, port)
                wait_port(port, proc)
            for _, port in servers.values():  # warm up both paths on each server
                for model in ("bls_identity", "bls_hop"):
                    measure(model, port, 200)
            samples: dict[str, list[float]] = {}
            for rnd in range(args.rounds):
                for label, (_, port) in servers.items():
                    lat = {}
                    for model in ("bls_identity", "bls_hop"):
                        lat[model] = measure(model, port, args.requests)
                        samples.setdefault(f"{label} {model} p50 latency us", []).append(lat[model])
                    samples.setdefault(f"{label} BLS hop us", []).append(lat["bls_hop"] - lat["bls_identity"])
                hop_ratio = samples["trireme BLS hop us"][-1] / samples["triton BLS hop us"][-1]
                samples.setdefault("hop cost trireme/triton", []).append(hop_ratio)
                print(f"round {rnd + 1}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in samples.items()), flush=True)
        finally:
            stop(proc for proc, _ in servers.values())
    print("\n| measure (c=1, FP32[16]) | median |\n|---|---|")
    for key, values in samples.items():
        print(f"| {key} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
