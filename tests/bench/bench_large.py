"""Benchmark: small requests' latency while another client sends 100 MiB requests back to back, Trireme vs Triton.

Both servers serve the example identity models (identity_fp32 for the 16-float client, identity_fp32_any for the
large one). Per round and server: one thread sends `--big-count` requests of `--big-mib` MiB (FP32) back to
back while another sends 16-float requests and records their latencies; the servers alternate per round.

Usage: .venv/bin/python tests/bench/bench_large.py [--rounds 3] [--big-mib 100] [--big-count 3]
Prints a markdown table: small requests answered, their p50/p99/max latency, and the large round trip time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, start_trireme, start_triton, stop, wait_port  # noqa: E402

MODELS = ("identity_fp32", "identity_fp32_any")


def run_round(port: int, big_mib: int, big_count: int) -> dict[str, float]:
    """One measurement against the server on port."""
    import tritonclient.grpc as grpcclient

    url = f"127.0.0.1:{port}"
    big = np.ones((1, (big_mib << 20) // 4), np.float32)
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    client.infer("identity_fp32_any", [inp])  # warm-up
    latencies: list[float] = []
    stop_small = threading.Event()

    def small() -> None:
        c = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        while not stop_small.is_set():
            t0 = time.perf_counter()
            c.infer("identity_fp32", [x])
            latencies.append(time.perf_counter() - t0)
        c.close()

    thread = threading.Thread(target=small)
    thread.start()
    time.sleep(0.5)
    durations = []
    for _ in range(big_count):
        t0 = time.perf_counter()
        client.infer("identity_fp32_any", [inp])
        durations.append(time.perf_counter() - t0)
    stop_small.set()
    thread.join()
    client.close()
    latencies.sort()
    return {
        "n": len(latencies),
        "p50": statistics.median(latencies) * 1e3,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "max": latencies[-1] * 1e3,
        "big": statistics.mean(durations) * 1e3,
    }


def main() -> None:
    """Alternate the servers in rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-mib", type=int, default=100)
    ap.add_argument("--big-count", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_large_"))
    repo = work / "repo"
    for name in MODELS:
        shutil.copytree(ROOT / "service" / "example_models" / name, repo / name)
    ports = {"trireme": free_port(), "triton": free_port()}
    arena = ["--backend-config=python,shm-default-byte-size=" + str(512 << 20)]
    procs = {
        "trireme": start_trireme(repo, ports["trireme"], work / "trireme.log"),
        "triton": start_triton(repo, ports["triton"], work / "triton.log", arena),
    }
    rows: dict[str, list[dict[str, float]]] = {"trireme": [], "triton": []}
    try:
        for name, proc in procs.items():
            wait_port(ports[name], proc)
        time.sleep(3)
        for r in range(args.rounds):
            order = ("trireme", "triton") if r % 2 == 0 else ("triton", "trireme")
            for name in order:
                res = run_round(ports[name], args.big_mib, args.big_count)
                rows[name].append(res)
                print(f"round {r} {name}: {res}", file=sys.stderr, flush=True)
    finally:
        stop(procs.values())
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"| server | small requests answered | small p50 ms | small p99 ms | small max ms | {args.big_mib} MiB round"
        f" trip ms |  (median of {args.rounds} rounds)"
    )
    print("|---|---|---|---|---|---|")
    for name, res in rows.items():

        def med(key: str, res: list[dict[str, float]] = res) -> float:
            return statistics.median(x[key] for x in res)

        print(
            f"| {name} | {med('n'):.0f} | {med('p50'):.1f} | {med('p99'):.0f} | {med('max'):.0f} | {med('big'):.0f} |"
        )


if __name__ == "__main__":
    main()
