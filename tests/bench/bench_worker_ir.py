"""Instructions per request of the worker's own path, in one process and without the server: noise-free and ~1 min.

The real Worker (service/worker/main.py: channel, python backend, pb_utils) loads the unbatched FP32 identity model of
tests/bench/models.py; Execute frames as the server sends them (16 floats inline, one requested output) go in through
the worker's two pipes (service/ipc/pipes.py) and the Respond frames are read back, one request at a time. The
script runs itself twice under `valgrind --tool=callgrind` (PYTHONHASHSEED=0, so dict and set layouts repeat) with
--low and --high requests and prints (Ir(high) - Ir(low)) / (high - low): start-up and model loading cancel out. The
server side's share of the pipe traffic (one write, one read per request) is included, a few hundred instructions.

Back-to-back runs agree within ~0.3k instructions, runs hours apart within ~1.5k: compare changes in one batch.

Usage: .venv/bin/python tests/bench/bench_worker_ir.py [--low 5000] [--high 25000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import callgrind_total  # noqa: E402


def serve(requests: int, frames: int) -> None:
    """Load the model in a Worker and run `requests` requests through it (the measured body)."""
    from service.ipc import frames as ipc
    from service.ipc.arena import ArenaMap, segment_name
    from service.ipc.pipes import PipeStream, pipe_pair
    from service.worker.channel import WorkerChannel
    from service.worker.main import Worker
    from tests.bench.models import write_identity

    work = Path(tempfile.mkdtemp(prefix="bench_worker_ir_"))
    write_identity(work, "identity")
    config = {
        "name": "identity",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    arenas = [ArenaMap(segment_name(f"wir{os.getpid()}{k}"), 1 << 20, True) for k in "io"]
    server_ends, worker_ends = pipe_pair()  # the worker's real channel: two pipes
    model_dir = work / "identity"
    init = ipc.Init(
        "python", "identity", "1", str(model_dir), str(model_dir / "1"), json.dumps(config), "identity_0_0",
        "CPU", 0, arenas[0].name, arenas[1].name, 1 << 20,
    )  # fmt: skip
    worker = Worker(WorkerChannel(PipeStream(worker_ends)), init)
    worker.start()
    os.read(server_ends.read_fd, 1 << 16)  # Ready
    data = b"\0" * 64

    def frame(i: int) -> bytes:
        t = ipc.TensorMsg("INPUT0", "FP32", [16], data=data)
        return ipc.encode(ipc.Execute(i, [ipc.RequestMsg(i, "", [t], [ipc.OutputSpec("OUTPUT0", None)])]))

    sent = [frame(i + 1) for i in range(frames)]  # made for every run alike: not part of the difference
    channel = worker.channel
    for i in range(requests):
        os.write(server_ends.write_fd, sent[i])
        worker.on_message(channel.read_one_unless(worker.executions))
        worker.run_batch(worker.executions.pop(0))
        os.read(server_ends.read_fd, 1 << 16)
    for arena in arenas:
        arena.unlink()
    os._exit(0)  # the model's threads and the arenas' mappings need no orderly shutdown here


def instructions(requests: int, frames: int) -> int:
    """Ir of one run of this script under callgrind with `requests` requests."""
    return callgrind_total([__file__, "--serve", str(requests), "--frames", str(frames)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--low", type=int, default=5000)
    ap.add_argument("--high", type=int, default=25000)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--frames", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.frames)
        return
    low, high = instructions(args.low, args.high), instructions(args.high, args.high)
    print(f"worker path: {(high - low) / (args.high - args.low) / 1e3:.1f}k instructions per request")


if __name__ == "__main__":
    main()
