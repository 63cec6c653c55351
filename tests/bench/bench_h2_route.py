"""Issue 44 item 1, throughput: the gRPC echo on each HTTP/2 route, pinned, in interleaved rounds.

Servers (tests/bench/bench_cpu.py's kinds, started by its `start`, each pinned to CPU 0 with taskset):
`echo` (grpc.aio, generic handler, as Trireme registers), `echo_registered` (grpc.aio, registered methods),
`echo_native` (pygrpc-native), `echo_h2` (python-hyper's h2), `echo_own` (HTTP/2 framing of our own) and
`echo_own_mypyc` (the same compiled with mypyc; a default row when built, see tests/bench/h2_echo_server.py);
the last three are tests/bench/h2_echo_server.py. All serve the same handlers and protobuf classes.
perf_analyzer runs pinned to CPU 1 (`-i grpc`, 16 FP32 per request). Per round and concurrency the servers run in
rotating order; each is measured by tests/bench/servers.py `windowed_load`: after 2 s, over --window seconds,
requests/s as the server counts them (the echoes count ModelInfer calls in ModelStatistics), CPU µs per request
of the server process and of perf_analyzer (the client's cost per request differs by server: see the table's use
in docs/benchmarks.md) from /proc.
The instruction counts (the firm figure on a noisy machine) come from bench_cpu.py under callgrind:
`bench_cpu.py --servers echo echo_registered echo_native echo_h2 echo_own echo_own_mypyc --no-cpu`.

Usage: .venv/bin/python tests/bench/bench_h2_route.py [--rounds 3] [--window 6] [--concurrency 1 8]
       [--servers echo echo_registered echo_native echo_h2 echo_own echo_own_mypyc trireme trireme_native]
Prints a markdown table (medians; ratios to the grpc.aio echo of the same rounds) and each round on stderr.
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

from tests.bench.bench_cpu import ALL, MODELS, start, wait_ready  # noqa: E402
from tests.bench.bench_grpc_transports import client  # noqa: E402
from tests.bench.servers import free_port, stop, windowed_load  # noqa: E402

DEFAULT = ["echo", "echo_registered", "echo_native", "echo_h2", "echo_own"]
if list((ROOT / "tests" / "bench" / "h2echo").glob("own.*.so")):  # compiled: also that row
    DEFAULT.append("echo_own_mypyc")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--servers", nargs="+", default=DEFAULT, choices=ALL)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_h2_route_"))
    ports = {k: free_port() for k in args.servers}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for k in args.servers:
            procs[k] = start(k, work, ports[k], ["taskset", "-c", "0"])
        for k in args.servers:
            wait_ready(ports[k], procs[k], MODELS[k], 180)
        names = list(args.servers)
        for r in range(args.rounds):
            for c in args.concurrency:
                for k in names[r % len(names) :] + names[: r % len(names)]:
                    url = f"127.0.0.1:{ports[k]}"
                    res = windowed_load(
                        ports[k], MODELS[k], procs[k].pid, [client(url, "grpc", c, False)], window_s=args.window
                    )
                    got = {"ips": res["ips"], "cpu": res["core"] + res["children"], "client": res["clients"]}
                    got["busy"] = res["busy"]
                    results.setdefault((k, c), []).append(got)
                    print(f"round {r} c={c} {k}: {got}", file=sys.stderr, flush=True)
    finally:
        stop(procs.values())
    report(names, args.concurrency, results, args.rounds)


def report(
    names: list[str], concurrency: list[int], results: dict[tuple[str, int], list[dict[str, float]]], n: int
) -> None:
    def med(k: str, c: int, field: str) -> float:
        got = results.get((k, c), [])
        return statistics.median(g[field] for g in got) if got else 0.0

    print(f"\nmedians of {n} rounds; each server pinned to CPU 0, perf_analyzer to CPU 1\n")
    print(
        "| server | c | infer/s | CPU µs/req (server process) | perf_analyzer CPU µs/req | infer/s ÷ echo "
        "| CPU ÷ echo | machine busy CPUs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in concurrency:
        base_ips, base_cpu = med("echo", c, "ips"), med("echo", c, "cpu")
        for k in names:
            ips, cpu = med(k, c, "ips"), med(k, c, "cpu")
            r_ips = f"{ips / base_ips:.2f}" if base_ips else "-"
            r_cpu = f"{cpu / base_cpu:.2f}" if base_cpu else "-"
            client, busy = med(k, c, "client"), med(k, c, "busy")
            print(f"| {k} | {c} | {ips:,.0f} | {cpu:.0f} | {client:.0f} | {r_ips} | {r_cpu} | {busy:.2f} |")


if __name__ == "__main__":
    main()
