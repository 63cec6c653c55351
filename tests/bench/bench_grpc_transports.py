"""gRPC transports side by side: Trireme on grpcio, pygrpc-native and its own h2 (--grpc-transport), over HTTP, and
real Triton 2.51 over gRPC and HTTP, at each concurrency.

Four server processes, each pinned to CPU 0 with taskset (workers and Triton's Python stub inherit it): Trireme with
the default transport (its gRPC and HTTP ports both measured), Trireme with `--grpc-transport native`, with `--grpc-
transport h2`, and Triton. perf_analyzer runs pinned to CPU 1 (`-i grpc`, or `-i http` for the HTTP rows;
`--streaming` adds the ModelStreamInfer rows: on native they go through pygrpc-native's grpc.aio fallback). Per
round and concurrency the rows run in rotating order; each is measured by tests/bench/servers.py `windowed_load`:
after 2 s, over --window seconds, requests/s as the server counts them and CPU µs per request of the whole process
tree from /proc.

Model: the unbatched FP32 [-1] identity of tests/bench/models.py, 16 floats per request, one worker-process
instance. Usage: .venv/bin/python tests/bench/bench_grpc_transports.py [--rounds 3] [--window 6]
[--concurrency 1 8] [--streaming] [--no-triton]. Prints a markdown table (medians, ratios to Triton's gRPC in the
same rounds) and each round's figures on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_cpu import wait_ready  # noqa: E402
from tests.bench.models import MODEL, write_identity  # noqa: E402
from tests.bench.servers import ANCHORS, free_port, start_trireme, start_triton, stop, windowed_load  # noqa: E402

PIN = ["taskset", "-c", "0"]
CLIENT = ("taskset", "-c", "1")
RUN_ON = ["--measurement-mode", "time_windows", "-p", "3600000"]  # one hour-long window: runs until stopped
# row -> (server, protocol, streaming)
ROWS = {
    "trireme grpcio": ("grpcio", "grpc", False),
    "trireme native": ("native", "grpc", False),
    "trireme h2": ("h2", "grpc", False),
    "trireme http": ("grpcio", "http", False),
    "triton grpc": ("triton", "grpc", False),
    "triton http": ("triton", "http", False),
    "trireme grpcio stream": ("grpcio", "grpc", True),
    "trireme native stream": ("native", "grpc", True),
    "trireme h2 stream": ("h2", "grpc", True),
    "triton stream": ("triton", "grpc", True),
}


def client(url: str, protocol: str, concurrency: int, streaming: bool) -> list[str]:
    return [
        *CLIENT, str(ANCHORS / "bin" / "perf_analyzer"), "-m", MODEL, "-i", protocol, "-u", url,
        "--shape", "INPUT0:16", "--concurrency-range", f"{concurrency}:{concurrency}", *RUN_ON,
        *(["--streaming"] if streaming else []),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--streaming", action="store_true", help="also ModelStreamInfer rows")
    ap.add_argument("--no-triton", action="store_true")
    args = ap.parse_args()
    rows = [r for r in ROWS if (args.streaming or not ROWS[r][2]) and not (args.no_triton and "triton" in r)]
    work = Path(tempfile.mkdtemp(prefix="bench_transports_"))
    repo = work / "repo"
    write_identity(repo, MODEL)
    servers = sorted({ROWS[r][0] for r in rows})
    ports = {s: (free_port(), free_port()) for s in servers}  # (grpc, http)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for s in servers:
        grpc_port, http_port = ports[s]
        log = work / f"{s}.log"
        if s == "triton":
            procs[s] = start_triton(repo, grpc_port, log, http_port=http_port, prefix=PIN)
        else:
            extra = ["--grpc-transport", s]
            procs[s] = start_trireme(repo, grpc_port, log, extra_args=extra, http_port=http_port, prefix=PIN)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for s in servers:
            wait_ready(ports[s][0], procs[s], MODEL, 180)
        for r in range(args.rounds):
            for c in args.concurrency:
                for row in rows[r % len(rows) :] + rows[: r % len(rows)]:
                    s, protocol, streaming = ROWS[row]
                    grpc_port, http_port = ports[s]
                    url = f"127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
                    res = windowed_load(
                        grpc_port, MODEL, procs[s].pid, [client(url, protocol, c, streaming)], window_s=args.window
                    )
                    got = {"ips": res["ips"], "cpu": res["core"] + res["children"]}
                    results.setdefault((row, c), []).append(got)
                    print(f"round {r} c={c} {row}: {got}", file=sys.stderr, flush=True)
    finally:
        stop(procs.values())
    report(rows, args.concurrency, results, args.rounds)


def report(
    rows: list[str], concurrency: list[int], results: dict[tuple[str, int], list[dict[str, float]]], n: int
) -> None:
    def med(row: str, c: int, field: str) -> float:
        got = results.get((row, c), [])
        return statistics.median(g[field] for g in got) if got else 0.0

    print(f"\nmedians of {n} rounds; each server pinned to CPU 0, perf_analyzer to CPU 1\n")
    print("| row | c | infer/s | CPU µs/req (process tree) | infer/s ÷ Triton gRPC | CPU ÷ Trireme HTTP |")
    print("|---|---|---|---|---|---|")
    for c in concurrency:
        base, http = med("triton grpc", c, "ips"), med("trireme http", c, "cpu")
        for row in rows:
            ips, cpu = med(row, c, "ips"), med(row, c, "cpu")
            vs_triton = f"{ips / base:.2f}" if base else "-"
            vs_http = f"{cpu / http:.2f}" if http else "-"
            print(f"| {row} | {c} | {ips:,.0f} | {cpu:.0f} | {vs_triton} | {vs_http} |")


if __name__ == "__main__":
    main()
