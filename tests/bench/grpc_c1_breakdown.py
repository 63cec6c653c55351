"""Where a c=1 gRPC request's time goes, Trireme h2 against Triton: both servers pinned to CPU 0, perf_analyzer on
CPU 1, rounds interleaved; prints perf_analyzer's client-side times (response wait) beside the server-side request
latency from the statistics extension, so that response wait - request latency is the front end plus loopback.

Usage: .venv/bin/python tests/bench/grpc_c1_breakdown.py [--rounds 2] (about a minute; docs/benchmarks.md, issue 44
item 1)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_cpu import wait_ready  # noqa: E402
from tests.bench.models import MODEL, write_identity  # noqa: E402
from tests.bench.servers import ANCHORS, free_port, start_trireme, start_triton, stop  # noqa: E402

PIN = ["taskset", "-c", "0"]
CLIENT = ["taskset", "-c", "1", str(ANCHORS / "bin" / "perf_analyzer"), "-m", MODEL, "-i", "grpc"]
LOAD = ["--shape", "INPUT0:16", "--concurrency-range", "1:1", "--measurement-interval", "3000"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="grpc_c1_"))
    repo = work / "repo"
    write_identity(repo, MODEL)
    ports = {"trireme-h2": free_port(), "triton": free_port()}
    procs = {
        "triton": start_triton(repo, ports["triton"], work / "triton.log", prefix=PIN),
        "trireme-h2": start_trireme(
            repo, ports["trireme-h2"], work / "trireme.log", extra_args=["--grpc-transport", "h2"], prefix=PIN
        ),
    }
    try:
        for name, proc in procs.items():
            wait_ready(ports[name], proc, MODEL, 180)
        for r in range(args.rounds):
            for name in list(procs)[r % 2 :] + list(procs)[: r % 2]:
                run = subprocess.run(
                    [*CLIENT, "-u", f"127.0.0.1:{ports[name]}", *LOAD, "--stability-percentage", "50"],
                    capture_output=True,
                    text=True,
                )
                lines = [x.strip() for x in (run.stdout + run.stderr).splitlines() if "usec" in x or "error" in x]
                print(f"round {r} {name}", *lines, sep="\n  ", flush=True)
    finally:
        stop(procs.values())


if __name__ == "__main__":
    main()
