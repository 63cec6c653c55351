"""Benchmark: a TorchScript MLP (3 x Linear(512, 512)) served by the pytorch backend, with the real perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_torch.py [--rounds 2] [--stability "-p 2000 -s 30 -r 8"] [--threads 1]
Needs torch and perf_analyzer ($TRIREME_TOOLS/bin, from tools/install-triton-tools.sh).

Per round, interleaved: perf_analyzer at c=1 and c=16 (batch 1 per request) against `mlp_plain` (no batcher)
and `mlp_batched` (`dynamic_batching {}`), and the ceiling: the same module called directly in a loop in this
process (batch 1, and batch 16 counted per row). Each instance and the ceiling use `--threads` intra-op
threads. Prints a markdown table of medians over rounds: infer/s, p50/p99 latency (us), mean batch size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, inference_counts, perf_analyzer, start_trireme, stop, wait_started  # noqa: E402

WIDTH = 512


def mlp() -> torch.jit.ScriptModule:
    """Three Linear(512, 512) layers with ReLU, traced."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    module = torch.nn.Sequential(*layers).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.trace(module, torch.zeros(1, WIDTH))


def write_repo(repo: Path, threads: int) -> None:
    traced = mlp()
    for name, extra in (("mlp_plain", ""), ("mlp_batched", "dynamic_batching { }\n")):
        (repo / name / "1").mkdir(parents=True)
        traced.save(str(repo / name / "1" / "model.pt"))
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 32\n'
            f'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
            f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
            f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "{threads}" }} }}\n' + extra
        )


def perf(model: str, port: int, concurrency: int, stability: list[str], out: Path) -> tuple[float, float, float]:
    """One perf_analyzer measurement: (infer/s, p50 us, p99 us); retried with looser stability flags."""
    attempts = (stability, ["-p", "3000", "-s", "50", "-r", "10"], ["-p", "3000", "-s", "100", "-r", "4"])
    row = perf_analyzer(model, port, concurrency, attempts, out)
    return float(row["Inferences/Second"]), float(row["p50 latency"]), float(row["p99 latency"])


def direct(module: torch.jit.ScriptModule, batch: int, seconds: float = 3.0) -> tuple[float, float, float]:
    """The ceiling: module(x) in a loop here; (rows/s, p50 us, p99 us) per call."""
    x = torch.rand(batch, WIDTH)
    times = []
    with torch.inference_mode():
        for _ in range(20):
            module(x)
        end = time.perf_counter() + seconds
        while (t0 := time.perf_counter()) < end:
            module(x)
            times.append(time.perf_counter() - t0)
    qs = np.percentile(np.array(times) * 1e6, [50, 99])
    return batch * len(times) / sum(times), float(qs[0]), float(qs[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stability", default="-p 2000 -s 30 -r 8", help="perf_analyzer stability flags")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per instance and for the ceiling")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    module = mlp()
    results: dict[str, list[tuple[float, float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo, args.threads)
        port = free_port()
        log = Path(tmp) / "server.log"
        proc = start_trireme(repo, port, log)
        wait_started(proc, log)
        try:
            for rnd in range(args.rounds):
                for c in (1, 16):
                    for model in ("mlp_plain", "mlp_batched"):
                        before = inference_counts(port, model)
                        ips, p50, p99 = perf(model, port, c, args.stability.split(), Path(tmp) / "pa.csv")
                        after = inference_counts(port, model)
                        mean_batch = (after[0] - before[0]) / max(1, after[1] - before[1])
                        results.setdefault(f"{model} c={c}", []).append((ips, p50, p99, mean_batch))
                        sys.stderr.write(f"{model} c={c}: {ips:.0f} infer/s p50 {p50:.0f} p99 {p99:.0f}\n")
                    batch = 1 if c == 1 else 16
                    rows, p50, p99 = direct(module, batch)
                    results.setdefault(f"direct loop, batch {batch}", []).append((rows, p50, p99, float(batch)))
                sys.stderr.write(f"round {rnd + 1}/{args.rounds} done\n")
        finally:
            stop([proc])
    print(f"\n## TorchScript MLP 3x{WIDTH}, FP32[1,{WIDTH}] per request, {args.threads} intra-op thread(s)\n")
    print("| scenario | infer/s | p50 us | p99 us | mean batch |")
    print("|---|---|---|---|---|")
    for name, samples in results.items():
        med = [statistics.median(r[i] for r in samples) for i in range(4)]
        print(f"| {name} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} | {med[3]:.1f} |")


if __name__ == "__main__":
    main()
