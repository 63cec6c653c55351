"""Where one request's time goes: stage timestamps, CPU per request per process and wake-ups, at c=1 and c=8.

Starts two Trireme servers on the unbatched FP32 identity model (tests/bench/models.py): one with
TRIREME_STAGE_TRACE set (stage timestamps, see service/ipc/stagetrace.py) and one without (CPU and context-switch
accounting from /proc, so tracing costs do not count). Load comes from the real perf_analyzer over gRPC.

Usage: .venv/bin/python tests/bench/breakdown.py [--concurrency 1 8] [--shape 16] [--shm] [--in-process]
       [--strace]
Prints markdown: per-stage median/p90 gap (µs) between consecutive stamps, the client's p50 latency beside the
server's handler->encoded time, and per process: CPU µs, voluntary context switches (wake-ups) and involuntary
ones per request. --strace adds `strace -c -f` syscall counts per request for the untraced server (slow: it
perturbs timing, only its counts are meaningful).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.models import MODEL, MODEL_IN_PROCESS, write_identity  # noqa: E402
from tests.bench.servers import (  # noqa: E402
    free_port,
    inference_counts,
    perf_analyzer,
    start_trireme,
    stop,
    tree_usage,
    usage_per_request,
    wait_port,
)

PA_FLAGS = ["-p", "2000", "-s", "50", "-r", "4"]


def load(model: str, port: int, c: int, shape: int, shm: bool, out: Path) -> dict[str, str]:
    """One perf_analyzer run (a few seconds); its CSV row."""
    extra = ["--shape", f"INPUT0:{shape}"]
    if shm:
        extra += ["--shared-memory", "system", "--output-shared-memory-size", str(shape * 4)]
    return perf_analyzer(model, port, c, [PA_FLAGS, ["-p", "2000", "-s", "200", "-r", "3"]], out, extra)


def stage_table(path: Path) -> tuple[list[tuple[str, float, float, float]], float, int]:
    """(gap label, median µs, p90 µs, share of requests) rows, median handler->encoded µs, request count."""
    gaps: dict[str, list[float]] = {}
    totals = []
    n = 0
    for line in path.read_text().splitlines():
        stamps = sorted(json.loads(line), key=lambda s: s[1])
        n += 1
        for (a, ta), (b, tb) in itertools.pairwise(stamps):
            gaps.setdefault(f"{a} → {b}", []).append((tb - ta) / 1000)
        names = dict(stamps)
        totals.append((names["encoded"] - names["handler"]) / 1000)
    rows = []
    for label, values in gaps.items():
        values.sort()
        rows.append((label, statistics.median(values), values[int(len(values) * 0.9)], len(values) / max(n, 1)))
    order = {}
    for line in path.read_text().splitlines()[:200]:
        for i, (a, b) in enumerate(zip(json.loads(line), json.loads(line)[1:], strict=False)):
            order.setdefault(f"{a[0]} → {b[0]}", i)
    rows.sort(key=lambda r: (order.get(r[0], 99), -r[3]))
    return rows, statistics.median(totals) if totals else 0.0, n


def strace_counts(pids: list[int], seconds: float) -> dict[str, int]:
    """Syscall counts of pids (all threads) over `seconds`, from strace -c -f."""
    cmd = ["strace", "-c", "-f", "-qq"] + [f"-p{p}" for p in pids]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    time.sleep(seconds)
    proc.send_signal(2)
    _, err = proc.communicate(timeout=30)
    counts = {}
    for line in err.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    return counts


def main() -> None:
    """Run the phases and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--shape", type=int, default=16, help="FP32 elements per request")
    ap.add_argument("--shm", action="store_true", help="inputs and outputs through system shared memory")
    ap.add_argument("--in-process", action="store_true", help="measure the in-process instance mode")
    ap.add_argument("--strace", action="store_true", help="also count syscalls with strace -c -f")
    args = ap.parse_args()
    model = MODEL_IN_PROCESS if args.in_process else MODEL
    work = Path(tempfile.mkdtemp(prefix="breakdown_"))
    repo = work / "repo"
    write_identity(repo, model, in_process=args.in_process)
    trace = work / "stages.jsonl"
    ports = {"traced": free_port(), "plain": free_port()}
    procs = {
        "traced": start_trireme(repo, ports["traced"], work / "traced.log", {"TRIREME_STAGE_TRACE": str(trace)}),
        "plain": start_trireme(repo, ports["plain"], work / "plain.log"),
    }
    try:
        for name, proc in procs.items():
            wait_port(ports[name], proc)
        time.sleep(2)
        label = (
            f"{args.shape} FP32" + (" via system shm" if args.shm else "") + (" in-process" if args.in_process else "")
        )
        for c in args.concurrency:
            trace.write_text("")
            row = load(model, ports["traced"], c, args.shape, args.shm, work / f"t{c}.csv")
            stages, server_us, n = stage_table(trace)
            print(f"\n### {label}, c={c}: stages ({n} traced requests)\n")
            print("| gap | median µs | p90 µs | share |\n|---|---|---|---|")
            for gap, med, p90, share in stages:
                if share >= 0.05:
                    print(f"| {gap} | {med:.0f} | {p90:.0f} | {share:.2f} |")
            print(
                f"\nclient p50 {float(row['p50 latency']):.0f} µs; server handler→encoded median {server_us:.0f} µs;"
                f" traced run {float(row['Inferences/Second']):.0f} infer/s"
            )
            pid = procs["plain"].pid
            before_n = inference_counts(ports["plain"], model)[0]
            before = tree_usage(pid)
            row = load(model, ports["plain"], c, args.shape, args.shm, work / f"p{c}.csv")
            after = tree_usage(pid)
            requests = inference_counts(ports["plain"], model)[0] - before_n
            usage = usage_per_request(before, after, requests, pid)
            print(f"\n{label}, c={c}, untraced: {float(row['Inferences/Second']):.0f} infer/s, {requests} requests\n")
            print("| process | CPU µs/request | wake-ups/request | involuntary/request |\n|---|---|---|---|")
            for proc_name, u in usage.items():
                print(f"| {proc_name} | {u['cpu_us']:.0f} | {u['wakeups']:.2f} | {u['invol']:.2f} |")
            if args.strace:
                counter = subprocess.Popen(
                    [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                     "from tests.bench.breakdown import load; from pathlib import Path; "
                     f"load({model!r}, {ports['plain']}, {c}, {args.shape}, {args.shm}, Path({str(work / 's.csv')!r}))",
                     str(ROOT)],
                )  # fmt: skip
                time.sleep(3)
                n0 = inference_counts(ports["plain"], model)[0]
                counts = strace_counts(list(after), 5.0)
                n1 = inference_counts(ports["plain"], model)[0]
                counter.wait()
                per = max(n1 - n0, 1)
                top = sorted(counts.items(), key=lambda kv: -kv[1])[:8]
                print(
                    f"\nsyscalls/request under strace ({per} requests): "
                    + ", ".join(f"{k} {v / per:.2f}" for k, v in top)
                )
    finally:
        stop(procs.values())
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
