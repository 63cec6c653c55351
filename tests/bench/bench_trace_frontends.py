"""Request tracing with --frontend-processes: CPU per request with tracing off and on, N = 1 and N = 2.

Servers, each pinned to CPU 0 with its front ends and worker (taskset), real perf_analyzer pinned to CPU 1,
sending exactly --requests requests at --concurrency; servers in rotating order per round:
- `main-n2-off`: today's main (--main-root) with 2 front ends, tracing off (what N = 2 cost before this change);
- `n2-off`: this tree with 2 front ends, tracing off (the front ends read the core's tracing switch per request);
- `n1-off`: this tree with 1 front end, tracing off;
- `n1-rate1`, `n2-rate1`, `n1-rate100`, `n2-rate100`: this tree with 1 / 2 front ends, every request / one in 100
  traced (level=TIMESTAMPS, a trace file written every 1000 traces by the core).
CPU time is /proc utime+stime of the whole server tree (core, front ends, worker) per request.
Model: the unbatched FP32 [-1] identity of tests/bench/models.py, 16 floats.
Usage: .venv/bin/python tests/bench/bench_trace_frontends.py [--rounds 3] [--requests 4000] [--concurrency 8]
       [--main-root /work/main]
Prints a markdown table (medians over rounds) and each round's figures on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_cpu import pa, wait_ready  # noqa: E402
from tests.bench.bench_frontends import start  # noqa: E402
from tests.bench.models import MODEL, write_identity  # noqa: E402
from tests.bench.servers import free_port, stop, tree_usage, usage_per_request  # noqa: E402

# name: (kind, trace rate; 0: tracing off)
SERVERS = {
    "main-n2-off": ("main", 0), "n2-off": ("n2", 0), "n1-off": ("n1", 0),
    "n1-rate1": ("n1", 1), "n2-rate1": ("n2", 1), "n1-rate100": ("n1", 100), "n2-rate100": ("n2", 100),
}  # fmt: skip


def trace_flags(work: Path, name: str, rate: int) -> tuple[str, ...]:
    return (
        "--trace-config", f"triton,file={work / name}.json", "--trace-config", "triton,log-frequency=1000",
        "--trace-config", "level=TIMESTAMPS", "--trace-config", f"rate={rate}",
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--main-root", type=Path, default=Path("/work/main"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "repo"
        write_identity(repo)
        names = list(SERVERS)
        ports = {n: free_port() for n in names}
        procs = {}
        for n, (kind, rate) in SERVERS.items():
            extra = trace_flags(work, n, rate) if rate else ("--frontend-processes", "2") if kind == "main" else ()
            procs[n] = start(kind, repo, ports[n], work, args.main_root, ["taskset", "-c", "0"], extra)
        rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        try:
            for n in names:
                wait_ready(ports[n], procs[n], MODEL, 180)
                pa(ports[n], MODEL, args.concurrency, 1000)  # warm-up
            for r in range(args.rounds):
                for n in names[r % len(names) :] + names[: r % len(names)]:
                    before = tree_usage(procs[n].pid)
                    ips = pa(ports[n], MODEL, args.concurrency, args.requests) or 0.0
                    usage = usage_per_request(before, tree_usage(procs[n].pid), args.requests, procs[n].pid)
                    row = {"ips": ips, "cpu": sum(v["cpu_us"] for v in usage.values())}
                    rows[n].append(row)
                    print(f"round {r} {n}: {row}", file=sys.stderr, flush=True)
        finally:
            stop(procs.values())
        traced = {n: len(list(work.glob(f"{n}.json.*"))) for n, (_, rate) in SERVERS.items() if rate}
    base = statistics.median(r["cpu"] for r in rows["n2-off"])
    print(f"\nc={args.concurrency}, {args.requests} requests per run, {args.rounds} rounds (medians)\n")
    print("| server | CPU µs/request (server tree) | vs n2-off | requests/s |")
    print("|---|---|---|---|")
    for n in names:
        cpu = statistics.median(r["cpu"] for r in rows[n])
        ips = statistics.median(r["ips"] for r in rows[n])
        print(f"| {n} | {cpu:.0f} | {cpu / base:.2f}x | {ips:.0f} |")
    print(f"\ntrace files written (1000 traces each): {traced}")


if __name__ == "__main__":
    main()
