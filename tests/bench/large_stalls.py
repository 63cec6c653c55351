"""Where small requests wait while 100 MiB requests stream: per-request stage stamps and the event loop's CPU.

Starts one Trireme (example identity models) with TRIREME_STAGE_TRACE (service/ipc/stagetrace.py). Per round a
large client (a process of its own) sends `--big-count` 100 MiB requests back to back while a small client sends
16-float requests paced at `--small-rate` per second. Meanwhile a thread of this script reads the server's main
thread's (the event loop's) /proc/<pid>/task/<pid>/schedstat every millisecond: its time on a CPU and its time
runnable but waiting for one (the run queue).

Every small request is matched to its stage record (the small client sends one at a time, so exactly one small
record starts inside each client call; large records are told apart by their response encoding, which waits for
a 100 MiB copy on a thread) and its latency is split into segments:
- `client -> handler`: the client's send, grpc's receive and the loop's turn to run the handler;
- `handler -> frame sent`: decode, checks, scheduling, the frame to the worker;
- `worker hop in` / `worker hop out`: frame sent -> worker starts, worker sends -> the loop reads the response;
- `worker`: the worker's own time (decode, execute, encode);
- `response -> encoded`: the response back on the handler's task, encoded;
- `encoded -> client`: grpc's send and the client's receive.
Printed for the requests slower than `--slow-ms` and for all of them; then, for the slow requests'
`client -> handler` segments, how much of it the loop spent on a CPU (running: grpc's GIL-held copies of the
large messages, other requests), waiting in the run queue (runnable, no CPU free), or neither (sleeping or
waiting for the GIL).

Usage: .venv/bin/python tests/bench/large_stalls.py [--rounds 3] [--big-count 3] [--small-rate 500]
       [--slow-ms 5] [--own-session] [--grpc-transport native|h2]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_large import MODELS  # noqa: E402
from tests.bench.servers import free_port, start_trireme, stop, wait_port  # noqa: E402

SEGMENTS = (
    ("client -> handler", "t0", "handler"),
    ("handler -> frame sent", "handler", "frame_sent"),
    ("worker hop in", "frame_sent", "worker_start"),
    ("worker", "worker_start", "worker_send"),
    ("worker hop out", "worker_send", "response_frame"),
    ("response -> encoded", "response_frame", "encoded"),
    ("encoded -> client", "encoded", "t1"),
)


def big_client(url: str, big_mib: int, count: int, ready: Any, go: Any, results: Any) -> None:
    """`count` large requests back to back after one warm-up (a process of its own)."""
    import tritonclient.grpc as grpcclient

    big = np.ones((1, (big_mib << 20) // 4), np.float32)
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    client.infer("identity_fp32_any", [inp])
    ready.set()
    go.wait()
    for _ in range(count):
        client.infer("identity_fp32_any", [inp])
    client.close()
    results.put(count)


class LoopSampler:
    """The loop thread's cumulative on-CPU and run-queue ns, read every millisecond by a thread of this script."""

    def __init__(self, pid: int) -> None:
        self.path = f"/proc/{pid}/task/{pid}/schedstat"
        self.samples: list[tuple[int, int, int]] = []  # (time ns, on-CPU ns, run-queue ns)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            fields = Path(self.path).read_text().split()
            self.samples.append((time.monotonic_ns(), int(fields[0]), int(fields[1])))
            time.sleep(0.001)

    def busy_runs(self, min_ns: int) -> list[tuple[int, int]]:
        """(start, end) ns of the stretches longer than min_ns in which the loop was on a CPU at least 80 % of
        the time (schedstat advances a running thread's time at scheduler ticks, so stretches are tick-grained)."""
        runs: list[tuple[int, int]] = []
        start = None
        for (t0, c0, _), (t1, c1, _) in itertools.pairwise(self.samples):
            busy = t1 > t0 and (c1 - c0) >= 0.8 * (t1 - t0)
            if busy and start is None:
                start = t0
            elif not busy and start is not None:
                if t0 - start > min_ns:
                    runs.append((start, t0))
                start = None
        return runs

    def between(self, a: int, b: int) -> tuple[float, float]:
        """(on-CPU ns, run-queue ns) of the loop from the last sample before a to the first after b."""
        times = [s[0] for s in self.samples]
        i = max(0, bisect.bisect_right(times, a) - 1)
        j = min(len(times) - 1, bisect.bisect_left(times, b))
        return self.samples[j][1] - self.samples[i][1], self.samples[j][2] - self.samples[i][2]


def run_round(url: str, big_count: int, rate: float) -> list[tuple[int, int]]:
    """One round: (t0, t1) monotonic ns of every small request."""
    import tritonclient.grpc as grpcclient

    ctx = mp.get_context("spawn")
    ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    runner = ctx.Process(target=big_client, args=(url, 100, big_count, ready, go, results))
    runner.start()
    if not ready.wait(300):
        raise TimeoutError("the large client's warm-up did not finish")
    spans: list[tuple[int, int]] = []
    done = threading.Event()

    def small() -> None:
        c = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        slot = time.perf_counter()
        while not done.is_set():
            slot += 1 / rate
            delay = slot - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                slot = time.perf_counter()
            t0 = time.monotonic_ns()
            c.infer("identity_fp32", [x])
            spans.append((t0, time.monotonic_ns()))
        c.close()

    thread = threading.Thread(target=small)
    thread.start()
    time.sleep(0.5)
    go.set()
    results.get(timeout=600)
    done.set()
    thread.join()
    runner.join()
    return spans


def match(spans: list[tuple[int, int]], records: list[dict[str, int]]) -> list[dict[str, int]]:
    """Each small request's stage record, with the client's t0/t1 added (unmatched ones left out)."""
    small = sorted(
        (r for r in records if r.get("encoded", 0) - r.get("resumed", 0) < 3_000_000 and "worker_start" in r),
        key=lambda r: r["handler"],
    )
    starts = [r["handler"] for r in small]
    out = []
    for t0, t1 in spans:
        i = bisect.bisect_left(starts, t0)
        if i < len(small) and starts[i] <= t1:
            out.append({**small[i], "t0": t0, "t1": t1})
    return out


def large_edges(records: list[dict[str, int]]) -> tuple[list[int], list[int]]:
    """Handler and encoded stamps of the large requests (their response encoding waits for a 100 MiB copy)."""
    large = [r for r in records if r.get("encoded", 0) - r.get("resumed", 0) >= 3_000_000]
    return sorted(r["handler"] for r in large), sorted(r["encoded"] for r in large)


def near(stamps: list[int], lo: int, hi: int) -> bool:
    """Whether a stamp lies in [lo, hi]."""
    i = bisect.bisect_left(stamps, lo)
    return i < len(stamps) and stamps[i] <= hi


def report_runs(sampler: LoopSampler, records: list[dict[str, int]], slow: list[dict[str, int]]) -> None:
    """Where the loop's long busy stretches sit against the large requests, and how many slow requests met one."""
    handlers, encoded = large_edges(records)
    runs = sampler.busy_runs(3_000_000)
    recv = [r for r in runs if near(handlers, r[0], r[1] + 5_000_000)]  # ends just before a large handler
    send = [r for r in runs if r not in recv and near(encoded, r[0] - 5_000_000, r[1])]  # begins after encoded
    total = sum(b - a for a, b in runs)
    print(
        f"\nthe loop's busy stretches over 3 ms: {len(runs)}, {total / 1e6:.0f} ms in all, for"
        f" {len(handlers)} large requests; ending at a large request's handler (grpc's receive copy):"
        f" {len(recv)}, {sum(b - a for a, b in recv) / 1e6:.0f} ms; starting at its encoded response"
        f" (grpc's send copy): {len(send)}, {sum(b - a for a, b in send) / 1e6:.0f} ms"
    )
    hit = sum(1 for m in slow if any(a < m["handler"] and b > m["t0"] for a, b in runs))
    print(f"slow small requests whose client -> handler overlaps such a stretch: {hit} of {len(slow)}")


def report(matched: list[dict[str, int]], sampler: LoopSampler, slow_ns: int) -> None:
    """Print the segment table and the loop's share of the slow requests' `client -> handler` time."""
    slow = [m for m in matched if m["t1"] - m["t0"] > slow_ns]
    print(
        f"small requests matched to their stage record: {len(matched)}, slower than {slow_ns / 1e6:g} ms: {len(slow)}"
    )
    print("| segment | slow: mean ms | slow: share | all: mean ms | all: p99 ms |")
    print("|---|---|---|---|---|")
    total_slow = sum(m["t1"] - m["t0"] for m in slow) or 1
    for name, a, b in SEGMENTS:
        s = [m[b] - m[a] for m in slow]
        every = sorted(m[b] - m[a] for m in matched)
        p99 = every[min(len(every) - 1, int(len(every) * 0.99))] if every else 0
        print(
            f"| {name} | {statistics.mean(s) / 1e6 if s else 0:.2f} | {100 * sum(s) / total_slow:.0f} % |"
            f" {statistics.mean(every) / 1e6 if every else 0:.3f} | {p99 / 1e6:.2f} |"
        )
    seg = cpu = wait = 0.0
    for m in slow:
        seg += m["handler"] - m["t0"]
        c, w = sampler.between(m["t0"], m["handler"])
        cpu, wait = cpu + c, wait + w
    if seg:
        print(
            f"\nslow requests, client -> handler: {seg / 1e6:.0f} ms in all; the loop thread meanwhile on a CPU"
            f" {cpu / 1e6:.0f} ms ({100 * cpu / seg:.0f} %), waiting for one {wait / 1e6:.0f} ms"
            f" ({100 * wait / seg:.0f} %) (sampled every ~1 ms, so the spans overlap their neighbours a little)"
        )


def main() -> None:
    """Run the rounds against one Trireme and print where the slow small requests waited."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-count", type=int, default=3)
    ap.add_argument("--small-rate", type=float, default=500)
    ap.add_argument("--slow-ms", type=float, default=5)
    ap.add_argument("--own-session", action="store_true", help="start the server in a session of its own")
    ap.add_argument("--grpc-transport", choices=("grpcio", "native", "h2"), default="grpcio")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="large_stalls_"))
    repo = work / "repo"
    for name in MODELS:
        shutil.copytree(ROOT / "service" / "example_models" / name, repo / name)
    trace = work / "stages.jsonl"
    port = free_port()
    prefix = ["setsid"] if args.own_session else []
    extra = ["--grpc-transport", args.grpc_transport]
    env = {"TRIREME_STAGE_TRACE": str(trace)}
    proc = start_trireme(repo, port, work / "trireme.log", env=env, extra_args=extra, prefix=prefix)
    spans: list[tuple[int, int]] = []
    try:
        wait_port(port, proc)
        time.sleep(3)
        sampler = LoopSampler(proc.pid)
        sampler.thread.start()
        for r in range(args.rounds):
            one = run_round(f"127.0.0.1:{port}", args.big_count, args.small_rate)
            lat = sorted(t1 - t0 for t0, t1 in one)
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6
            print(f"round {r}: {len(lat)} small requests, p99 {p99:.1f} ms", file=sys.stderr, flush=True)
            spans += one
        sampler.stopped.set()
        sampler.thread.join()
    finally:
        stop([proc])  # flushes the stage records (written at exit)
    records = [dict(json.loads(line)) for line in trace.read_text().splitlines()] if trace.exists() else []
    shutil.rmtree(work, ignore_errors=True)
    matched = match(spans, records)
    report(matched, sampler, int(args.slow_ms * 1e6))
    report_runs(sampler, records, [m for m in matched if m["t1"] - m["t0"] > args.slow_ms * 1e6])


if __name__ == "__main__":
    main()
