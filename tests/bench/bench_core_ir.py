"""Instructions per request of each process of `--frontend-processes N`: the core, the front ends, the worker.

The core process is what bounds N front ends (docs/performance.md, "Capacity with N front-end processes"); this
counts its instructions per request, noise-free, with the same method as bench_cpu.py's callgrind phase: the server
runs under `valgrind --tool=callgrind --instr-atstart=no --trace-children=yes` (every front end and the worker are
traced as their own processes), pinned to CPU 0; after start-up and a warm-up the counters are zeroed
(`callgrind_control -z`), --requests requests are sent by perf_analyzer (gRPC, pinned to CPU 1) at each
concurrency, and every process dumps (`callgrind_control -d`). Ir / requests per process.

Model: the unbatched FP32 [-1] identity of tests/bench/models.py (one worker-process instance), 16 floats.
Usage: .venv/bin/python tests/bench/bench_core_ir.py [--frontends 2] [--concurrency 1 8] [--requests 1000]
       [--pure] (TRIREME_PURE_PYTHON=1: the pure-Python build where the compiled one is built)
       [--root DIR] (run another checkout's server, e.g. main's, for a before/after)
       [--keep DIR] (copy the dumps into DIR for callgrind_annotate; the load dump of a pid is its second-to-last)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_cpu import SERVER_CPU, VALGRIND, callgrind, measure_ir, pa, wait_ready  # noqa: E402
from tests.bench.models import MODEL, write_identity  # noqa: E402
from tests.bench.servers import free_port, process_tree, stop  # noqa: E402


def role(pid: int, core: int) -> str:
    """core, frontend or worker (by the process's command line)."""
    if pid == core:
        return "core"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "gone"
    return "frontend" if b"service.remote.frontend_main" in cmd else "worker"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frontends", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--pure", action="store_true")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose server runs")
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_core_ir_"))
    repo = work / "repo"
    write_identity(repo)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(args.root), "TRIREME_PURE_PYTHON": "1" if args.pure else "0"}
    env.pop("TRIREME_FRONTEND_PROCESSES", None)
    cmd = [
        "taskset", "-c", SERVER_CPU, *VALGRIND, f"--callgrind-out-file={work}/cg.%p",
        sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(port),
        "--http-address", "127.0.0.1", "--http-port", str(free_port()), "--metrics-address", "127.0.0.1",
        "--metrics-port", str(free_port()), "--model-repository", str(repo),
        "--frontend-processes", str(args.frontends),
    ]  # fmt: skip
    log = (work / "server.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=args.root, env=env, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        wait_ready(port, proc, MODEL, 900)
        pids = process_tree(proc.pid)
        roles = {p: role(p, proc.pid) for p in pids}
        callgrind(pids, "-i on")
        pa(port, MODEL, 2, 200)  # warm-up with instrumentation on
        for c in args.concurrency:
            t0 = time.monotonic()
            ir = measure_ir(work, pids, partial(pa, port, MODEL, c, args.requests))
            seconds = time.monotonic() - t0
            per = {r: sum(v for p, v in ir.items() if roles[p] == r) / args.requests for r in set(roles.values())}
            print(f"c={c}: {per} ({seconds:.0f} s) by pid {ir}", file=sys.stderr, flush=True)
            rows.append((c, per))
    finally:
        stop([proc], timeout_s=120)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for dump in work.glob("cg.*"):
                shutil.copy2(dump, args.keep / dump.name)
            print(f"dumps kept in {args.keep}; roles {roles}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    build = "pure" if args.pure else "as built"
    print(f"\n--frontend-processes {args.frontends}, {build}, {args.requests} requests under callgrind, 16 floats")
    print("| c | core Ir/req | front ends Ir/req | worker Ir/req |")
    print("|---|---|---|---|")
    for c, per in rows:
        cells = [f"{per.get(r, 0) / 1e3:.1f}k" for r in ("core", "frontend", "worker")]
        print(f"| {c} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
