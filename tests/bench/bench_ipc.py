"""Benchmark: round trip of the server <-> worker control channel, by payload size and transport.

Usage: .venv/bin/python tests/bench/bench_ipc.py [--iterations 2000]
Starts one real worker process with the example identity model and times execute -> response -> ExecDone
from the server's event loop (uvloop), for payloads sent inline in the frame vs through the shared-memory
arena, next to a bare socketpair echo (the floor for any frame-based hop). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import uvloop

from service.core.repository import model_config as cfg
from service.instances.process import InstanceSpec, WorkerProcess
from service.ipc import frames as ipc
from service.types import InferRequest, InputTensor

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "service" / "example_models" / "identity_fp32_any"


def _spec() -> InstanceSpec:
    config, _, _ = cfg.read_config(str(MODEL_DIR))
    cfg.fill_backend(config, str(MODEL_DIR), [1])
    cfg.normalize(config, "identity_fp32_any")
    return InstanceSpec(
        "python",
        "identity_fp32_any",
        "1",
        str(MODEL_DIR),
        str(MODEL_DIR / "1"),
        cfg.to_json(config),
        "identity_fp32_any_0_0",
    )


async def _round_trips(worker: WorkerProcess, nbytes: int, iterations: int) -> list[float]:
    loop = asyncio.get_running_loop()
    data = np.random.rand(1, nbytes // 4).astype(np.float32).tobytes()
    times = []
    for _ in range(iterations):
        done = loop.create_future()
        req = InferRequest("identity_fp32_any", "1", inputs=[InputTensor("INPUT0", "FP32", [1, nbytes // 4], data)])
        req.on_response = lambda r: None

        def on_done(w: WorkerProcess, d: ipc.ExecDone | None, fut: asyncio.Future = done) -> None:
            fut.set_result(None)

        t0 = time.perf_counter()
        worker.execute([req], on_done)
        await done
        times.append(time.perf_counter() - t0)
    return times


def _socket_echo(nbytes: int, iterations: int) -> list[float]:
    a, b = socket.socketpair()
    payload = b"x" * nbytes

    def echo() -> None:
        buf = bytearray(nbytes)
        view = memoryview(buf)
        for _ in range(iterations):
            got = 0
            while got < nbytes:
                got += b.recv_into(view[got:])
            b.sendall(view)

    t = threading.Thread(target=echo)
    t.start()
    buf = bytearray(nbytes)
    view = memoryview(buf)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        a.sendall(payload)
        got = 0
        while got < nbytes:
            got += a.recv_into(view[got:])
        times.append(time.perf_counter() - t0)
    t.join()
    a.close()
    b.close()
    return times


async def main_async(iterations: int) -> None:
    """Run every size and print the table."""
    worker = WorkerProcess(_spec())
    await worker.start()
    try:
        print("| payload | transport | p50 µs | p90 µs | note |")
        print("|---|---|---|---|---|")
        for nbytes in (64, 16 * 1024, 64 * 1024, 1 << 20, 16 << 20):
            n = iterations if nbytes < (1 << 20) else max(50, iterations // 20)
            await _round_trips(worker, nbytes, 20)  # warm up
            times = await _round_trips(worker, nbytes, n)
            where = "inline frame" if nbytes <= ipc.INLINE_LIMIT else "shm arena"
            q = statistics.quantiles(times, n=10)
            print(
                f"| {nbytes} B | worker hop ({where}) | {statistics.median(times) * 1e6:.0f} | {q[8] * 1e6:.0f} |"
                " execute→identity model→response+ExecDone |"
            )
            echo = _socket_echo(nbytes, n)
            q = statistics.quantiles(echo, n=10)
            print(
                f"| {nbytes} B | bare socketpair echo (thread) | {statistics.median(echo) * 1e6:.0f} |"
                f" {q[8] * 1e6:.0f} | floor: bytes both ways, no framing |"
            )
    finally:
        await worker.stop()


def main() -> None:
    """CLI."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=2000)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    uvloop.install()
    asyncio.run(main_async(args.iterations))


if __name__ == "__main__":
    main()
