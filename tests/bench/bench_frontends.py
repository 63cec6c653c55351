"""--frontend-processes: one process vs today's main, and N = 2 vs N = 1 vs Triton 2.51 with many connections.

Phase `single` (is N = 1 as fast as before?): Trireme from this tree with `--frontend-processes 1` and Trireme
from another checkout (`--main-root`, today's main) are each pinned to CPU 0 (taskset; workers inherit it), real
perf_analyzer to CPU 1 at each concurrency; servers in rotating order per round. `--single-servers m2 n2` pins
the other checkout and this tree with N = 2 instead (the core process and its children on CPU 0).

Phase `many` (does N = 2 pay with many client connections?): Trireme with N = 1 and N = 2 and Triton 2.51, each
unpinned on all cores; --clients perf_analyzer processes at once, each at --client-concurrency with
TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1 (one gRPC connection per concurrent request: clients x concurrency
connections); servers in rotating order per round.

Every run is measured the same way (tests/bench/servers.py `windowed_load`): the clients send until stopped; after
2 s, over --window seconds, requests/s as the server itself counts them (its statistics) and CPU time (/proc
utime+stime) per request of the core process and of each child (worker, front ends), read at the same two
instants.

Model: the unbatched FP32 [-1] identity of tests/bench/models.py (one worker-process instance), --shape floats (16),
over the wire or through system shared memory (--shm).
Usage: .venv/bin/python tests/bench/bench_frontends.py [--phases single many] [--rounds 3] [--window 8]
       [--concurrency 1 8] [--clients 4] [--client-concurrency 4] [--main-root DIR]
       [--streaming]   (phase many over gRPC streams: each concurrent request slot opens its own stream)
       [--shape 262144] [--shm]   (e.g. 1 MiB through system shm: --phases many --clients 1 --client-concurrency 4)
Prints markdown tables (medians over rounds) and each round's raw figures on stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_cpu import LARGE_TENSOR, TRITON_POOL, pa, wait_ready  # noqa: E402
from tests.bench.models import MODEL, write_identity  # noqa: E402
from tests.bench.servers import ANCHORS, free_port, process_tree, start_triton, stop, windowed_load  # noqa: E402

RUN_ON = ["--measurement-mode", "time_windows", "-p", "3600000"]  # one hour-long window: runs until stopped


def client_cmd(
    port: int, concurrency: int, args: argparse.Namespace, streaming: bool = False, prefix: tuple[str, ...] = ()
) -> list[str]:
    """perf_analyzer sending --shape floats (through system shm with --shm) at `concurrency` until it is stopped
    (windowed_load measures)."""
    shm = ["--shared-memory", "system", "--output-shared-memory-size", str(4 * args.shape)] if args.shm else []
    return [
        *prefix, str(ANCHORS / "bin" / "perf_analyzer"), "-m", MODEL, "-i", "grpc", "-u", f"127.0.0.1:{port}",
        "--shape", f"INPUT0:{args.shape}", "--concurrency-range", f"{concurrency}:{concurrency}", *RUN_ON, *shm,
        *(["--streaming"] if streaming else []),
    ]  # fmt: skip


def start(
    kind: str,
    repo: Path,
    port: int,
    work: Path,
    main_root: Path,
    prefix: list[str],
    extra: tuple[str, ...] = (),
    shape: int = 16,
) -> subprocess.Popen[bytes]:
    """`main` (the other checkout), `n1`/`n2` (this tree with 1 / 2 front ends) or `triton`; does not wait.
    `extra`: more server flags (Trireme only)."""
    log = (work / f"{kind}_{port}.log").open("wb")
    if kind == "triton":  # large tensors: Triton's Python-backend pool as large as Trireme's arenas (bench_cpu)
        pool = [f"--backend-config=python,shm-default-byte-size={TRITON_POOL}"] if 4 * shape >= LARGE_TENSOR else []
        return start_triton(repo, port, work / f"{kind}_{port}.log", pool, prefix=prefix)
    root = main_root if kind in ("main", "m1", "m2") else ROOT
    cmd = [
        *prefix, sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(port),
        "--http-address", "127.0.0.1", "--http-port", str(free_port()), "--metrics-address", "127.0.0.1",
        "--metrics-port", str(free_port()), "--model-repository", str(repo), "--allow-client-shm=true",
    ]  # fmt: skip
    if kind != "main":  # n<N>: this tree with N front ends; m<N>: the other checkout with N
        cmd += ["--frontend-processes", kind[1:]]
    cmd += extra
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("TRIREME_FRONTEND_PROCESSES", None)
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)


def single_phase(args: argparse.Namespace, repo: Path, work: Path) -> dict[tuple[str, int], list[dict[str, float]]]:
    kinds = list(args.single_servers)
    ports = {k: free_port() for k in kinds}
    procs = {k: start(k, repo, ports[k], work, args.main_root, ["taskset", "-c", "0"], shape=args.shape) for k in kinds}
    out: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for k in kinds:
            wait_ready(ports[k], procs[k], MODEL, 180)
            pa(ports[k], MODEL, 8, 1000)  # warm-up
        for r in range(args.rounds):
            for c in args.concurrency:
                for k in kinds[r % 2 :] + kinds[: r % 2]:
                    got = windowed_load(
                        ports[k],
                        MODEL,
                        procs[k].pid,
                        [client_cmd(ports[k], c, args, prefix=("taskset", "-c", "1"))],
                        window_s=args.window,
                    )
                    row = {"ips": got["ips"], "server": got["core"], "children": got["children"]}
                    out.setdefault((k, c), []).append(row)
                    print(f"single round {r} c={c} {k}: {row}", file=sys.stderr, flush=True)
    finally:
        stop(procs.values())
    return out


def is_frontend(pid: int) -> bool:
    try:
        return b"service.remote.frontend_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def many_phase(args: argparse.Namespace, repo: Path, work: Path) -> dict[str, list[dict[str, float]]]:
    kinds = list(args.many_servers)
    ports = {k: free_port() for k in kinds}
    procs = {k: start(k, repo, ports[k], work, args.main_root, [], shape=args.shape) for k in kinds}
    out: dict[str, list[dict[str, float]]] = {}
    try:
        for k in kinds:
            wait_ready(ports[k], procs[k], MODEL, 180)
            pa(ports[k], MODEL, 8, 1000)
        for r in range(args.rounds):
            for k in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                cmd = client_cmd(ports[k], args.client_concurrency, args, args.streaming)
                # one gRPC connection per concurrent request: clients x concurrency connections
                env = {"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1"}
                got = windowed_load(ports[k], MODEL, procs[k].pid, [cmd] * args.clients, window_s=args.window, env=env)
                usage = got["usage"]
                frontends = {f"child {p}" for p in process_tree(procs[k].pid) if is_frontend(p)}
                row = {
                    "ips": got["ips"],
                    "cpu": got["core"] + got["children"],
                    "core": got["core"],
                    "frontends": sum(v["cpu_us"] for n, v in usage.items() if n in frontends),
                    "clients": got["clients"],
                    # the core process's read/write system calls and wake-ups per request
                    "core_rw": usage["server"]["reads"] + usage["server"]["writes"],
                    "core_wakeups": usage["server"]["wakeups"],
                    # the model's worker process (every child that is not a front end)
                    "worker_wakeups": sum(
                        v["wakeups"] for n, v in usage.items() if n != "server" and n not in frontends
                    ),
                    "busy": got["busy"],
                }
                out.setdefault(k, []).append(row)
                print(f"many round {r} {k}: {row}", file=sys.stderr, flush=True)
    finally:
        stop(procs.values())
    return out


def med(rows: list[dict[str, float]], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", nargs="+", default=["single", "many"], choices=["single", "many"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=8.0, help="seconds measured per run (after 2 s of warm-up)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--client-concurrency", type=int, default=4)
    ap.add_argument(
        "--many-servers",
        nargs="+",
        default=["n1", "n2", "triton"],
        choices=["n1", "n2", "m1", "m2", "triton"],
        help="phase many: n1/n2 this tree with 1/2 front ends, m1/m2 the --main-root checkout with 1/2, triton",
    )
    ap.add_argument(
        "--single-servers",
        nargs=2,
        default=["main", "n1"],
        choices=["main", "n1", "n2", "m1", "m2"],
        help="phase single: the two servers compared (e.g. m2 n2: the --main-root checkout and this tree, N = 2)",
    )
    ap.add_argument("--shape", type=int, default=16, help="FP32 elements per request")
    ap.add_argument("--shm", action="store_true", help="inputs and outputs through system shared memory")
    ap.add_argument("--streaming", action="store_true", help="phase many over ModelStreamInfer (one stream each)")
    ap.add_argument("--main-root", type=Path, default=Path("/work/main"), help="checkout of today's main")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_fe_"))
    repo = work / "repo"
    write_identity(repo)
    if "single" in args.phases:
        single = single_phase(args, repo, work)
        first, second = args.single_servers
        print(f"\nsingle: pinned (server CPU 0, perf_analyzer CPU 1), median of {args.rounds} rounds x {args.window} s")
        print(
            "| server | c | server CPU µs/req | children CPU µs/req (worker, front ends) | infer/s "
            f"| {second} ÷ {first} (infer/s) |"
        )
        print("|---|---|---|---|---|---|")
        for c in args.concurrency:
            ratio = statistics.median(
                n["ips"] / m["ips"] for n, m in zip(single[(second, c)], single[(first, c)], strict=True)
            )
            for k in (first, second):
                rows = single[(k, c)]
                shown = f"{ratio:.2f}" if k == second else "1.00"
                print(
                    f"| {k} | {c} | {med(rows, 'server'):.0f} | {med(rows, 'children'):.0f} | {med(rows, 'ips'):.0f} "
                    f"| {shown} |"
                )
    if "many" in args.phases:
        many = many_phase(args, repo, work)
        conns = args.clients * args.client_concurrency
        mode = (
            (", streaming" if args.streaming else "")
            + f", {args.shape} floats"
            + (" through system shm" if args.shm else "")
        )
        clients = f"{args.clients} perf_analyzer x c={args.client_concurrency}"
        print(f"\nmany: {clients} ({conns} connections{mode}), unpinned")
        print(
            f"| server | infer/s | ÷ {'n1' if 'n1' in many else 'first'} (same rounds) "
            "| ÷ Triton (same rounds) | server tree CPU µs/req "
            "| of it: core process | of it: front ends | clients CPU µs/req | machine busy CPUs "
            "| core reads+writes/req | core wake-ups/req | worker wake-ups/req |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        base = "n1" if "n1" in many else next(iter(many))
        for k in many:
            to_n1 = statistics.median(a["ips"] / b["ips"] for a, b in zip(many[k], many[base], strict=True))
            to_tr = (
                f"{statistics.median(a['ips'] / b['ips'] for a, b in zip(many[k], many['triton'], strict=True)):.2f}"
                if "triton" in many
                else "-"
            )
            rows = many[k]
            print(
                f"| {k} | {med(rows, 'ips'):.0f} | {to_n1:.2f} | {to_tr} | {med(rows, 'cpu'):.0f} "
                f"| {med(rows, 'core'):.0f} | {med(rows, 'frontends'):.0f} | {med(rows, 'clients'):.0f} "
                f"| {med(rows, 'busy'):.2f} | {med(rows, 'core_rw'):.2f} | {med(rows, 'core_wakeups'):.2f} "
                f"| {med(rows, 'worker_wakeups'):.2f} |"
            )


if __name__ == "__main__":
    main()
