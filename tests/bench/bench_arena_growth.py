"""Benchmark: large tensors through worker arenas that grow on demand vs arenas big enough from the start, and
real Triton with its Python-backend pool growing the same way.

Three servers serve the same Python model (OUT = IN + 1, FP32): Trireme with 1 MiB arenas growing in 64 MiB
steps, Trireme with arenas of 2x the tensor size (no growth), and real Triton 2.51 with the same pool flags as
the first (skipped when tools/install-triton-tools.sh was not run). Each round times the first request
(the one that grows) and then --requests more (reusing the grown segments) on every server, in an order
that alternates per round.

Usage: .venv/bin/python tests/bench/bench_arena_growth.py [--size-mib 64] [--rounds 3] [--requests 5]
Prints a markdown table of medians over rounds: first-request and steady latency per server, and the
per-round ratio of steady latency to the no-growth Trireme.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import ANCHORS, free_port, start_triton, stop, wait_port  # noqa: E402
from tests.conftest import write_model  # noqa: E402
from tests.integration.test_arena_growth import IDENTITY_CONFIG, IDENTITY_PY  # noqa: E402

MIB = 1 << 20
GROWING = [
    "--backend-config=python,shm-default-byte-size=1048576",
    "--backend-config=python,shm-growth-byte-size=67108864",
]


def start_trireme(repo: Path, port: int, log: Path, args: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(port)]
    cmd += ["--http-port", str(free_port()), "--metrics-port", str(free_port()), "--model-repository", str(repo)]
    cmd += ["--allow-client-shm=true"]
    return subprocess.Popen([*cmd, *args], cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def time_requests(port: int, size: int, count: int) -> tuple[float, float]:
    """(first request's latency, median of the next `count`), seconds, on a fresh connection."""
    import tritonclient.grpc as grpcclient

    x = np.ones(size // 4, np.float32)
    t = grpcclient.InferInput("IN", [x.size], "FP32")
    t.set_data_from_numpy(x)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        times = []
        for _ in range(count + 1):
            t0 = time.perf_counter()
            out = client.infer("identity", [t], client_timeout=600).as_numpy("OUT")
            times.append(time.perf_counter() - t0)
            assert out[0] == 2.0
        return times[0], statistics.median(times[1:])
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5)
    a = parser.parse_args()
    size = a.size_mib * MIB
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
        servers = {
            "trireme growing": lambda p, log: start_trireme(repo, p, log, GROWING),
            "trireme preallocated": lambda p, log: start_trireme(
                repo, p, log, [f"--backend-config=python,shm-default-byte-size={2 * size}"]
            ),
        }
        if (ANCHORS / "bin" / "tritonserver").exists():
            servers["triton growing"] = lambda p, log: start_triton(repo, p, log, GROWING)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
        for r in range(a.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:  # a fresh server per measurement: the first request grows its arenas
                port = free_port()
                proc = servers[name](port, Path(tmp) / f"{name.replace(' ', '_')}_{r}.log")
                try:
                    wait_port(port, proc, 180)
                    time.sleep(2)  # models load after the port opens
                    results[name].append(time_requests(port, size, a.requests))
                finally:
                    stop([proc])
        base = results["trireme preallocated"]
        print(f"| server ({a.size_mib} MiB FP32, OUT = IN + 1) | first request s | steady s | steady / preallocated |")
        print("|---|---|---|---|")
        for name, rows in results.items():
            first = statistics.median(f for f, _ in rows)
            steady = statistics.median(s for _, s in rows)
            ratio = statistics.median(s / b for (_, s), (_, b) in zip(rows, base, strict=True))
            print(f"| {name} | {first:.2f} | {steady:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
