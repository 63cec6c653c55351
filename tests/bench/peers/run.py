"""Benchmark: Trireme against MLServer, LitServe, Ray Serve, BentoML and a plain FastAPI app, same model, same load.

Workloads (JSON over HTTP/1.1, one row per request, wrk as the load generator for every server):
- identity: 16 FP32 values echoed (Trireme: its example identity_fp32, a Python-backend worker process), c=1 and 8;
- sklearn: a logistic regression on 16 features (tests/bench/peers/common.py, trained at start-up from a fixed
  seed in every server) at c=32, each server's own batching off and on (Trireme: dynamic_batching; MLServer:
  adaptive batching; LitServe: max_batch_size; Ray Serve: @serve.batch; BentoML: batchable API; a plain FastAPI app
  has none, so it runs with batching off only).
Every server is pinned to one CPU (taskset -c 0) and wrk to the other (-c 1); servers are interleaved in rounds
(rotating order), and the ratios Trireme ÷ peer are taken within a round. Before measuring, one request checks the
answer (the identity values, the label the model gives here). Peers run from their own virtualenvs, made by
tools/install-peers.sh; a peer that is not installed is skipped with a message.

Usage: .venv/bin/python tests/bench/peers/run.py [--rounds 3] [--duration 8] [--servers trireme mlserver ...]
       [--out results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.bench.peers.launchers import (  # noqa: E402
    IDENTITY,
    SKLEARN,
    SKLEARN_BATCHED,
    Launch,
    Route,
    answer_values,
    installed,
    peer_launches,
    row_values,
    start,
    versions,
)
from tests.bench.servers import free_port, process_tree, tree_usage  # noqa: E402

SERVERS = ["trireme", "mlserver", "litserve", "rayserve", "bentoml", "fastapi"]
# (workload, concurrency) pairs, each a column of the results
LOADS = [(IDENTITY, 1), (IDENTITY, 8), (SKLEARN, 32), (SKLEARN_BATCHED, 32)]


def post(port: int, route: Route, timeout_s: float = 10) -> bytes:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{route.path}",
        data=json.dumps(route.body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return bytes(resp.read())


def wait_ready(proc: subprocess.Popen[bytes], port: int, route: Route, log: Path, timeout_s: float = 300) -> None:
    """Until the first workload's request succeeds (a server's health route can be ready before its model is)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            post(port, route)
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.5)
    raise TimeoutError(f"no answer on port {port} after {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")


def check_answer(port: int, name: str, workload: str, route: Route, expected: list[float]) -> None:
    got = answer_values(route, post(port, route))
    if len(got) != len(expected) or any(abs(a - b) > 1e-3 for a, b in zip(got, expected, strict=True)):
        raise RuntimeError(f"{name} {workload}: answered {got}, expected {expected}")


def wrk(port: int, route: Route, connections: int, duration_s: int, work: Path, cpus: str) -> dict[str, float]:
    """One wrk run (1 thread, `connections` connections, keep-alive); requests/s, latency percentiles, errors."""
    script = work / "post.lua"
    body = json.dumps(route.body).replace("\\", "\\\\").replace("'", "\\'")
    script.write_text(f"wrk.method = 'POST'\nwrk.headers['Content-Type'] = 'application/json'\nwrk.body = '{body}'\n")
    cmd = [
        "taskset", "-c", cpus, "wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "--timeout", "10s",
        "-s", str(script), f"http://127.0.0.1:{port}{route.path}",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


def parse_wrk(out: str) -> dict[str, float]:
    def unit_ms(value: str, unit: str) -> float:
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]

    result: dict[str, float] = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}  # type: ignore[union-attr]
    result["requests"] = float(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
        result[f"p{pct}_ms"] = unit_ms(m.group(1), m.group(2)) if m else float("nan")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["errors"] = float(non2xx.group(1) if non2xx else 0) + (sum(map(float, sock.groups())) if sock else 0)
    # wrk counts refused (non-2xx) answers as requests: keep the successful ones only
    result["rps"] *= max(result["requests"] - result["errors"], 0) / max(result["requests"], 1)
    return result


def stop_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's session, then SIGKILL whatever of its process tree is left (Ray's daemons included)."""
    pids = process_tree(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    for pid in [proc.pid, *pids]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def run_launch(
    launch: Launch, port: int, args: argparse.Namespace, work: Path, expected: dict[str, list[float]]
) -> dict[str, Any]:
    log = work / f"{launch.name}.log"
    proc = start(launch, log, args.server_cpu)
    results: dict[str, Any] = {}
    try:
        first = next(w for w, _ in LOADS if w in launch.routes)
        t0 = time.monotonic()
        wait_ready(proc, port, launch.routes[first], log)
        results["start_s"] = round(time.monotonic() - t0, 1)
        for workload, route in launch.routes.items():
            check_answer(port, launch.name, workload, route, expected[workload])
        for workload, c in LOADS:
            if workload not in launch.routes:
                continue
            route = launch.routes[workload]
            wrk(port, route, c, args.warmup, work, args.load_cpu)
            before = tree_usage(proc.pid)
            res = wrk(port, route, c, args.duration, work, args.load_cpu)
            after = tree_usage(proc.pid)
            cpu_s = sum(a["cpu_s"] - before.get(p, {"cpu_s": 0.0})["cpu_s"] for p, a in after.items())
            res["cpu_us"] = cpu_s * 1e6 / max(res["requests"], 1)
            results[f"{workload}@{c}"] = res
            print(f"    {launch.name:16} {workload}@c={c}: {res['rps']:8.0f} req/s  p50 {res['p50_ms']:.2f} ms  "
                  f"p99 {res['p99_ms']:.2f} ms  CPU {res['cpu_us']:.0f} µs/req  errors {res['errors']:.0f}",
                  flush=True)  # fmt: skip
    finally:
        stop_tree(proc)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8, help="seconds per measured wrk run")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of wrk before each measured run")
    ap.add_argument("--servers", nargs="+", default=SERVERS, choices=SERVERS)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--load-cpu", default="1")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk not found (apt-get install wrk)")
    servers = [s for s in args.servers if installed(s)]
    for s in set(args.servers) - set(servers):
        print(f"skipped {s}: not installed (tools/install-peers.sh {s})")
    print("versions:", versions(servers))

    from tests.bench.peers.common import build_model

    row = row_values()
    label = float(build_model().predict([row])[0])
    expected = {IDENTITY: row, SKLEARN: [label], SKLEARN_BATCHED: [label]}
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            order = servers[r % len(servers) :] + servers[: r % len(servers)]
            load = Path("/proc/loadavg").read_text().split()[:3]
            print(f"round {r + 1}: order {order}, load average {' '.join(load)}", flush=True)
            results: dict[str, Any] = {"load_before": load}
            for name in order:
                port = free_port()
                for launch in peer_launches(work, port, row, name):
                    try:
                        results.setdefault(name, {}).update(run_launch(launch, port, args, work, expected))
                    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
                        print(f"    {launch.name}: FAILED: {str(exc)[-1500:]}", flush=True)
                        results.setdefault("failed", {})[launch.name] = str(exc)[-1500:]
            results["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
            rounds.append(results)
            print_ratios(results, servers)
    summary(rounds, servers)
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rounds": rounds}, indent=1))


def print_ratios(results: dict[str, Any], servers: list[str]) -> None:
    """Trireme ÷ peer requests/s within this round, per workload."""
    base = results.get("trireme", {})
    for name in servers:
        if name == "trireme":
            continue
        cells = []
        for workload, c in LOADS:
            key = f"{workload}@{c}"
            if key in base and key in results.get(name, {}):
                cells.append(f"{key} {base[key]['rps'] / results[name][key]['rps']:.2f}")
        print(f"  Trireme ÷ {name}: " + ", ".join(cells), flush=True)


def summary(rounds: list[dict[str, Any]], servers: list[str]) -> None:
    """Median over rounds of requests/s, CPU per request and the within-round ratio, as a Markdown table."""
    print("\n| server | " + " | ".join(f"{w} c={c}: req/s (Trireme ÷ it), CPU µs/req" for w, c in LOADS) + " |")
    print("|---" * (len(LOADS) + 1) + "|")
    for name in servers:
        cells = []
        for workload, c in LOADS:
            key = f"{workload}@{c}"
            got = [r[name][key] for r in rounds if key in r.get(name, {})]
            if not got:
                cells.append("n/a")
                continue
            ratios = [
                r["trireme"][key]["rps"] / r[name][key]["rps"]
                for r in rounds
                if key in r.get(name, {}) and key in r.get("trireme", {})
            ]
            ratio = f" ({statistics.median(ratios):.2f})" if ratios and name != "trireme" else ""
            rps, cpu = statistics.median(g["rps"] for g in got), statistics.median(g["cpu_us"] for g in got)
            cells.append(f"{rps:,.0f}{ratio}, {cpu:,.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
