"""Benchmark: Trireme vs real Triton on the same Python-backend model with the real perf_analyzer, interleaved.

Usage: .venv/bin/python tests/bench/bench_core_vs_triton.py [--model identity_fp32] [--rounds 3]
       [--concurrency 1 8] [--extra-pa-args "..."]
Needs ../shared/tools/install-anchors.sh (perf_analyzer and tritonserver in /tmp/trireme-anchors/bin).
Prints a markdown table: infer/s and p50/p99 latency per server and concurrency, and the per-round ratio.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = Path(os.environ.get("ANCHORS", "/tmp/trireme-anchors"))
# perf_analyzer stability settings; --stability overrides (this VM often needs a loose threshold)
STABILITY = ["-p", "3000", "-s", "20", "-r", "20"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 90) -> None:
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


def start_trireme(repo: Path, port: int, log: Path) -> subprocess.Popen:
    """Trireme on repo."""
    cmd = [
        sys.executable,
        "-m",
        "service",
        "serve",
        "--grpc-address",
        "127.0.0.1",
        "--grpc-port",
        str(port),
        "--model-repository",
        str(repo),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def start_triton(repo: Path, port: int, log: Path) -> subprocess.Popen:
    """Real Triton 2.51 on repo."""
    cmd = [
        str(ANCHORS / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--grpc-port={port}",
        f"--http-port={free_port()}",
        f"--metrics-port={free_port()}",
        "--allow-metrics=false",
    ]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def perf(model: str, port: int, concurrency: int, extra: list[str], out: Path) -> dict[str, float]:
    """One perf_analyzer measurement; returns infer/s, p50 and p99 (µs). Retries once with a loose threshold."""
    for stability in (STABILITY, ["-p", "2000", "-s", "100", "-r", "6"]):
        cmd = [
            str(ANCHORS / "bin" / "perf_analyzer"),
            "-m",
            model,
            "-i",
            "grpc",
            "-u",
            f"127.0.0.1:{port}",
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            *stability,
            "--percentile",
            "99",
            "-f",
            str(out),
            *extra,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if res.returncode == 0:
            break
    else:
        raise RuntimeError(f"perf_analyzer failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    with out.open() as f:
        row = next(csv.DictReader(f))
    return {"ips": float(row["Inferences/Second"]), "p50": float(row["p50 latency"]), "p99": float(row["p99 latency"])}


def main() -> None:
    """Interleave the two servers in rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--repo", default=str(ROOT / "service" / "example_models"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--extra-pa-args", default="")
    ap.add_argument("--stability", default=" ".join(STABILITY), help="perf_analyzer -p/-s/-r arguments")
    args = ap.parse_args()
    STABILITY[:] = args.stability.split()
    work = Path(tempfile.mkdtemp(prefix="bench_core_"))
    repo = work / "repo"
    repo.mkdir()
    shutil.copytree(Path(args.repo) / args.model, repo / args.model)
    ports = {"trireme": free_port(), "triton": free_port()}
    procs = {
        "trireme": start_trireme(repo, ports["trireme"], work / "trireme.log"),
        "triton": start_triton(repo, ports["triton"], work / "triton.log"),
    }
    try:
        for name, proc in procs.items():
            wait_port(ports[name], proc)
        time.sleep(2)
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for c in args.concurrency:
                for name in ("trireme", "triton"):
                    res = perf(args.model, ports[name], c, args.extra_pa_args.split(), work / f"{name}_{c}_{r}.csv")
                    results.setdefault((name, c), []).append(res)
                    print(f"round {r} c={c} {name}: {res['ips']:.0f} infer/s p50 {res['p50']:.0f} us", file=sys.stderr)
        print(
            f"| model | c | Trireme infer/s | Triton infer/s | ratio (median of {args.rounds} rounds) |"
            " Trireme p50/p99 µs | Triton p50/p99 µs |"
        )
        print("|---|---|---|---|---|---|---|")
        for c in args.concurrency:
            a, b = results[("trireme", c)], results[("triton", c)]
            ratios = [x["ips"] / y["ips"] for x, y in zip(a, b, strict=True)]

            def med(rows: list[dict[str, float]], key: str) -> float:
                return statistics.median(x[key] for x in rows)

            print(
                f"| {args.model} | {c} | {med(a, 'ips'):.0f} | {med(b, 'ips'):.0f} | {statistics.median(ratios):.2f}"
                f" ({min(ratios):.2f}-{max(ratios):.2f}) | {med(a, 'p50'):.0f}/{med(a, 'p99'):.0f} |"
                f" {med(b, 'p50'):.0f}/{med(b, 'p99'):.0f} |"
            )
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
