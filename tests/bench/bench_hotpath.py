"""Benchmark of the hot path: Trireme (worker process and in-process) vs real Triton, perf_analyzer, interleaved.

The model is the unbatched FP32 identity (`max_batch_size: 0`, `[-1]`, one instance; tests/bench/models.py).
Cases (each at its concurrencies): 16 floats c=1 and c=8, 1 MiB through system shared memory c=1 and c=4,
1 MiB over the wire c=1. Four servers run side by side, each measured in turn inside every round (the order
rotates per round): Trireme with the default worker-process instance, real Triton 2.51, Trireme with the
in-process instance (`TRIREME_INSTANCE_MODE=in_process`; a separate server because that mode lowers the
server's GIL switch interval) and with `in_process_inline` (execute() on the server's event loop). CPU time
per request of every process of each server (/proc, utime+stime, divided by the requests the server counted)
is taken around each run.

Usage: .venv/bin/python tests/bench/bench_hotpath.py [--rounds 3] [--cases 16:1 16:8 1M-shm:1 ...]
       [--no-in-process]
Needs tools/install-triton-tools.sh (perf_analyzer and tritonserver in $TRIREME_TOOLS/bin).
Prints markdown tables: infer/s, p50/p99 and the per-round ratio to Triton (median and range over rounds), then
CPU µs per request per process.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.models import MODEL, MODEL_IN_PROCESS, MODEL_INLINE, write_identity  # noqa: E402
from tests.bench.servers import (  # noqa: E402
    free_port,
    inference_counts,
    perf_analyzer,
    start_trireme,
    start_triton,
    stop,
    tree_usage,
    usage_per_request,
    wait_port,
)

# perf_analyzer stability settings; --stability overrides (this VM often needs a loose threshold)
STABILITY = ["-p", "3000", "-s", "20", "-r", "20"]
MIB_FLOATS = (1 << 20) // 4
CASES = {  # name -> (elements, shared memory)
    "16": (16, False),
    "1M-shm": (MIB_FLOATS, True),
    "1M-wire": (MIB_FLOATS, False),
}
DEFAULT_CASES = ["16:1", "16:8", "1M-shm:1", "1M-shm:4", "1M-wire:1"]
TARGETS = {"16:1": 0.75, "16:8": 1.0, "1M-shm:1": 1.0, "1M-shm:4": 2.0, "1M-wire:1": 1.0}


def perf(model: str, port: int, case: str, concurrency: int, out: Path) -> dict[str, float]:
    """One perf_analyzer measurement; infer/s, p50 and p99 (µs). Retries once with a loose threshold."""
    elements, shm = CASES[case]
    extra = ["--percentile", "99", "--shape", f"INPUT0:{elements}"]
    if shm:
        extra += ["--shared-memory", "system", "--output-shared-memory-size", str(elements * 4)]
    # a busy VM often finds no stable window: looser each time, finally any 3 windows of 2 s
    attempts = (STABILITY, ["-p", "2000", "-s", "100", "-r", "6"], ["-p", "2000", "-s", "10000", "-r", "3"])
    row = perf_analyzer(model, port, concurrency, attempts, out, extra)
    return {"ips": float(row["Inferences/Second"]), "p50": float(row["p50 latency"]), "p99": float(row["p99 latency"])}


def main() -> None:
    """Interleave the servers in rounds and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="case:concurrency, case in " + ", ".join(CASES))
    ap.add_argument("--no-in-process", action="store_true", help="skip the in-process Trireme server")
    ap.add_argument("--stability", default=" ".join(STABILITY), help="perf_analyzer -p/-s/-r arguments")
    args = ap.parse_args()
    STABILITY[:] = args.stability.split()
    work = Path(tempfile.mkdtemp(prefix="bench_core_"))
    repo, repo_ip, repo_il = work / "repo", work / "repo_ip", work / "repo_il"
    write_identity(repo)
    write_identity(repo_ip, MODEL_IN_PROCESS, in_process=True)
    write_identity(repo_il, MODEL_INLINE, in_process="in_process_inline")
    servers = {"trireme": (repo, MODEL), "triton": (repo, MODEL)}
    if not args.no_in_process:
        servers["in-process"] = (repo_ip, MODEL_IN_PROCESS)
        servers["inline"] = (repo_il, MODEL_INLINE)
    ports = {name: free_port() for name in servers}
    procs = {}
    for name, (path, _) in servers.items():
        log = work / f"{name}.log"
        procs[name] = (
            start_triton(path, ports[name], log) if name == "triton" else start_trireme(path, ports[name], log)
        )
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    cpu: dict[tuple[str, str], list[dict[str, dict[str, float]]]] = {}
    try:
        for name, proc in procs.items():
            wait_port(ports[name], proc)
        time.sleep(3)
        names = list(servers)
        for r in range(args.rounds):
            for spec in args.cases:
                case, c = spec.split(":")
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    model, port, pid = servers[name][1], ports[name], procs[name].pid
                    n0, before = inference_counts(port, model)[0], tree_usage(pid)
                    try:
                        res = perf(model, port, case, int(c), work / f"{name}_{case}_{c}_{r}.csv")
                    except RuntimeError as e:  # reported, and that round of the case is left out
                        print(f"round {r} {spec} {name}: FAILED {str(e)[-300:]}", file=sys.stderr)
                        res = {}
                    after, n1 = tree_usage(pid), inference_counts(port, model)[0]
                    results.setdefault((name, spec), []).append(res)
                    cpu.setdefault((name, spec), []).append(usage_per_request(before, after, n1 - n0, pid))
                    print(f"round {r} {spec} {name}: {res['ips']:.0f} infer/s p50 {res['p50']:.0f} us", file=sys.stderr)
    finally:
        stop(procs.values())
        shutil.rmtree(work, ignore_errors=True)
    print_tables(args.rounds, args.cases, list(servers), results, cpu)


def print_tables(
    rounds: int,
    cases: list[str],
    names: list[str],
    results: dict[tuple[str, str], list[dict[str, float]]],
    cpu: dict[tuple[str, str], list[dict[str, dict[str, float]]]],
) -> None:
    """Markdown: throughput/latency with same-round ratios, then CPU per request per process."""
    others = [n for n in names if n != "triton"]
    head = " | ".join(f"{n} ÷ Triton (median, range)" for n in others)
    print(f"| case:c | target | {head} | " + " | ".join(f"{n} infer/s, p50/p99 µs" for n in names) + " |")
    print("|---" * (2 + len(others) + len(names)) + "|")
    for spec in cases:
        cells = []
        for n in others:
            pairs = zip(results[(n, spec)], results[("triton", spec)], strict=True)
            ratios = [a["ips"] / b["ips"] for a, b in pairs if a and b]  # rounds where both runs worked
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
        for n in names:
            rows = [x for x in results[(n, spec)] if x]
            med = {k: statistics.median(x[k] for x in rows) if rows else 0.0 for k in ("ips", "p50", "p99")}
            cells.append(f"{med['ips']:.0f}, {med['p50']:.0f}/{med['p99']:.0f}")
        print(f"| {spec} | ≥ {TARGETS.get(spec, 0):.2f} | " + " | ".join(cells) + " |")
    print(f"\nCPU µs per request, by process (median of {rounds} rounds; 'child' = worker / Python stub):\n")
    print("| case:c | " + " | ".join(names) + " |")
    print("|---" * (1 + len(names)) + "|")
    for spec in cases:
        cells = []
        for n in names:
            per_round = cpu[(n, spec)]
            server = statistics.median(u["server"]["cpu_us"] for u in per_round)
            children = statistics.median(sum(v["cpu_us"] for k, v in u.items() if k != "server") for u in per_round)
            cells.append(f"server {server:.0f} + children {children:.0f}")
        print(f"| {spec} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
