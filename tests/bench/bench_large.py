"""Benchmark: small requests' latency while another client sends 100 MiB requests back to back, Trireme vs Triton.

Both servers serve the example identity models (identity_fp32 for the 16-float client, identity_fp32_any for the
large one). Per round and server: one client sends `--big-count` requests of `--big-mib` MiB (FP32) back to
back while another sends 16-float requests and records their latencies; the servers alternate per round.

Where the large client runs (`--big-client`):
- `thread` (the default, as first measured): a thread of this process, beside the small client's thread. Both
  share this process's GIL: tritonclient serialises and parses each 100 MiB message, and grpc copies it, with
  the GIL held (~40-100 ms each), so the small client's own process stalls it several times per large request,
  whatever the server.
- `process`: a process of its own, so the small client's latencies are the server's (two clients, as in
  production).

How the small client sends (`--small-rate`): back to back (0, the default), or paced at that many requests/s.
Back to back, a server with a faster small path answers more small requests in the same window, and the number
of requests slowed by a stall stays about the same, so its p99 (the 1 % slowest) is lower for that reason alone;
paced (e.g. 500/s, below what either server answers), every server is asked about as often per second and p99
says what share of the time small requests are held up.

Where the servers run (`--session`): `shared` (the default, as first measured) starts them in this script's
session; `own` starts each in a session of its own (`setsid`), as a server started by itself runs; `both` starts
every server both ways (`NAME` and `NAME/own`) and measures them in the same rounds. With Linux's scheduler
autogroups (sched_autogroup_enabled=1, as on the bench VM) a session is one scheduling group: shared, the server
competes for CPU inside the group the two clients are in; Trireme's workers start sessions of their own (own
groups either way), Triton's Python stubs stay in Triton's.

`--trireme-arg FLAG` adds a flag to every Trireme started (repeatable).

`--big-count 0` is the baseline: after its warm-up the large client sends nothing for 3 s while the small client
runs (the small requests' latency on the machine as it is, without large traffic).

`--variant NAME:KEY=VALUE[,KEY=VALUE...]` adds a Trireme started with extra environment variables (e.g. the
previous malloc settings, `old:MALLOC_MMAP_THRESHOLD_=67108864`), measured in the same rounds.

Usage: .venv/bin/python tests/bench/bench_large.py [--rounds 3] [--big-mib 100] [--big-count 3]
       [--big-client thread|process] [--small-rate 500] [--session shared|own|both] [--trireme-arg FLAG]
       [--variant NAME:KEY=VALUE,...] [--loop-cost 5]
Prints every round and a markdown table (medians over the rounds): small requests answered, their p50/p99/max
latency and how many took over 20 ms, the large round trip time, and how long this process itself was stalled
(the sum of the >3 ms delays of a thread sleeping 1 ms at a time: this process's GIL held by the large client's
thread, or no CPU for it). Then, per server, `--loop-cost` large round trips alone (0: none): CPU time and
minor page faults of the server's main thread (Trireme's event loop) and of the whole server process, from
/proc, the noise-free measure of what a large message costs the loop.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, start_trireme, start_triton, stop, wait_port  # noqa: E402

MODELS = ("identity_fp32", "identity_fp32_any")
BASELINE_S = 3.0  # --big-count 0: how long the small client runs alone


def big_requests(url: str, big_mib: int, count: int, ready: Any, go: Any, results: Any) -> None:
    """The large client: one warm-up request, `ready`, wait for `go`, then `count` requests back to back; puts
    the list of their durations (s) on `results`. Runs in a thread or in a process of its own."""
    import tritonclient.grpc as grpcclient

    big = np.ones((1, (big_mib << 20) // 4), np.float32)
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    client.infer("identity_fp32_any", [inp])  # warm-up
    ready.set()
    go.wait()
    durations = []
    if count == 0:  # the baseline: the small client alone, as long as about three large round trips take
        time.sleep(BASELINE_S)
    for _ in range(count):
        t0 = time.perf_counter()
        client.infer("identity_fp32_any", [inp])
        durations.append(time.perf_counter() - t0)
    client.close()
    results.put(durations)


def run_round(port: int, big_mib: int, big_count: int, big_client: str, small_rate: float = 0) -> dict[str, float]:
    """One measurement against the server on port; `small_rate` > 0 paces the small client (requests/s)."""
    import tritonclient.grpc as grpcclient

    url = f"127.0.0.1:{port}"
    ready: Any
    go: Any
    results: Any
    if big_client == "process":
        ctx = mp.get_context("spawn")
        ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
        runner: threading.Thread | Any = ctx.Process(
            target=big_requests, args=(url, big_mib, big_count, ready, go, results)
        )
    else:
        import queue

        ready, go, results = threading.Event(), threading.Event(), queue.SimpleQueue()
        runner = threading.Thread(target=big_requests, args=(url, big_mib, big_count, ready, go, results))
    runner.start()
    if not ready.wait(300):
        raise TimeoutError("the large client's warm-up did not finish")
    latencies: list[float] = []
    stop_small = threading.Event()

    def small() -> None:
        c = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        interval = 1 / small_rate if small_rate else 0.0
        slot = time.perf_counter()
        while not stop_small.is_set():
            if interval:  # paced: one request per slot, every server answers about as many
                slot += interval
                delay = slot - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                else:
                    slot = time.perf_counter()  # behind (a slow answer): start again from now, no burst
            t0 = time.perf_counter()
            c.infer("identity_fp32", [x])
            latencies.append(time.perf_counter() - t0)
        c.close()

    stalls: list[float] = []

    def probe() -> None:  # this process's own stalls (GIL held by another thread, or no CPU): 1 ms sleeps
        while not stop_small.is_set():
            t0 = time.perf_counter()
            time.sleep(0.001)
            late = time.perf_counter() - t0 - 0.001
            if late > 0.003:
                stalls.append(late)

    thread = threading.Thread(target=small)
    prober = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.5)
    prober.start()
    go.set()
    durations = results.get(timeout=600)
    stop_small.set()
    thread.join()
    prober.join()
    runner.join()
    latencies.sort()
    return {
        "n": len(latencies),
        "p50": statistics.median(latencies) * 1e3,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "max": latencies[-1] * 1e3,
        "over20": sum(1 for x in latencies if x > 0.020),
        "big": statistics.mean(durations) * 1e3 if durations else 0.0,
        "stall": sum(stalls) * 1e3,
    }


def _thread_stat(pid: int, tid: int | None = None) -> tuple[float, int]:
    """(CPU seconds, minor page faults) of a process (CPU in clock ticks), or of one of its threads (CPU from
    schedstat, in ns)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    if tid:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9, int(fields[7])
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def loop_cost(port: int, pid: int, big_mib: int, count: int) -> dict[str, float]:
    """Noise-free figures of `count` large round trips alone (after two for warm-up), medians per request: CPU
    ms and page faults of the server's main thread (Trireme's event loop; for Triton just its main thread) and
    of the whole server process."""
    import tritonclient.grpc as grpcclient

    big = np.ones((1, (big_mib << 20) // 4), np.float32)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    rows = []
    for i in range(count + 2):
        loop0, proc0 = _thread_stat(pid, pid), _thread_stat(pid)
        client.infer("identity_fp32_any", [inp])
        time.sleep(0.2)  # the server finishes sending and freeing
        loop1, proc1 = _thread_stat(pid, pid), _thread_stat(pid)
        if i >= 2:
            rows.append((loop1[0] - loop0[0], loop1[1] - loop0[1], proc1[0] - proc0[0], proc1[1] - proc0[1]))
    client.close()
    return {
        key: statistics.median(r[k] for r in rows) * (1e3 if k % 2 == 0 else 1)
        for k, key in enumerate(("loop_ms", "loop_faults", "proc_ms", "proc_faults"))
    }


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """'NAME:KEY=VALUE,KEY=VALUE' -> (NAME, {KEY: VALUE})."""
    name, _, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    if not name or not env:
        raise argparse.ArgumentTypeError(f"--variant wants NAME:KEY=VALUE[,KEY=VALUE...], got '{text}'")
    return name, env


def main() -> None:
    """Alternate the servers in rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-mib", type=int, default=100)
    ap.add_argument("--big-count", type=int, default=3)
    ap.add_argument("--big-client", choices=("thread", "process"), default="thread")
    ap.add_argument("--small-rate", type=float, default=0, help="small requests/s (0: back to back)")
    ap.add_argument("--session", choices=("shared", "own", "both"), default="shared")
    ap.add_argument("--trireme-arg", action="append", default=[], help="extra flag for the Trireme servers")
    ap.add_argument("--variant", type=parse_variant, action="append", default=[])
    ap.add_argument("--loop-cost", type=int, default=5, help="large requests alone per server for the CPU table")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_large_"))
    repo = work / "repo"
    for name in MODELS:
        shutil.copytree(ROOT / "service" / "example_models" / name, repo / name)
    arena = ["--backend-config=python,shm-default-byte-size=" + str(512 << 20)]
    ports: dict[str, int] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    sessions = ("shared", "own") if args.session == "both" else (args.session,)
    for session in sessions:
        # "own": the server (and so its workers or stubs) in a session of its own, as when it runs by itself;
        # "shared": in this script's session, so in its scheduler autogroup with both clients (see the docstring)
        pre = ["setsid"] if session == "own" else []
        tag = "/own" if session == "own" and len(sessions) > 1 else ""
        servers: list[tuple[str, dict[str, str] | None]] = [("trireme", {}), ("triton", None), *args.variant]
        for base, env in servers:
            name = base + tag
            ports[name] = free_port()
            log = work / f"{name.replace('/', '_')}.log"
            if env is None:
                procs[name] = start_triton(repo, ports[name], log, arena, prefix=pre)
            else:
                procs[name] = start_trireme(repo, ports[name], log, env=env, extra_args=args.trireme_arg, prefix=pre)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in procs}
    try:
        for name, proc in procs.items():
            wait_port(ports[name], proc)
        time.sleep(3)
        names = list(procs)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # each server goes first in turn
            for name in order:
                one = run_round(ports[name], args.big_mib, args.big_count, args.big_client, args.small_rate)
                rows[name].append(one)
                print(f"round {r} {name}: {one}", file=sys.stderr, flush=True)
        costs = {n: loop_cost(ports[n], procs[n].pid, args.big_mib, args.loop_cost) for n in names if args.loop_cost}
    finally:
        stop(procs.values())
        shutil.rmtree(work, ignore_errors=True)
    if args.rounds:
        pace = f"{args.small_rate:g}/s" if args.small_rate else "back to back"
        print(
            f"median of {args.rounds} rounds, large client: {args.big_client}, small client: {pace},"
            f" session: {args.session}"
        )
        print(
            "| server | small requests answered | small p50 ms | small p99 ms | small max ms | small > 20 ms |"
            f" {args.big_mib} MiB round trip ms | client process stalled ms |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name, res in rows.items():

            def med(key: str, res: list[dict[str, float]] = res) -> float:
                return statistics.median(x[key] for x in res)

            print(
                f"| {name} | {med('n'):.0f} | {med('p50'):.1f} | {med('p99'):.0f} | {med('max'):.0f} |"
                f" {med('over20'):.0f} | {med('big'):.0f} | {med('stall'):.0f} |"
            )
        print(
            "\nsmall p99 ms per round: " + "; ".join(f"{n} {[round(x['p99']) for x in res]}" for n, res in rows.items())
        )
    if args.loop_cost:
        print(f"\n{args.big_mib} MiB round trips alone, per request (median of {args.loop_cost}; process CPU in ticks)")
        print("| server | main thread CPU ms | main thread page faults | process CPU ms | process page faults |")
        print("|---|---|---|---|---|")
        for name, c in costs.items():
            cells = (c["loop_ms"], c["loop_faults"], c["proc_ms"], c["proc_faults"])
            print(f"| {name} | " + " | ".join(f"{x:.0f}" for x in cells) + " |")


if __name__ == "__main__":
    main()
