"""Latency of one request over HTTP at c=1: p50/p90/p99 of several servers side by side, or of one Trireme server
with its processes placed on chosen CPUs.

Servers (`--servers`, interleaved in rounds, the order rotated each round): `triton` (real Triton 2.51),
`trireme` (this checkout), `inline` (this checkout, the model's instance on the event loop:
TRIREME_INSTANCE_MODE=in_process_inline, i.e. without the worker process hop), or the path of another checkout
(its Trireme). Model: the unbatched FP32 identity of tests/bench/models.py, 16 floats, binary data both ways.
Client: real perf_analyzer `-i http`, c=1, three 2 s windows (`-p 2000 -s 100 -r 3`), unpinned.

`--placement`: one Trireme server of this checkout; each round measures it with the server and its worker free,
the server on CPU 0 and the worker on CPU 1, and both on CPU 0 (perf_analyzer stays free), by setting the
affinity of every thread of both processes between measurements.

Usage: .venv/bin/python tests/bench/bench_http_latency.py [--rounds 3] [--servers triton trireme inline PATH...]
       [--placement]
Prints a markdown table: medians over the rounds, and every round's p50.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.models import MODEL, MODEL_INLINE, write_identity  # noqa: E402
from tests.bench.servers import ANCHORS, free_port, process_tree, stop, wait_port  # noqa: E402

WINDOWS = ["-p", "2000", "-s", "100", "-r", "3"]
PLACEMENTS = {"free": ({0, 1}, {0, 1}), "server CPU 0, worker CPU 1": ({0}, {1}), "both on CPU 0": ({0}, {0})}


def start(kind: str, repo: Path, work: Path) -> tuple[subprocess.Popen[bytes], int, str]:
    """(process, HTTP port, model) of one server of `kind` (see the module doc)."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = (work / f"{Path(kind).name}_{http}.log").open("wb")
    if kind == "triton":
        cmd = [
            str(ANCHORS / "bin" / "tritonserver"), f"--model-repository={repo}", f"--grpc-port={grpc}",
            f"--http-port={http}", f"--metrics-port={metrics}", "--allow-metrics=false",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return proc, http, MODEL
    checkout = ROOT if kind in ("trireme", "inline") else Path(kind).resolve()
    cmd = [
        sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
        "--http-address", "127.0.0.1", "--http-port", str(http), "--metrics-address", "127.0.0.1",
        "--metrics-port", str(metrics), "--model-repository", str(repo), "--allow-client-shm=true",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, http, MODEL_INLINE if kind == "inline" else MODEL


def measure(port: int, model: str, out: Path) -> dict[str, float]:
    """One perf_analyzer run at c=1: infer/s and latency percentiles (µs)."""
    cmd = [
        str(ANCHORS / "bin" / "perf_analyzer"), "-m", model, "-i", "http", "-u", f"127.0.0.1:{port}",
        "--shape", "INPUT0:16", "--concurrency-range", "1:1", *WINDOWS, "-f", str(out),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode != 0 or not out.exists():
        raise RuntimeError(f"perf_analyzer failed:\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}")
    with out.open() as f:
        row = next(csv.DictReader(f))
    return {k: float(row[f"{k} latency"]) for k in ("p50", "p90", "p99")} | {"ips": float(row["Inferences/Second"])}


def pin(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of pid."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def run(args: argparse.Namespace, work: Path, repo: Path) -> dict[str, list[dict[str, float]]]:
    kinds = ["trireme"] if args.placement else args.servers
    started = {k: start(k, repo, work) for k in kinds}
    rows: dict[str, list[dict[str, float]]] = {}
    try:
        for proc, port, _ in started.values():
            wait_port(port, proc, 180)
        time.sleep(5)  # models loaded
        for r in range(args.rounds):
            if args.placement:
                proc, port, model = started["trireme"]
                workers = [p for p in process_tree(proc.pid) if p != proc.pid]
                for name, (server_cpus, worker_cpus) in PLACEMENTS.items():
                    pin(proc.pid, server_cpus)
                    for w in workers:
                        pin(w, worker_cpus)
                    rows.setdefault(name, []).append(measure(port, model, work / f"{r}.csv"))
                    print(f"round {r} {name}: {rows[name][-1]}", file=sys.stderr, flush=True)
                continue
            order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
            for k in order:
                _, port, model = started[k]
                rows.setdefault(k, []).append(measure(port, model, work / f"{r}.csv"))
                print(f"round {r} {k}: {rows[k][-1]}", file=sys.stderr, flush=True)
    finally:
        stop([proc for proc, _, _ in started.values()])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", nargs="+", default=["triton", "trireme", "inline"])
    ap.add_argument("--placement", action="store_true", help="one Trireme, its processes on chosen CPUs")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_http_latency_"))
    repo = work / "repo"
    write_identity(repo, MODEL)
    write_identity(repo, MODEL_INLINE, in_process="in_process_inline")
    rows = run(args, work, repo)
    print("\n| server | p50 µs | p90 µs | p99 µs | infer/s | p50 of each round |")
    print("|---|---|---|---|---|---|")
    for name, runs in rows.items():
        med = {k: statistics.median(x[k] for x in runs) for k in ("p50", "p90", "p99", "ips")}
        each = " / ".join(f"{x['p50']:.0f}" for x in runs)
        print(f"| {name} | {med['p50']:.0f} | {med['p90']:.0f} | {med['p99']:.0f} | {med['ips']:.0f} | {each} |")


if __name__ == "__main__":
    main()
