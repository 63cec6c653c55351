"""Microseconds of the per-request shared-memory bookkeeping, in one process, stage by stage (no server, no gRPC).

What a 1 MiB request through system shm costs Trireme on top of the same request's fixed path, by stage, against
the same request sent over the wire (16 floats in raw_input_contents):
- decode: ModelInferRequest (parsed once, outside the timing) -> InferRequest (codec.decode_infer_request);
- hold: the engine's ShmHolds.resolve (registry resolve + acquire per tensor) and hold_until_final;
- frame: the worker's Execute frame (transfer._request_message + ipc.encode);
- worker: the worker's ClientSegments.buffer per tensor (the segment's size check and its view);
- release: the final response's release of the regions.
Each stage is timed over --n requests, best of --repeat runs (the machine is shared: the minimum is the figure
that repeats). `--root DIR` runs the same stages on another checkout's code (e.g. today's main) for a same-run A/B.

`--ir`: instructions per request of all stages together (callgrind; noise-free), wire and shm.

Usage: .venv/bin/python tests/bench/bench_shm_bookkeeping.py [--n 20000] [--repeat 7] [--root DIR] [--ir]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.servers import callgrind_total


def _setup(root: str) -> Callable[[bool], dict[str, Callable[[], Any]]]:
    sys.path.insert(0, root)
    from protos import grpc_service_pb2 as pb
    from service.core.pipeline.shm_holds import ShmHolds
    from service.frontend.grpc.codec import decode_infer_request
    from service.instances.transfer import ArenaTransfer
    from service.ipc import frames as ipc
    from service.types import InferResponse
    from service.worker.channel import ClientSegments
    from shm.registry import SharedMemoryRegistry
    from shm.system import SystemRegion

    key = f"/bench_shm_bk_{os.getpid()}"
    segment = SystemRegion.create(key, 2 << 20)
    registry = SharedMemoryRegistry()
    registry.register_system("in", key, 0, 1 << 20)
    registry.register_system("out", key, 1 << 20, 1 << 20)
    holds = ShmHolds(registry, None)  # type: ignore[arg-type]
    segments = ClientSegments()

    class _Transfer(ArenaTransfer):
        def __init__(self) -> None:
            self.bytes_copied = 0
            self.in_alloc = self.in_arena = None

    transfer = _Transfer()

    def stages(shm: bool) -> dict[str, Callable[[], Any]]:
        msg = pb.ModelInferRequest(model_name="identity")
        t = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[262144 if shm else 16])
        o = msg.outputs.add(name="OUTPUT0")
        if shm:
            t.parameters["shared_memory_region"].string_param = "in"
            t.parameters["shared_memory_byte_size"].int64_param = 1 << 20
            o.parameters["shared_memory_region"].string_param = "out"
            o.parameters["shared_memory_byte_size"].int64_param = 1 << 20
        else:
            msg.raw_input_contents.append(b"\0" * 64)
        box: dict[str, Any] = {}

        def decode() -> None:
            box["req"] = decode_infer_request(msg)

        def hold() -> None:
            req = box["req"]
            req.on_response = None
            holds.resolve(req)
            holds.hold_until_final(req)

        def frame() -> None:
            box["frame"] = ipc.encode(ipc.Execute(1, [transfer._request_message(1, box["req"], [])]))

        def worker() -> None:
            for m in ipc.decode(memoryview(box["frame"])[4:]).requests[0].inputs:
                if m.where == ipc.WHERE_SYSTEM_SHM:
                    segments.buffer(m.key, m.offset, m.nbytes, m.path)
            for spec in box["req"].outputs:
                if spec.shm is not None:
                    segments.buffer(spec.shm.key, spec.shm.offset, spec.shm.byte_size, spec.shm.path)

        def release() -> None:
            req = box["req"]
            if req.on_response is not None:
                req.on_response(InferResponse("identity", "1", ""))

        return {"decode": decode, "hold": hold, "frame": frame, "worker": worker, "release": release}

    def cleanup() -> None:
        registry.on_retire = None
        registry.close()
        segment.close()
        segment.unlink()

    stages.cleanup = cleanup  # type: ignore[attr-defined]
    return stages


def measure(stages: dict[str, Callable[[], Any]], n: int, repeat: int) -> dict[str, float]:
    """Best-of-`repeat` µs per call of each stage, the stages run in request order n times per repeat."""
    best = dict.fromkeys(stages, float("inf"))
    order = list(stages.items())
    for _ in range(repeat):
        spent = dict.fromkeys(stages, 0)
        for _ in range(n):
            for name, fn in order:
                t0 = time.perf_counter_ns()
                fn()
                spent[name] += time.perf_counter_ns() - t0
        for name in stages:
            best[name] = min(best[name], spent[name] / n / 1e3)
    return best


def serve(root: str, kind: str, n: int) -> None:
    """Run every stage of `kind` n times (the body measured under callgrind)."""
    make = _setup(root)
    try:
        stages = list(make(kind == "shm").values())
        for _ in range(n):
            for fn in stages:
                fn()
    finally:  # the segment's name is machine-wide: never leave it in /dev/shm
        make.cleanup()  # type: ignore[attr-defined]


def instructions(root: str, low: int, high: int) -> dict[str, float]:
    """Instructions per request of all stages together, by path: (Ir(high) - Ir(low)) / (high - low)."""
    per = {}
    for kind in ("wire", "shm"):
        ir = [callgrind_total([__file__, "--root", root, "--serve", kind, str(k)]) for k in (low, high)]
        per[kind] = (ir[1] - ir[0]) / (high - low)
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("--ir", action="store_true", help="instructions per request (callgrind) instead of times")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.root, args.serve[0], int(args.serve[1]))
        return
    if args.ir:
        per = instructions(args.root, 1000, 5000)
        print(f"code: {args.root}")
        print(" ".join(f"{kind}: {ir / 1e3:.1f}k instructions per request;" for kind, ir in per.items()))
        return
    make = _setup(args.root)
    try:
        rows = {kind: measure(make(kind == "shm"), args.n, args.repeat) for kind in ("wire", "shm")}
    finally:
        make.cleanup()  # type: ignore[attr-defined]
    names = list(rows["shm"])
    print(f"code: {args.root}")
    print("| path | " + " | ".join(names) + " | total |")
    print("|---" * (len(names) + 2) + "|")
    for kind, row in rows.items():
        print(f"| {kind} | " + " | ".join(f"{row[k]:.2f}" for k in names) + f" | {sum(row.values()):.2f} |")


if __name__ == "__main__":
    main()
