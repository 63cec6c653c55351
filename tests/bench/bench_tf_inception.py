"""Benchmark: Triton's optimization guide replayed on inception_graphdef (docs/optimization.md), with perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_tf_inception.py [--steps plain,batched,two,xla0,xla1] [--graphdef PATH]
       [--concurrency plain=1.2.3.4.8,batched=1.2.4.8] [--stability "-p 5000 -s 20 -r 10"]
Needs the `tensorflow` extra and perf_analyzer (tools/install-triton-tools.sh, $TRIREME_TOOLS/bin).

1. The model: tools/make_inception_graphdef.py (InceptionV3, random weights) unless --graphdef gives one.
2. The ceiling: the same GraphDef in a TF session in this process (threads as a one-instance worker gets), batch
   1 and 4, median of 20 runs.
3. Per step, a fresh server on a repository holding only that step's config (the guide's config.pbtxt plus
   the step's lines): load time (server start to ready), the worker's RSS after the run, and perf_analyzer
   `--percentile=95` at each concurrency: infer/s, p50/p95 latency and the mean batch size the server ran.
   `xla0`/`xla1` run with TF_XLA_FLAGS=--tf_xla_cpu_global_jit (on CPU XLA only clusters with that flag) and
   `optimization { graph { level: 0 | 1 } }`. `onnx` / `onnx_openvino` serve `--onnx` (the same network
   converted with tf2onnx) on onnxruntime without and with the guide's OpenVINO accelerator. `host_policy`: the
   guide's `--host-policy=gpu_0,numa-node=0 --host-policy=gpu_0,cpu-cores=...` (core 1 here) for the instance.
Prints markdown tables. `--overhead 3`: instead, the per-request overhead against the in-process session call
(perf_analyzer c=1 with -b 1 and -b 4, p50 latency, minus the in-process median; interleaved rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, inference_counts, perf_analyzer, process_tree, start_trireme, stop  # noqa: E402

OUTPUT = "InceptionV3/Predictions/Softmax"
CONCURRENCY = "plain=1.2.3.4.8,batched=1.2.4.8,batched_two=16,default=1.2.4"  # per step; --concurrency overrides
STEPS: dict[str, tuple[str, dict[str, str]]] = {
    "plain": ("", {}),
    "batched": ("dynamic_batching { }\n", {}),
    "two": ("instance_group [ { count: 2 } ]\n", {}),
    "batched_two": ("dynamic_batching { }\ninstance_group [ { count: 2 } ]\n", {}),
    "xla0": ("optimization { graph { level: 0 } }\n", {"TF_XLA_FLAGS": "--tf_xla_cpu_global_jit"}),
    "xla1": ("optimization { graph { level: 1 } }\n", {"TF_XLA_FLAGS": "--tf_xla_cpu_global_jit"}),
    # the same network as ONNX (--onnx; tf2onnx keeps TF's tensor names, ':0' included)
    "onnx": ("", {}),
    # the guide's NUMA step; this VM has one node and cores 0-1: pinning the instance to core 1 shows its effect
    "host_policy": ('instance_group [ { count: 1 kind: KIND_CPU host_policy: "gpu_0" } ]\n', {}),
    "onnx_openvino": (
        'optimization { execution_accelerators { cpu_execution_accelerator : [ { name : "openvino" } ] } }\n',
        {},
    ),
}
HOST_POLICY_ARGS = ["--host-policy=gpu_0,numa-node=0", "--host-policy=gpu_0,cpu-cores=1"]
ONNX_CONFIG = """name: "inception_graphdef"
platform: "onnxruntime_onnx"
max_batch_size: 128
input [ { name: "input:0" data_type: TYPE_FP32 dims: [ 299, 299, 3 ] } ]
output [ { name: "InceptionV3/Predictions/Softmax:0" data_type: TYPE_FP32 dims: [ 1001 ] } ]
"""


def session_call(graphdef: Path, threads: int) -> Any:
    """A callable running the GraphDef in a TF session in this process (as a one-instance worker configures it)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(graphdef.read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    session = tf.compat.v1.Session(graph=graph, config=config)
    return session.make_callable([f"{OUTPUT}:0"], ["input:0"])


def ceiling(call: Any, runs: int = 20) -> dict[int, float]:
    """Median ms per in-process session call for batch 1 and 4."""
    out = {}
    for batch in (1, 4):
        images = np.random.default_rng(0).random((batch, 299, 299, 3), dtype=np.float32)
        for _ in range(3):
            call(images)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            call(images)
            times.append((time.perf_counter() - start) * 1e3)
        out[batch] = statistics.median(times)
    return out


def overhead(graphdef: Path, work: Path, rounds: int, attempts: list[list[str]]) -> None:
    """Per-request cost of serving: perf_analyzer's median latency at c=1 (-b 1, -b 4) minus the in-process session
    call on the same batch, in interleaved rounds (the server idles while the in-process calls run)."""
    call = session_call(graphdef, max(1, os.cpu_count() or 1))
    repo = work / "overhead"
    write_config(repo, graphdef, "")
    port = free_port()
    proc, _ = serve(repo, port, work / "overhead.log", {})
    diffs: dict[int, list[float]] = {1: [], 4: []}
    try:
        for r in range(rounds):
            ms = ceiling(call, runs=10)
            for batch in (1, 4):
                row = perf_analyzer(
                    "inception_graphdef", port, 1, attempts, work / f"o{r}-{batch}.csv", extra=["-b", str(batch)]
                )
                served = int(row["p50 latency"]) / 1e3
                diffs[batch].append(served - ms[batch])
                print(f"round {r} batch {batch}: served {served:.1f} ms, in-process {ms[batch]:.1f} ms", flush=True)
    finally:
        stop([proc])
    for batch, values in diffs.items():
        print(f"overhead per request, batch {batch}: median {statistics.median(values):.1f} ms over {rounds} rounds")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def write_config(repo: Path, graphdef: Path, extra: str, onnx: Path | None = None) -> None:
    """repo/inception_graphdef: the GraphDef (hard link) and the guide's config.pbtxt plus `extra` (with `onnx`:
    that ONNX file under the same model name)."""
    model_dir = repo / "inception_graphdef"
    (model_dir / "1").mkdir(parents=True)
    if onnx is not None:
        os.link(onnx, model_dir / "1" / "model.onnx")
        (model_dir / "config.pbtxt").write_text(ONNX_CONFIG + extra)
        return
    os.link(graphdef, model_dir / "1" / "model.graphdef")
    sys.path.insert(0, str(ROOT / "tools"))
    import make_inception_graphdef as tool

    (model_dir / "config.pbtxt").write_text(
        tool.CONFIG.format(name="inception_graphdef", max_batch_size=128, extra=extra)
    )


def serve(
    repo: Path, port: int, log: Path, env: dict[str, str], args: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], float]:
    """A started Trireme on repo and the seconds from its start until it was ready."""
    started = time.monotonic()
    proc = start_trireme(repo, port, log, env=env, extra_args=args or [])
    while "Started GRPCInferenceService" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() - started > 600:
            stop([proc])
            raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return proc, time.monotonic() - started


def run_step(
    step: str, graphdef: Path, work: Path, concurrencies: list[int], attempts: list[list[str]], onnx: Path | None
) -> None:
    extra, env = STEPS[step]
    repo = work / step
    write_config(repo, graphdef, extra, onnx if step.startswith("onnx") else None)
    port = free_port()
    args = HOST_POLICY_ARGS if step == "host_policy" else []
    proc, load_s = serve(repo, port, work / f"{step}.log", env, args)
    try:
        rows = []
        for c in concurrencies:
            before = inference_counts(port, "inception_graphdef")
            row = perf_analyzer(
                "inception_graphdef", port, c, attempts, work / f"{step}-{c}.csv", extra=["--percentile=95"]
            )
            after = inference_counts(port, "inception_graphdef")
            batch = (after[0] - before[0]) / max(1, after[1] - before[1])
            rows.append((c, float(row["Inferences/Second"]), int(row["p50 latency"]), int(row["p95 latency"]), batch))
        workers = [p for p in process_tree(proc.pid) if p != proc.pid]
        rss = ", ".join(f"{rss_mb(p):.0f}" for p in workers)
    finally:
        stop([proc])
    print(f"\n### {step}: `{extra.strip() or '(the guide baseline config)'}` {env or ''}")
    print(f"load {load_s:.1f} s (server start to ready), worker RSS {rss} MB\n")
    print("| concurrency | infer/s | p50 ms | p95 ms | mean batch |\n|---|---|---|---|---|")
    for c, ips, p50, p95, batch in rows:
        print(f"| {c} | {ips:.1f} | {p50 / 1e3:.0f} | {p95 / 1e3:.0f} | {batch:.2f} |")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="plain,batched,two,xla0,xla1")
    ap.add_argument("--graphdef", type=Path, help="an existing inception model.graphdef (else one is built)")
    ap.add_argument("--concurrency", default="", help="step=c1.c2,... (over the defaults per step)")
    ap.add_argument("--stability", default="-p 5000 -s 20 -r 10")
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument("--onnx", type=Path, help="the model as ONNX (tf2onnx), for the steps onnx and onnx_openvino")
    ap.add_argument("--overhead", type=int, default=0, metavar="ROUNDS", help="only measure the per-request overhead")
    args = ap.parse_args()
    attempts = [args.stability.split(), ["-p", "5000", "-s", "50", "-r", "6"], ["-p", "5000", "-s", "1000", "-r", "3"]]
    given = [item.split("=") for item in args.concurrency.split(",") if item]
    ranges = dict(item.split("=") for item in CONCURRENCY.split(",")) | dict(given)
    with tempfile.TemporaryDirectory(prefix="bench-tf-") as tmp:
        work = Path(tmp)
        graphdef = args.graphdef
        if graphdef is None:
            subprocess.run(
                [sys.executable, str(ROOT / "tools" / "make_inception_graphdef.py"), "--repo", tmp], check=True
            )
            graphdef = work / "inception_graphdef" / "1" / "model.graphdef"
        if args.overhead:
            overhead(graphdef, work, args.overhead, attempts)
            return 0
        if not args.no_ceiling:
            ms = ceiling(session_call(graphdef, max(1, os.cpu_count() or 1)))
            print(
                f"TF in-process (one session, {os.cpu_count()} threads): batch 1 {ms[1]:.1f} ms, batch 4 {ms[4]:.1f} ms"
            )
        for step in args.steps.split(","):
            concurrencies = [int(v) for v in ranges.get(step, ranges["default"]).split(".")]
            run_step(step, graphdef, work, concurrencies, attempts, args.onnx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
