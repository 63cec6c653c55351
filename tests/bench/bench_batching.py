"""Benchmark: dynamic batching, instance groups and the pb_utils stacking helper, with the real perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_batching.py [--rounds 2] [--skip-perf] [--stability "-p 2000 -s 30 -r 8"]
Needs perf_analyzer from tools/install-triton-tools.sh ($TRIREME_TOOLS/bin).

Scenarios, each measured in every round (interleaved, so VM speed swings hit both sides of a ratio alike):
- `fixed5_batched` vs `fixed5_plain`: execute costs a fixed 5 ms whatever the batch size; throughput at c=8
  over c=1, with and without `dynamic_batching {}` (target: >= 6x with, ~1x without).
- `sleep10_x1` vs `sleep10_x2`: execute sleeps 10 ms; 1 vs 2 instances at c=4 (target: ~2x).
- `echo_batched` vs `echo_plain`: identity FP32[16] at c=1: the batcher's fast path must cost nothing.
- `double_loop` vs `double_stacked`: the same vectorisable model written as a per-request loop and with
  `@pb_utils.batched`, c=8 with dynamic batching; plus an in-process micro-benchmark of the helper's overhead
  per request against a hand-written loop (no server).
Prints markdown tables (medians over rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, inference_counts, perf_analyzer, start_trireme, stop, wait_started  # noqa: E402
from tests.integration.models import elementwise_py  # noqa: E402

SLEEP_MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep({seconds})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy())]) for r in requests]
"""
LOOP_MODEL = elementwise_py("np.tanh(x) * 2", inp="IN", out="OUT")
STACKED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @pb_utils.batched
    def execute(self, inputs):
        return {"OUT": np.tanh(inputs["IN"]) * 2}
"""


def config(name: str, max_batch_size: int, extra: str) -> str:
    return textwrap.dedent(f"""
    name: "{name}"
    backend: "python"
    max_batch_size: {max_batch_size}
    input {{ name: "IN" data_type: TYPE_FP32 dims: [ 16 ] }}
    output {{ name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] }}
    {extra}
    """)


MODELS: dict[str, tuple[int, str, str]] = {
    "fixed5_batched": (8, "dynamic_batching { }", SLEEP_MODEL.replace("{seconds}", "0.005")),
    "fixed5_plain": (8, "", SLEEP_MODEL.replace("{seconds}", "0.005")),
    "fixed5_delay": (
        8,
        "dynamic_batching { max_queue_delay_microseconds: 2000 }",
        SLEEP_MODEL.replace("{seconds}", "0.005"),
    ),
    "sleep10_x1": (0, "instance_group [ { count: 1 kind: KIND_CPU } ]", SLEEP_MODEL.replace("{seconds}", "0.01")),
    "sleep10_x2": (0, "instance_group [ { count: 2 kind: KIND_CPU } ]", SLEEP_MODEL.replace("{seconds}", "0.01")),
    "echo_batched": (8, "dynamic_batching { }", SLEEP_MODEL.replace("time.sleep({seconds})", "pass")),
    "echo_plain": (8, "", SLEEP_MODEL.replace("time.sleep({seconds})", "pass")),
    "double_loop": (8, "dynamic_batching { }", LOOP_MODEL),
    "double_stacked": (8, "dynamic_batching { }", STACKED_MODEL),
}
# (label, model, concurrency)
RUNS = [
    ("fixed5 batched c1", "fixed5_batched", 1),
    ("fixed5 batched c8", "fixed5_batched", 8),
    ("fixed5 plain c1", "fixed5_plain", 1),
    ("fixed5 plain c8", "fixed5_plain", 8),
    ("fixed5 batched 2ms delay c8", "fixed5_delay", 8),
    ("sleep10 1 instance c4", "sleep10_x1", 4),
    ("sleep10 2 instances c4", "sleep10_x2", 4),
    ("echo dynamic_batching c1", "echo_batched", 1),
    ("echo no batching c1", "echo_plain", 1),
    ("loop model c8", "double_loop", 8),
    ("stacked model c8", "double_stacked", 8),
]
RATIOS = [
    ("dynamic batching: c8 / c1 (target >= 6)", "fixed5 batched c8", "fixed5 batched c1"),
    (
        "dynamic batching, 2 ms delay: c8 / c1 without batching (target >= 6)",
        "fixed5 batched 2ms delay c8",
        "fixed5 plain c1",
    ),
    ("no batching: c8 / c1 (target ~1)", "fixed5 plain c8", "fixed5 plain c1"),
    ("2 instances / 1 instance, c4 (target ~2)", "sleep10 2 instances c4", "sleep10 1 instance c4"),
    ("echo c1: dynamic_batching / none (target ~1)", "echo dynamic_batching c1", "echo no batching c1"),
    ("c8 with batching: stacked helper / loop", "stacked model c8", "loop model c8"),
]


def write_repo(repo: Path) -> None:
    for name, (mbs, extra, code) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config(name, mbs, extra))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def perf(model: str, port: int, concurrency: int, stability: list[str], out: Path) -> float:
    """One perf_analyzer measurement (retried with looser stability on this noisy VM); infer/s."""
    attempts = (stability, ["-p", "3000", "-s", "50", "-r", "10"], ["-p", "3000", "-s", "100", "-r", "3"])
    return float(perf_analyzer(model, port, concurrency, attempts, out)["Inferences/Second"])


def micro_stacking(batch: int, iterations: int = 3000) -> tuple[float, float]:
    """µs per request of the helper vs a hand-written loop, in-process (FP32[1,16] inputs)."""
    from service.worker.pb_utils import triton_python_backend_utils as pb

    requests = [
        pb.InferenceRequest(inputs=[pb.Tensor("IN", np.random.rand(1, 16).astype(np.float32))]) for _ in range(batch)
    ]

    def loop() -> list[pb.InferenceResponse]:
        out = []
        for r in requests:
            x = pb.get_input_tensor_by_name(r, "IN").as_numpy()  # type: ignore[union-attr]
            out.append(pb.InferenceResponse([pb.Tensor("OUT", np.tanh(x) * 2)]))
        return out

    def stacked() -> list[pb.InferenceResponse]:
        return pb.execute_batched(requests, lambda inputs: {"OUT": np.tanh(inputs["IN"]) * 2})

    results = {}
    for name, fn in (("loop", loop), ("stacked", stacked), ("loop2", loop), ("stacked2", stacked)):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        results[name] = (time.perf_counter_ns() - start) / iterations / batch / 1000
    return min(results["loop"], results["loop2"]), min(results["stacked"], results["stacked2"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-perf", action="store_true", help="only the in-process stacking micro-benchmark")
    ap.add_argument("--stability", default="-p 2000 -s 30 -r 8", help="perf_analyzer stability flags")
    ap.add_argument("--only", nargs="*", default=[], help="run only scenarios whose label contains one of these")
    args = ap.parse_args()
    runs = [run for run in RUNS if not args.only or any(word in run[0] for word in args.only)]

    print("## stacking helper micro-benchmark (in-process, µs per request)\n")
    print("| batch | hand-written loop | @pb_utils.batched | overhead per request |")
    print("|---|---|---|---|")
    for batch in (1, 8, 32):
        loop_us, stacked_us = micro_stacking(batch)
        print(f"| {batch} | {loop_us:.2f} | {stacked_us:.2f} | {stacked_us - loop_us:+.2f} |")
    if args.skip_perf:
        return

    results: dict[str, list[float]] = {label: [] for label, _, _ in RUNS}
    batches: dict[str, list[float]] = {label: [] for label, _, _ in RUNS}
    with tempfile.TemporaryDirectory(prefix="bench_batching_") as tmp:
        repo = Path(tmp) / "repo"
        write_repo(repo)
        port = free_port()
        log = Path(tmp) / "server.log"
        proc = start_trireme(repo, port, log)
        wait_started(proc, log)
        try:
            for r in range(args.rounds):
                for label, model, c in runs:
                    before = inference_counts(port, model)
                    ips = perf(model, port, c, args.stability.split(), Path(tmp) / "pa.csv")
                    after = inference_counts(port, model)
                    results[label].append(ips)
                    execs = max(1, after[1] - before[1])
                    batches[label].append((after[0] - before[0]) / execs)
                    print(f"round {r + 1}: {label}: {ips:.1f} infer/s", file=sys.stderr, flush=True)
        finally:
            stop([proc])

    print("\n## perf_analyzer (gRPC), infer/s, median over rounds\n")
    print("| run | infer/s | rounds | mean executed batch size |")
    print("|---|---|---|---|")
    for label, _, _ in runs:
        values = results[label]
        mean = statistics.median(batches[label])
        print(f"| {label} | {statistics.median(values):.1f} | {', '.join(f'{v:.0f}' for v in values)} | {mean:.2f} |")
    print("\n| ratio | median of per-round ratios | per round |")
    print("|---|---|---|")
    for name, top, bottom in RATIOS:
        if not results[top] or not results[bottom]:
            continue
        per_round = [a / b for a, b in zip(results[top], results[bottom], strict=True)]
        print(f"| {name} | {statistics.median(per_round):.2f} | {', '.join(f'{x:.2f}' for x in per_round)} |")


if __name__ == "__main__":
    main()
