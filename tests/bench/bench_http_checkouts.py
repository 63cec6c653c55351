"""Benchmark: the HTTP front end of two Trireme checkouts side by side (before/after a change), CPU per request.

Each checkout's server (`python -m service serve` run from that checkout) is pinned to CPU 0 with its workers;
perf_analyzer `-i http` runs on CPU 1 and sends exactly --requests requests (`--request-count`) of the FP32
identity (`identity_fp32_any`, --shape elements) at c=1 and c=8, the two servers in alternating order per round.
Reported: the server process's own CPU time per request (/proc utime+stime; with its workers in brackets),
the measure that holds on a busy machine. perf_analyzer's throughput is printed per run but not summarised.

Usage: .venv/bin/python tests/bench/bench_http_checkouts.py OTHER_CHECKOUT [--rounds 3] [--requests 6000]
       [--shape 16]        (this checkout is the second server)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import ANCHORS, free_port, stop, tree_usage, wait_port  # noqa: E402

MODEL = "identity_fp32_any"


def start(checkout: Path, repo: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    http_port = free_port()
    cmd = [
        "taskset", "-c", "0", sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1",
        "--grpc-port", str(free_port()), "--http-address", "127.0.0.1", "--http-port", str(http_port),
        "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()), "--model-repository", str(repo),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, http_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", type=Path, help="the other checkout (e.g. a git worktree of the commit before)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--shape", type=int, default=16)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_http_checkouts_"))
    repo = work / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "service" / "example_models" / MODEL, repo / MODEL)
    checkouts = {"other": args.other.resolve(), "this": ROOT}
    servers = {name: start(path, repo, work / f"{name}.log") for name, path in checkouts.items()}
    os.sched_setaffinity(0, {1})  # perf_analyzer inherits CPU 1
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for proc, port in servers.values():
            wait_port(port, proc)
        time.sleep(2)
        for r in range(args.rounds):
            names = list(servers) if r % 2 == 0 else list(reversed(servers))
            for c in (1, 8):
                for name in names:
                    proc, port = servers[name]
                    before = tree_usage(proc.pid)
                    out = subprocess.run(
                        [str(ANCHORS / "bin" / "perf_analyzer"), "-m", MODEL, "-i", "http", "-u", f"127.0.0.1:{port}",
                         "--shape", f"INPUT0:{args.shape}", "--concurrency-range", f"{c}:{c}",
                         "--request-count", str(args.requests), "-p", "100000"],
                        capture_output=True, text=True, timeout=600,
                    )  # fmt: skip
                    after = tree_usage(proc.pid)
                    spent = {p: a["cpu_s"] - before.get(p, {"cpu_s": 0.0})["cpu_s"] for p, a in after.items()}
                    own = spent.get(proc.pid, 0.0) * 1e6 / args.requests
                    tree = sum(spent.values()) * 1e6 / args.requests
                    rows.setdefault((name, c), []).append((own, tree))
                    rate = [line.strip() for line in out.stdout.splitlines() if "Throughput" in line]
                    print(f"round {r} c={c} {name}: {own:.0f} ({tree:.0f}) µs/request; {rate[-1:]}", file=sys.stderr)
    finally:
        stop([proc for proc, _ in servers.values()])
    print(f"\n| server CPU µs/request, {args.shape} floats | c | {args.other} | this checkout | this ÷ other |")
    print("|---|---|---|---|---|")
    for c in (1, 8):
        other = [x[0] for x in rows[("other", c)]]
        this = [x[0] for x in rows[("this", c)]]
        ot, th = (statistics.median(x[1] for x in rows[(n, c)]) for n in ("other", "this"))
        ratio = statistics.median(a / b for a, b in zip(this, other, strict=True))
        print(
            f"| | {c} | {statistics.median(other):.0f} ({ot:.0f}) | {statistics.median(this):.0f} ({th:.0f}) | "
            f"{ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
