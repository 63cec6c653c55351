"""Benchmark: identity requests of 16 B to 64 MiB, without and with system shared memory, Trireme vs Triton.

Both servers serve the same Python-backend model (service/example_models/identity_fp32_any, a plain Triton
model) and are measured by the real perf_analyzer (count windows) at each --concurrency (default 1), interleaved
in rounds (the server order rotates per round). --pin puts the servers (and their workers / stubs) on CPU 0 and
perf_analyzer on CPU 1. --grpc-transports runs one Trireme per gRPC transport (`--grpc-transport`, default h2
only). Needs tools/install-triton-tools.sh ($TRIREME_TOOLS/bin/...).

Usage: .venv/bin/python tests/bench/bench_shm.py [--rounds 2] [--sizes 16 1048576 16777216 67108864]
       [--concurrency 1 4] [--pin] [--transports wire shm] [--grpc-transports h2 native grpcio]
       [--window-ms 2000]
Prints a markdown table of medians per server, size and transport: infer/s, avg and p99 latency, CPU per
request of the server's process tree (server, workers, stubs: /proc around each run, divided by the requests the
server counted), and the median per-round ratio of each Trireme to Triton of infer/s (each round's Trireme against
that round's Triton).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import (  # noqa: E402
    free_port,
    inference_counts,
    perf_analyzer,
    start_trireme,
    start_triton,
    stop,
    tree_usage,
    wait_port,
)

MODEL = "identity_fp32_any"
ARENA = 256 << 20  # Trireme's default worker arena; Triton's Python-backend pool gets the same size


SERVER_PIN: list[str] = []  # taskset prefixes with --pin
CLIENT_PIN: list[str] = []


def start(name: str, repo: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """Start Trireme or real Triton on repo."""
    if name.startswith("trireme"):
        transport = name.partition("-")[2] or "grpcio"
        return start_trireme(repo, port, log, prefix=SERVER_PIN, extra_args=["--grpc-transport", transport])
    pool = [f"--backend-config=python,shm-default-byte-size={ARENA}"]
    return start_triton(repo, port, log, pool, prefix=SERVER_PIN)


def request_count(size: int) -> int:
    """Requests per measurement window: enough for small tensors, bounded for large ones."""
    return 300 if size <= 1 << 20 else (15 if size <= 16 << 20 else 5)


def perf(
    port: int, size: int, use_shm: bool, out: Path, concurrency: int = 1, attempts: int = 4, window_ms: int = 0
) -> dict[str, float]:
    """perf_analyzer at `concurrency` (count windows, or time windows of `window_ms`), retried when this noisy VM
    gives no stable window (looser each time); infer/s and avg/p50/p99 latency in µs."""
    if window_ms:
        windows = ["-p", str(window_ms)]
    else:
        windows = ["--measurement-mode", "count_windows", "--measurement-request-count", str(request_count(size))]
    extra = ["--shape", f"INPUT0:{size // 4}", *windows, "--max-trials", "8", "--percentile", "99"]
    if use_shm:
        extra += ["--shared-memory", "system", "--output-shared-memory-size", str(size)]
    stability = [["-s", str(100 * (attempt + 1))] for attempt in range(attempts)]
    row = perf_analyzer(MODEL, port, concurrency, stability, out, extra, timeout_s=600, prefix=CLIENT_PIN)
    ips = float(row["Inferences/Second"])
    # synchronous calls: the average latency is concurrency / throughput
    return {
        "ips": ips,
        "avg": 1e6 * concurrency / ips,
        "p50": float(row["p50 latency"]),
        "p99": float(row["p99 latency"]),
    }


def label(size: int) -> str:
    """16 B, 1 MiB, ..."""
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} B"


def main() -> None:
    """Interleave the servers in rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 1 << 20, 16 << 20, 64 << 20])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1])
    ap.add_argument("--transports", nargs="+", choices=("wire", "shm"), default=["wire", "shm"])
    ap.add_argument("--pin", action="store_true", help="servers on CPU 0, perf_analyzer on CPU 1 (taskset)")
    ap.add_argument("--window-ms", type=int, default=0, help="perf_analyzer time windows (-p) instead of counts")
    ap.add_argument("--grpc-transports", nargs="+", choices=("grpcio", "native", "h2"), default=["h2"])
    args = ap.parse_args()
    if args.pin:
        SERVER_PIN[:], CLIENT_PIN[:] = ["taskset", "-c", "0"], ["taskset", "-c", "1"]
    transports = [t == "shm" for t in args.transports]
    work = Path(tempfile.mkdtemp(prefix="bench_shm_"))
    repo = work / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "service" / "example_models" / MODEL, repo / MODEL)
    trireme = [f"trireme-{t}" for t in args.grpc_transports]
    names = (*trireme, "triton")
    ports = {n: free_port() for n in names}
    procs = {n: start(n, repo, ports[n], work / f"{n}.log") for n in names}
    results: dict[tuple[str, int, bool, int], list[dict[str, float]]] = {}
    ok = False
    try:
        for n, proc in procs.items():
            wait_port(ports[n], proc, timeout_s=120)
        time.sleep(3)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # each server leads one round in turn
            for size in args.sizes:
                for use_shm in transports:
                    for c in args.concurrency:
                        for n in order:
                            out = work / f"{n}_{size}_{use_shm}_{c}_{r}.csv"
                            before, count = tree_usage(procs[n].pid), inference_counts(ports[n], MODEL)[0]
                            res = perf(ports[n], size, use_shm, out, c, window_ms=args.window_ms)
                            after, requests = tree_usage(procs[n].pid), inference_counts(ports[n], MODEL)[0] - count
                            cpu_s = sum(a["cpu_s"] - before.get(q, a)["cpu_s"] for q, a in after.items())
                            res["cpu"] = cpu_s * 1e6 / max(requests, 1)
                            results.setdefault((n, size, use_shm, c), []).append(res)
                            print(
                                f"round {r} {label(size)} shm={use_shm} c={c} {n}: {res['ips']:.1f} infer/s "
                                f"avg {res['avg']:.0f} us, server tree CPU {res['cpu']:.0f} us/request",
                                file=sys.stderr,
                                flush=True,
                            )
        ok = True
    finally:
        stop(procs.values())
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}", file=sys.stderr)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(x[key] for x in rows)

    print(
        f"| size | transport | c | server | infer/s | Triton infer/s | ÷ Triton (median of {args.rounds}, range) |"
        " avg/p99 µs | Triton avg/p99 µs | CPU µs/request (server tree) | Triton's |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        for use_shm in transports:
            for c in args.concurrency:
                b = results[("triton", size, use_shm, c)]
                for n in trireme:
                    a = results[(n, size, use_shm, c)]
                    ratios = [x["ips"] / y["ips"] for x, y in zip(a, b, strict=True)]
                    print(
                        f"| {label(size)} | {'system shm' if use_shm else 'gRPC bytes'} | {c} | {n} |"
                        f" {med(a, 'ips'):.1f} | {med(b, 'ips'):.1f} | {statistics.median(ratios):.2f}"
                        f" ({min(ratios):.2f}-{max(ratios):.2f}) | {med(a, 'avg'):.0f}/{med(a, 'p99'):.0f} |"
                        f" {med(b, 'avg'):.0f}/{med(b, 'p99'):.0f} | {med(a, 'cpu'):.0f} | {med(b, 'cpu'):.0f} |"
                    )


if __name__ == "__main__":
    main()
