"""Benchmark: the worker channel's transport, two pipes (today's) vs one Unix socketpair, CPU per request.

One driver process runs the server's event loop (uvloop) with two real worker-process instances of the FP32
identity (`identity_fp32_any`), WorkerProcess as the server uses it: one on the channel's two pipes, one on a
socketpair (the channel before the pipes: the same socket descriptor serves as the worker's read and write end,
the server's end is uvloop's Unix socket transport). Driver and workers are pinned to one CPU (--cpu), as server
and worker share a CPU on a busy machine. Bursts of --burst requests of --shape floats, --inflight at a time (each
completion sends the next), alternate between the two instances --bursts times, so that the machine's load drifts
alike for both; the CPU time of the driver and of each worker (sum over threads of /proc/<pid>/task/*/schedstat, ns)
is added up per transport. Only the kernel's transport differs: both workers run the same code on read()/write().

Usage: .venv/bin/python tests/bench/bench_worker_channel.py [--bursts 40] [--burst 500] [--inflight 1 8]
       [--shape 16] [--cpu 0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from service.core.repository import model_config as cfg  # noqa: E402
from service.instances.dispatch import _WorkerProtocol  # noqa: E402
from service.instances.process import InstanceSpec, WorkerProcess  # noqa: E402
from service.instances.spawn import worker_env  # noqa: E402
from service.ipc.launch import fds_env, worker_command  # noqa: E402
from service.types import InferRequest, InputTensor  # noqa: E402

MODEL = "identity_fp32_any"
MODEL_DIR = ROOT / "service" / "example_models" / MODEL


class SocketpairWorker(WorkerProcess):
    """A worker whose channel is one Unix socketpair (as before the pipes): the worker reads and writes the one
    socket descriptor, the server's end is the event loop's Unix socket transport."""

    async def _spawn(self, loop: asyncio.AbstractEventLoop) -> None:
        parent, child = socket.socketpair()
        self.cancel_sock, cancel_child = socket.socketpair()
        self.cancel_sock.setblocking(False)
        fds = [child.fileno(), child.fileno(), cancel_child.fileno()]
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *worker_command({"model": MODEL, "channel": "socketpair"}),
                pass_fds=fds,
                env=worker_env(fds_env(fds)),
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            child.close()
            cancel_child.close()
        self._startup = loop.create_future()
        transport, _ = await loop.create_unix_connection(lambda: _WorkerProtocol(self), sock=parent)
        self.transport = transport


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in ns."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total


def spec() -> InstanceSpec:
    config, _, _ = cfg.read_config(str(MODEL_DIR))
    cfg.fill_backend(config, str(MODEL_DIR), [1])
    cfg.normalize(config, MODEL)
    return InstanceSpec("python", MODEL, "1", str(MODEL_DIR), str(MODEL_DIR / "1"), cfg.to_json(config), MODEL + "_0")


async def burst(worker: WorkerProcess, n: int, inflight: int, data: bytes, shape: int) -> None:
    """n requests, `inflight` at a time."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    left = {"send": n - inflight, "done": n}

    def send_one() -> None:
        req = InferRequest(MODEL, "1", inputs=[InputTensor("INPUT0", "FP32", [1, shape], data)])
        req.on_response = lambda r: None
        worker.execute([req], on_done)

    def on_done(w: Any, d: Any) -> None:
        left["done"] -= 1
        if left["send"] > 0:
            left["send"] -= 1
            send_one()
        elif left["done"] == 0 and not finished.done():
            finished.set_result(None)

    for _ in range(inflight):
        send_one()
    await finished


async def measure(args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {args.cpu})  # the workers inherit it
    workers = {"pipes": WorkerProcess(spec()), "socketpair": SocketpairWorker(spec())}
    for w in workers.values():
        await w.start()
    data = np.arange(args.shape, dtype=np.float32).tobytes()
    me = os.getpid()
    print(f"CPU µs per request, driver + worker pinned to CPU {args.cpu}, {args.shape} floats, {args.bursts} x "
          f"{args.burst} requests per transport and round, bursts alternating\n")  # fmt: skip
    print(
        "| in flight | round | pipes: server | worker | sum | socketpair: server | worker | sum | pipes ÷ socketpair |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for inflight in args.inflight:
            ratios = []
            for r in range(args.rounds):
                used = {k: [0, 0] for k in workers}
                for w in workers.values():
                    await burst(w, 1000, inflight, data, args.shape)  # warm-up
                for b in range(args.bursts):
                    for name in list(workers)[b % 2 :] + list(workers)[: b % 2]:
                        w = workers[name]
                        assert w.pid is not None
                        w0, d0 = cpu_ns(w.pid), cpu_ns(me)
                        await burst(w, args.burst, inflight, data, args.shape)
                        d1, w1 = cpu_ns(me), cpu_ns(w.pid)
                        used[name][0] += d1 - d0
                        used[name][1] += w1 - w0
                n = args.bursts * args.burst
                per = {k: (s / n / 1e3, wk / n / 1e3) for k, (s, wk) in used.items()}
                ratio = sum(per["pipes"]) / sum(per["socketpair"])
                ratios.append(ratio)
                p, s = per["pipes"], per["socketpair"]
                print(
                    f"| {inflight} | {r} | {p[0]:.1f} | {p[1]:.1f} | {sum(p):.1f} | {s[0]:.1f} | {s[1]:.1f} "
                    f"| {sum(s):.1f} | {ratio:.3f} |",
                    flush=True,
                )
            print(f"| {inflight} | median | | | | | | | {statistics.median(ratios):.3f} |", flush=True)
    finally:
        for w in workers.values():
            await w.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bursts", type=int, default=40)
    ap.add_argument("--burst", type=int, default=500)
    ap.add_argument("--inflight", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--shape", type=int, default=16)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    uvloop.run(measure(ap.parse_args()))


if __name__ == "__main__":
    main()
