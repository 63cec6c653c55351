"""What grows with the tensor size on the system-shm path: CPU, minor page faults and system calls per request of
each process (server, worker / Triton's stub) at several sizes, through the same path.

For each size, perf_analyzer (`--shared-memory system`, `--request-count`, c=1, pinned to CPU 1; the server tree on
CPU 0) sends N and then 3N requests; the per-request figures are the difference of the two runs divided by 2N, so
what each perf_analyzer run costs once (registering and mapping its regions, the first touch of their pages) drops
out. CPU is the sum of the process's threads' run time (/proc/<pid>/task/*/schedstat), faults are minflt of
/proc/<pid>/stat. With --strace, each process is traced (`strace -c -f -p PID`) during one more run of N requests
and the calls per request are printed (strace slows the server: counts only).

A zero-copy path costs the same per request at every size, except the one copy of the output into the client's
region that the model's output needs (Triton's stub copies the input in and the output out).

Usage: .venv/bin/python tests/bench/bench_shm_sizes.py [--server trireme|triton] [--sizes 16 262144 4194304]
       [--requests 1000] [--strace] [-- extra Trireme flags, e.g. --grpc-transport native]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import ANCHORS, free_port, process_tree, start_trireme, start_triton, stop, wait_port  # noqa: E402

MODEL = "identity_fp32_any"


def counters(pid: int) -> tuple[int, int]:
    """(minor faults, run time in ns over all threads) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns += int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
    return int(fields[7]), ns


def perf(port: int, elements: int, requests: int) -> None:
    """One perf_analyzer run of exactly `requests` requests of `elements` FP32 through system shm."""
    cmd = [
        "taskset", "-c", "1", str(ANCHORS / "bin" / "perf_analyzer"), "-m", MODEL, "-i", "grpc",
        "-u", f"127.0.0.1:{port}", "--concurrency-range", "1:1", "--shape", f"INPUT0:{elements}",
        "--shared-memory", "system", "--output-shared-memory-size", str(4 * elements),
        "--request-count", str(requests),
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode:
        raise RuntimeError(f"perf_analyzer failed:\n{res.stdout[-2000:]}\n{res.stderr[-1000:]}")


def strace_counts(pids: list[int], port: int, elements: int, requests: int, work: Path) -> dict[int, str]:
    """System calls per request of each process during one run (strace -c -f), as 'name count/req' text."""
    tracers = [
        subprocess.Popen(
            ["strace", "-c", "-f", "-p", str(p), "-o", str(work / f"strace.{p}")], stderr=subprocess.DEVNULL
        )
        for p in pids
    ]
    time.sleep(1)
    try:
        perf(port, elements, requests)
    finally:
        for t in tracers:
            t.send_signal(signal.SIGINT)
            t.wait(timeout=60)
    out = {}
    for p in pids:
        calls = []
        for line in (work / f"strace.{p}").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                calls.append((int(parts[3]), parts[-1]))
        out[p] = " ".join(f"{name} {n / requests:.2f}" for n, name in sorted(calls, reverse=True) if n >= requests / 10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=("trireme", "triton"), default="trireme")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 262144, 4194304], help="FP32 elements")
    ap.add_argument("--requests", type=int, default=1000, help="N (sizes from 4M elements on: N / 5)")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("extra", nargs="*", help="extra Trireme flags (after --)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_shm_sizes_"))
    repo = work / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "service" / "example_models" / MODEL, repo / MODEL)
    port = free_port()
    pin = ["taskset", "-c", "0"]
    if args.server == "triton":
        pool = [f"--backend-config=python,shm-default-byte-size={256 << 20}"]
        proc = start_triton(repo, port, work / "server.log", pool, prefix=pin)
    else:
        proc = start_trireme(repo, port, work / "server.log", prefix=pin, extra_args=args.extra)
    print("| elements | bytes | process | CPU µs/request | minor faults/request | system calls/request (strace) |")
    print("|---|---|---|---|---|---|")
    try:
        wait_port(port, proc, timeout_s=120)
        time.sleep(3)
        for elements in args.sizes:
            n = args.requests if elements < 4 << 20 else max(args.requests // 5, 20)
            perf(port, elements, 50)  # warm-up
            pids = process_tree(proc.pid)
            deltas = []
            for k in (n, 3 * n):
                before = {p: counters(p) for p in pids}
                perf(port, elements, k)
                after = {p: counters(p) for p in pids}
                deltas.append({p: (after[p][0] - before[p][0], after[p][1] - before[p][1]) for p in pids})
            calls = strace_counts(pids, port, elements, n, work) if args.strace else {}
            for p in pids:
                faults = (deltas[1][p][0] - deltas[0][p][0]) / (2 * n)
                cpu = (deltas[1][p][1] - deltas[0][p][1]) / (2 * n) / 1e3
                name = "server" if p == proc.pid else f"child {p}"
                print(
                    f"| {elements} | {4 * elements} | {name} | {cpu:.0f} | {faults:.2f} | {calls.get(p, '-')} |",
                    flush=True,
                )
    finally:
        stop([proc])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
