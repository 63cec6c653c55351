"""Shared pieces of the benchmark scripts: free ports, starting and stopping Trireme and real Triton, perf_analyzer
and the servers' inference statistics.

Trireme runs as `python -m service serve` from the repository root; real Triton and perf_analyzer come from
tools/install-triton-tools.sh (`$TRIREME_TOOLS/bin`, default ~/.cache/trireme/tools/bin).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from load.tools import tools_dir
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = tools_dir()  # tools/install-triton-tools.sh installs here ($TRIREME_TOOLS)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    """Wait until something listens on port (or the process dies)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"port {port} not open after {timeout_s} s")


def wait_started(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    """Wait until Trireme's log says the gRPC service started; kills the process if it does not in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()[-3000:]}")
        if "Started GRPCInferenceService" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server did not start")


def start_trireme(
    repo: Path,
    port: int,
    log: Path,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    http_port: int = 0,
    prefix: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Trireme (`python -m service serve`) on repo, gRPC on 127.0.0.1:port and HTTP on http_port (a free one when
    0), output to log; does not wait.

    `env` adds variables to the server's environment (e.g. TRIREME_STAGE_TRACE); `prefix` goes before the
    command (e.g. taskset or valgrind)."""
    cmd = [
        *prefix, sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(port),
        "--http-address", "127.0.0.1", "--http-port", str(http_port or free_port()),
        "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()),
        "--model-repository", str(repo), "--allow-client-shm=true", *extra_args,
    ]  # fmt: skip
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env)


def start_triton(
    repo: Path,
    port: int,
    log: Path,
    extra_args: Sequence[str] = (),
    http_port: int = 0,
    prefix: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Real Triton 2.51 on repo, gRPC on port, HTTP on http_port (a free one when 0), metrics on another free
    port, output to log; does not wait. `prefix` goes before the command (e.g. taskset)."""
    cmd = [
        *prefix,
        str(ANCHORS / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--grpc-port={port}",
        f"--http-port={http_port or free_port()}",
        f"--metrics-port={free_port()}",
        "--allow-metrics=false",
        *extra_args,
    ]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 30) -> None:
    """SIGTERM every process, then wait for each; one still running after timeout_s is killed."""
    procs = list(procs)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def perf_analyzer(
    model: str,
    port: int,
    concurrency: int,
    attempts: Sequence[Sequence[str]],
    out: Path,
    extra: Sequence[str] = (),
    timeout_s: float = 300,
    protocol: str = "grpc",
    prefix: Sequence[str] = (),
) -> dict[str, str]:
    """One perf_analyzer measurement over gRPC (or `protocol="http"`, port then the HTTP port); returns the first
    row of its CSV report.

    Tries each flag set in `attempts` in turn (this shared VM often finds no stable window, so callers pass
    looser stability settings for later attempts) and raises RuntimeError with the output of the last one.
    """
    res: subprocess.CompletedProcess[str] | None = None
    for i, flags in enumerate(attempts):
        if i:
            print(f"perf_analyzer attempt {i} failed; retrying", file=sys.stderr, flush=True)
        cmd = [
            *prefix, str(ANCHORS / "bin" / "perf_analyzer"), "-m", model, "-i", protocol, "-u", f"127.0.0.1:{port}",
            "--concurrency-range", f"{concurrency}:{concurrency}", *flags, "-f", str(out), *extra,
        ]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if res.returncode == 0 and out.exists():
            with out.open() as f:
                return next(csv.DictReader(f))
    assert res is not None, "no perf_analyzer attempt"
    raise RuntimeError(f"perf_analyzer failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")


def rounds_and_attempts(doc: str | None) -> tuple[argparse.Namespace, list[list[str]]]:
    """The usual `--rounds` / `--stability` command line of a benchmark script, and the perf_analyzer flag sets
    to try in turn: the given stability first, then looser ones for a busy machine."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stability", default="-p 3000 -s 20 -r 20")
    args = ap.parse_args()
    attempts = [args.stability.split(), ["-p", "3000", "-s", "50", "-r", "10"], ["-p", "2000", "-s", "100", "-r", "4"]]
    return args, attempts


def inference_counts(port: int, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of model from the server's statistics (tritonclient.grpc)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        s = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))
    finally:
        client.close()


def callgrind_total(script_args: Sequence[str]) -> int:
    """Instructions (Ir) of one whole run of `python script_args...` under callgrind (PYTHONHASHSEED=0, so dict and
    set layouts repeat). The one-process benches run themselves with few and with many requests and divide the
    difference: start-up cancels out."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, *script_args]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"no callgrind total in:\n{out[-2000:]}")
    return int(found.group(1))


def windowed_load(
    port: int,
    model: str,
    root_pid: int,
    clients: Sequence[Sequence[str]],
    warm_s: float = 2.0,
    window_s: float = 8.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the load generators `clients` (commands that keep sending until stopped, e.g. perf_analyzer with a large
    --request-count), and after warm_s measure over window_s: requests/s the server itself counted (its statistics)
    and the CPU µs per request of its process tree, "core" (root_pid) and "children" (the rest), from /proc read at
    the same two instants. The generators are then stopped.

    perf_analyzer's own figures are not used: in --request-count mode a run ends on whole-second steps, so requests /
    wall time lands on steps (e.g. 984, 1965, 2940/s for one server); several clients' time windows do not align."""
    running = [
        subprocess.Popen(list(cmd), env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for cmd in clients
    ]
    try:
        time.sleep(warm_s)
        c0, b0, m0 = sum(proc_usage(p.pid)["cpu_s"] for p in running), busy_seconds(), time.monotonic()
        n0, u0, t0 = inference_counts(port, model)[0], tree_usage(root_pid), time.monotonic()
        time.sleep(window_s)
        n1, u1, t1 = inference_counts(port, model)[0], tree_usage(root_pid), time.monotonic()
        c1, b1, m1 = sum(proc_usage(p.pid)["cpu_s"] for p in running), busy_seconds(), time.monotonic()
        failed = [p for p in running if p.poll() is not None]
        if failed:
            out = failed[0].communicate()[0].decode(errors="replace")
            raise RuntimeError(f"a load generator stopped before the window ended:\n{out[-1500:]}")
    finally:
        for p in running:  # killed: on SIGINT perf_analyzer would first finish its (hour-long) window
            if p.poll() is None:
                p.kill()
        for p in running:
            p.communicate()
    served = max(n1 - n0, 1)
    usage = usage_per_request(u0, u1, served, root_pid)
    return {
        "ips": served / (t1 - t0),
        "core": usage["server"]["cpu_us"],
        "children": sum(v["cpu_us"] for k, v in usage.items() if k != "server"),
        "usage": usage,  # per process: {"server" | "child <pid>": {cpu_us, wakeups, invol}}
        "clients": (c1 - c0) * 1e6 / served,  # the load generators' CPU µs per request
        "busy": (b1 - b0) / (m1 - m0),  # CPUs the whole machine kept busy meanwhile (everyone's work)
    }


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot, all CPUs (/proc/stat: user to softirq, less idle and
    iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:7]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


def proc_usage(pid: int) -> dict[str, float]:
    """CPU seconds (user+system) and context switches (voluntary, involuntary, summed over threads) of one pid."""
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return {"cpu_s": 0.0, "vol": 0.0, "invol": 0.0, "threads": 0.0}
    vol = invol = 0
    threads = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        threads += 1
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol += int(line.split()[1])
    io = {"syscr": 0, "syscw": 0}  # read(v) and write(v) system calls, all threads (libuv's socket I/O is these)
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            name, _, value = line.partition(": ")
            if name in io:
                io[name] = int(value)
    except OSError:
        pass
    return {
        "cpu_s": (int(fields[11]) + int(fields[12])) / ticks,
        "vol": vol,
        "invol": invol,
        "threads": threads,
        "syscr": io["syscr"],
        "syscw": io["syscw"],
    }


def tree_usage(pid: int) -> dict[int, dict[str, float]]:
    """proc_usage for pid and each descendant, by pid."""
    return {p: proc_usage(p) for p in process_tree(pid)}


def usage_per_request(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]], requests: int, root: int
) -> dict[str, dict[str, float]]:
    """Per-process deltas divided by `requests`: {"server"|"child <pid>": {cpu_us, wakeups, invol}}."""
    out = {}
    for p, a in after.items():
        b = before.get(p, {"cpu_s": 0.0, "vol": 0.0, "invol": 0.0})
        n = max(requests, 1)
        out["server" if p == root else f"child {p}"] = {
            "cpu_us": (a["cpu_s"] - b["cpu_s"]) * 1e6 / n,
            "wakeups": (a["vol"] - b["vol"]) / n,
            "invol": (a["invol"] - b["invol"]) / n,
            "reads": (a.get("syscr", 0) - b.get("syscr", 0)) / n,
            "writes": (a.get("syscw", 0) - b.get("syscw", 0)) / n,
        }
    return out
