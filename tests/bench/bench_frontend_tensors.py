"""Large tensors through front-end processes: CPU per request and round trip, this tree vs another checkout.

Servers (each on the example model identity_fp32_any, one worker-process instance, unpinned):
- `tree N=2`: this tree with 2 front ends (tensors of 64 KiB and more through the link arenas);
- `tree N=1`: this tree with one process (the reference: no front-end hop at all);
- with --main-root, `main N=2` and `main N=1`: that checkout (e.g. an older main) with 2 and 1.
Per round (servers in this order, each started fresh) and size, one tritonclient gRPC client sends --requests
FP32 requests of that size back to back (after two for warm-up) and checks every answer's bytes. Reported: median
round trip, and CPU time per request of the whole server tree (/proc utime+stime of the core or server, the front
ends and the worker), the noise-free measure on a busy machine, largest process first.

Usage: .venv/bin/python tests/bench/bench_frontend_tensors.py [--rounds 2] [--sizes-mib 1 16 64] [--requests 20]
       [--main-root /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, stop, tree_usage, wait_port  # noqa: E402

MODEL = "identity_fp32_any"


def start(root: Path, frontends: int, repo: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(port),
        "--http-address", "127.0.0.1", "--http-port", str(free_port()), "--metrics-address", "127.0.0.1",
        "--metrics-port", str(free_port()), "--model-repository", str(repo),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root), "TRIREME_FRONTEND_PROCESSES": str(frontends)}
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def measure(port: int, pid: int, mib: int, requests: int) -> tuple[float, list[float]]:
    """(median round trip ms, CPU ms per request of each process of the server tree, largest first)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    data = np.arange((mib << 20) // 4, dtype=np.float32)[None]
    x = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    x.set_data_from_numpy(data)
    for _ in range(2):
        client.infer(MODEL, [x])
    before, times = tree_usage(pid), []
    for _ in range(requests):
        t0 = time.perf_counter()
        result = client.infer(MODEL, [x])
        times.append(time.perf_counter() - t0)
        if not np.array_equal(result.as_numpy("OUTPUT0"), data):
            raise AssertionError("wrong answer")
    after = tree_usage(pid)
    client.close()
    cpu = [(a["cpu_s"] - before.get(p, {"cpu_s": 0.0})["cpu_s"]) * 1e3 / requests for p, a in after.items()]
    return statistics.median(times) * 1e3, sorted(cpu, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--main-root", type=Path, help="a checkout to compare with (e.g. an older main)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_fe_tensors_"))
    shutil.copytree(ROOT / "service" / "example_models" / MODEL, work / "repo" / MODEL)
    servers = [("tree N=2", ROOT, 2), ("tree N=1", ROOT, 1)]
    if args.main_root is not None:
        servers = [("main N=2", args.main_root, 2), *servers, ("main N=1", args.main_root, 1)]
    rows: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
    try:
        for r in range(args.rounds):
            for name, root, n in servers:
                port = free_port()
                proc = start(root, n, work / "repo", port, work / f"{r}_{n}_{port}.log")
                try:
                    wait_port(port, proc)
                    time.sleep(2)  # the front ends and the worker are up
                    for mib in args.sizes_mib:
                        rt, cpu = measure(
                            port, proc.pid, mib, args.requests if mib < 64 else max(4, args.requests // 2)
                        )
                        rows.setdefault((name, mib), []).append((rt, cpu))
                        print(
                            f"round {r} {name} {mib} MiB: {rt:.1f} ms, cpu {[round(c, 1) for c in cpu]}",
                            file=sys.stderr,
                        )
                finally:
                    stop([proc])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| server | MiB | round trip ms (median of rounds) | CPU ms per request, whole tree | largest process |")
    print("|---|---|---|---|---|")
    for (name, mib), values in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rt = statistics.median(v[0] for v in values)
        total = statistics.median(sum(v[1]) for v in values)
        top = statistics.median(v[1][0] for v in values)
        print(f"| {name} | {mib} | {rt:.1f} | {total:.1f} | {top:.1f} |")


if __name__ == "__main__":
    main()
