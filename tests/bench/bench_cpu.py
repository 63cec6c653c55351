"""CPU per request, per process: /proc CPU time and callgrind instruction counts, with the transport floor.

Servers (each pinned to CPU 0 with taskset, the client pinned to CPU 1):
- `echo`: tests/bench/echo_server.py, a bare grpc.aio + uvloop server that echoes INPUT0 (the floor: what
  grpc.aio itself costs per request, no core, no worker), its methods registered as Trireme's are;
- `echo_registered`: the same, its methods also registered as grpc "registered methods" (the generated
  add_*_to_server function's way, and Trireme's until it dropped it): the floor as first measured;
- `trireme`: Trireme with the default worker-process instance;
- `trireme_native`: the same with `--grpc-transport native` (pygrpc-native; its Rust threads are counted too);
- `trireme_h2`: the same with `--grpc-transport h2` (Trireme's own HTTP/2 gRPC server, service/frontend/grpc/h2);
- `in_process`, `inline`: Trireme with the in-process instance modes (TRIREME_INSTANCE_MODE);
- `triton`: real Triton 2.51 (Python backend), /proc CPU only unless --callgrind-triton;
- `trireme_pure`: `trireme` with TRIREME_PURE_PYTHON=1 (the pure-Python build where the compiled one is built:
  `--servers trireme trireme_pure` compares the two builds; not in the default set);
- `echo_native`, `echo_h2`, `echo_own`, `echo_own_mypyc`, `echo_own_coalesced` (not in the default set): the
  echo's handlers on pygrpc-native (echo_server.py --transport native), on python-hyper's h2 and on HTTP/2 framing
  of our own, pure or compiled with mypyc or with coalesced writes (tests/bench/h2_echo_server.py --variant;
  issue 44 item 1).
Model: the unbatched FP32 `[-1]` identity of tests/bench/models.py, 16 floats per request (--shape).
Client: real perf_analyzer over gRPC (`--protocol http`: over HTTP, `-i http`, binary tensor data both ways; the
echoes speak only gRPC and are left out then) sending exactly --requests requests (`--request-count`) at each
concurrency.

Two phases:
1. CPU time: every server runs natively; per round (servers in rotating order) and concurrency, /proc utime+stime
   of the server and of each child (worker, Triton's Python stub) around one perf_analyzer run, divided by the
   requests sent. No throughput is reported: perf_analyzer's --request-count mode ends its runs on whole-second
   steps, so requests / wall time of such a run comes out on steps too (e.g. 984, 1965, 2940/s for one server);
   tests/bench/bench_hotpath.py and bench_http.py measure throughput in perf_analyzer's time windows.
2. Instructions (repeatable on a busy machine): each Trireme server and the echo run under
   `valgrind --tool=callgrind --instr-atstart=no --trace-children=yes` (workers are traced as their own
   processes); after start-up and a warm-up, counters are zeroed (`callgrind_control -z`), --cg-requests
   requests are sent, and every process dumps (`callgrind_control -d`). Instructions per request = Ir / requests,
   per process. An idle interval of the same length is measured after it and reported as `idle Ir/s` (timers,
   pollers): it is small against the per-request cost and is not subtracted.

Usage: .venv/bin/python tests/bench/bench_cpu.py [--requests 5000] [--cg-requests 1000] [--concurrency 1 8]
       [--servers echo echo_registered trireme trireme_native trireme_h2 in_process inline triton]
       [--rounds 3] [--no-callgrind]
       [--callgrind-triton] [--keep DIR]   (--keep: copy the callgrind dumps into DIR, for callgrind_annotate)
       [--shape 262144] [--shm]   (--shm: system shared memory for inputs and outputs; not for the echo)
       [--protocol http]   (perf_analyzer -i http against the servers' HTTP ports)
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.models import MODEL, MODEL_IN_PROCESS, MODEL_INLINE, write_identity  # noqa: E402
from tests.bench.servers import (  # noqa: E402
    ANCHORS,
    free_port,
    inference_counts,
    process_tree,
    start_trireme,
    start_triton,
    stop,
    tree_usage,
    usage_per_request,
    wait_port,
)

SERVER_CPU, CLIENT_CPU = "0", "1"
# the echo's kinds after the default set: pygrpc-native, and tests/bench/h2_echo_server.py's HTTP/2 variants
EXTRA_ECHOES = ("echo_native", "echo_h2", "echo_own", "echo_own_mypyc", "echo_own_coalesced")
ALL = ("echo", "echo_registered", "trireme", "trireme_native", "trireme_h2", "in_process", "inline", "triton")
ALL += ("trireme_pure", *EXTRA_ECHOES)
ECHOES = ("echo", "echo_registered", *EXTRA_ECHOES)
MODELS = {
    **dict.fromkeys(ECHOES, MODEL),
    "trireme": MODEL,
    "trireme_native": MODEL,
    "trireme_h2": MODEL,
    "trireme_pure": MODEL,
    "triton": MODEL,
    "in_process": MODEL_IN_PROCESS,
    "inline": MODEL_INLINE,
}
VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes", "--vgdb=yes"]


TRITON_POOL = 256 << 20  # Triton's Python-backend shm pool for large tensors, as bench_shm.py (Trireme's arena size)
LARGE_TENSOR = 1 << 20  # tensors from this size on: Triton gets TRITON_POOL, the warm-up runs at c=1


PROTOCOL = ["grpc"]  # perf_analyzer's -i (set in main)
GRPC_PORTS: dict[int, int] = {}  # with --protocol http: HTTP port -> the same server's gRPC port (its statistics)


def start(kind: str, work: Path, port: int, prefix: list[str], shape: int = 16) -> subprocess.Popen[bytes]:
    """Start one server of `kind` on port (its repository under work), wrapped in prefix; does not wait. With
    --protocol http, port is the HTTP port (perf_analyzer's) and the gRPC port a free one."""
    repo = work / f"repo_{kind}"
    if not repo.exists():
        mode = {"in_process": "in_process", "inline": "in_process_inline"}.get(kind, False)
        write_identity(repo, MODELS[kind], in_process=mode)
    log = work / f"{kind}_{port}.log"
    if kind in ECHOES:
        script = "h2_echo_server.py" if kind.startswith(("echo_h2", "echo_own")) else "echo_server.py"
        cmd = [*prefix, sys.executable, str(ROOT / "tests" / "bench" / script), "--port", str(port)]
        cmd += {
            "echo_registered": ["--registered"],
            "echo_native": ["--transport", "native"],
            "echo_h2": ["--variant", "h2"],
            "echo_own": ["--variant", "own"],
            "echo_own_mypyc": ["--variant", "own_mypyc"],
            "echo_own_coalesced": ["--variant", "own_coalesced"],
        }.get(kind, [])
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    grpc_port, http_port = port, 0
    if PROTOCOL[0] == "http":
        grpc_port, http_port = free_port(), port
        GRPC_PORTS[port] = grpc_port
    if kind == "triton":
        pool = [f"--backend-config=python,shm-default-byte-size={TRITON_POOL}"] if 4 * shape >= LARGE_TENSOR else []
        return start_triton(repo, grpc_port, log, pool, http_port, prefix=prefix)
    extra = {"trireme_native": ["--grpc-transport", "native"], "trireme_h2": ["--grpc-transport", "h2"]}.get(kind, [])
    env = {"TRIREME_PURE_PYTHON": "1"} if kind == "trireme_pure" else {"TRIREME_PURE_PYTHON": "0"}
    return start_trireme(repo, grpc_port, log, extra_args=extra, env=env, http_port=http_port, prefix=prefix)


def wait_ready(port: int, proc: subprocess.Popen[bytes], model: str, timeout_s: float) -> None:
    """Wait for the port, then until one inference through perf_analyzer works (the model is loaded)."""
    wait_port(port, proc, timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pa(port, model, 1, 1, check=False) is not None:
            return
        time.sleep(1)
    raise TimeoutError(f"server on {port} never answered an inference")


SHM: list[str] = []  # perf_analyzer flags for --shm (set in main)


def pa(port: int, model: str, concurrency: int, requests: int, shape: int = 16, check: bool = True) -> float | None:
    """Send exactly `requests` requests with perf_analyzer (pinned to CLIENT_CPU); requests per second of wall time
    around the whole run, perf_analyzer's start included (its own figure is rounded to whole seconds in
    --request-count mode); None if it failed and not check."""
    cmd = [
        "taskset", "-c", CLIENT_CPU, str(ANCHORS / "bin" / "perf_analyzer"), "-m", model, "-i", PROTOCOL[0],
        "-u", f"127.0.0.1:{port}", "--shape", f"INPUT0:{shape}", "--concurrency-range", f"{concurrency}:{concurrency}",
        "--request-count", str(requests), *SHM,
    ]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - t0
    if res.returncode != 0 or "throughput:" not in res.stdout:
        if check:
            raise RuntimeError(f"perf_analyzer failed:\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}")
        return None
    return requests / seconds


def served(kind: str, port: int) -> int:
    """Requests the server has counted (the echoes count ModelInfer calls too)."""
    return inference_counts(GRPC_PORTS.get(port, port), MODELS[kind])[0]


def cpu_phase(args: argparse.Namespace, work: Path) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Phase 1: {(server, c): per-round {"ips", "server", "children"}} from /proc."""
    ports = {k: free_port() for k in args.servers}
    procs = {k: start(k, work, ports[k], ["taskset", "-c", SERVER_CPU], args.shape) for k in args.servers}
    out: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for k in args.servers:
            wait_ready(ports[k], procs[k], MODELS[k], 180)
            warm = max(20, min(1000, (64 << 20) // (4 * args.shape)))  # fewer for large tensors
            # warm-up (c=1 for large tensors: eight 64 MiB requests in flight at once need GBs in every copy, and
            # Triton 2.51's Python stub was reported unhealthy at c=2 with 64 MiB over the wire)
            pa(ports[k], MODELS[k], 1 if 4 * args.shape >= LARGE_TENSOR else 8, warm, args.shape)
        names = list(args.servers)
        for r in range(args.rounds):
            for c in args.concurrency:
                for k in names[r % len(names) :] + names[: r % len(names)]:
                    pid, n0, before = procs[k].pid, served(k, ports[k]), tree_usage(procs[k].pid)
                    ips = pa(ports[k], MODELS[k], c, args.requests, args.shape)
                    after, n1 = tree_usage(pid), served(k, ports[k])
                    if n1 - n0 != args.requests:
                        print(f"note: {k} counted {n1 - n0} requests for {args.requests} sent", file=sys.stderr)
                    usage = usage_per_request(before, after, args.requests, pid)
                    row = {
                        "ips": ips or 0.0,
                        "server": usage["server"]["cpu_us"],
                        "children": sum(v["cpu_us"] for n, v in usage.items() if n != "server"),
                        "wakeups": usage["server"]["wakeups"],
                    }
                    out.setdefault((k, c), []).append(row)
                    print(f"round {r} c={c} {k}: {row}", file=sys.stderr, flush=True)
    finally:
        stop(procs.values())
    return out


def callgrind(pids: list[int], command: str) -> None:
    """callgrind_control `command` (e.g. -z, -d, -i on) for each pid (valgrind's pid is the program's pid)."""
    for pid in pids:
        subprocess.run(["callgrind_control", *command.split(), str(pid)], capture_output=True, timeout=120)


def dumped_ir(work: Path, pid: int) -> int:
    """Ir of the last dump of pid (callgrind.<pid>.<n> files; the highest n)."""
    dumps = sorted(work.glob(f"cg.{pid}.*"), key=lambda p: int(p.suffix[1:]))
    if not dumps:
        return 0
    for line in dumps[-1].read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    return 0


def measure_ir(work: Path, pids: list[int], send: Callable[[], object]) -> dict[int, int]:
    """Zero the counters of pids, run send(), dump; Ir by pid."""
    callgrind(pids, "-z")
    send()
    callgrind(pids, "-d")
    time.sleep(1)
    return {pid: dumped_ir(work, pid) for pid in pids}


def callgrind_phase(args: argparse.Namespace, work: Path) -> dict[tuple[str, int], dict[str, float]]:
    """Phase 2: {(server, c): {"server", "children", "idle"}} instructions per request (idle: Ir/s)."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    kinds = [k for k in args.servers if k != "triton" or args.callgrind_triton]
    for k in kinds:
        port = free_port()
        prefix = ["taskset", "-c", SERVER_CPU, *VALGRIND, f"--callgrind-out-file={work}/cg.%p"]
        proc = start(k, work, port, prefix, args.shape)
        try:
            wait_ready(port, proc, MODELS[k], 900)
            pids = process_tree(proc.pid)
            callgrind(pids, "-i on")
            pa(port, MODELS[k], 2, 200, args.shape)  # warm-up with instrumentation on
            for c in args.concurrency:
                t0 = time.monotonic()
                ir = measure_ir(work, pids, partial(pa, port, MODELS[k], c, args.cg_requests, args.shape))
                seconds = time.monotonic() - t0
                idle_s = min(seconds, 20.0)
                idle = measure_ir(work, pids, partial(time.sleep, idle_s))
                idle_rate = sum(idle.values()) / idle_s
                n = args.cg_requests
                out[(k, c)] = {
                    "server": ir[proc.pid] / n,
                    "children": sum(v for p, v in ir.items() if p != proc.pid) / n,
                    "idle": idle_rate,
                    "seconds": seconds,
                }
                last = {p: max((int(d.suffix[1:]) for d in work.glob(f"cg.{p}.*")), default=0) for p in pids}
                where = f"load dumps cg.<pid>.<n-1>, idle cg.<pid>.<n>: {last}"  # for --keep
                print(f"callgrind {k} c={c}: {out[(k, c)]} ({where})", file=sys.stderr, flush=True)
        finally:
            stop([proc], timeout_s=120)
    return out


def keep_dumps(work: Path, dest: Path) -> None:
    """Copy the callgrind dumps of work into dest (created), for callgrind_annotate; print where they went."""
    dest.mkdir(parents=True, exist_ok=True)
    for dump in work.glob("cg.*"):
        shutil.copy2(dump, dest / dump.name)
    print(f"callgrind dumps kept in {dest}", file=sys.stderr)


def main() -> None:
    """Run the phases and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", nargs="+", default=list(ALL[: ALL.index("trireme_pure")]), choices=ALL)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=5000, help="requests per /proc measurement")
    ap.add_argument("--cg-requests", type=int, default=1000, help="requests per callgrind measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", type=int, default=16, help="FP32 elements per request")
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--no-cpu", action="store_true", help="only the callgrind phase")
    ap.add_argument("--callgrind-triton", action="store_true", help="also run Triton under callgrind (slow)")
    ap.add_argument("--shm", action="store_true", help="inputs and outputs through system shared memory")
    ap.add_argument("--keep", type=Path, help="copy the callgrind dumps (cg.<pid>.<n>) into this directory")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="perf_analyzer's -i")
    args = ap.parse_args()
    PROTOCOL[0] = args.protocol
    if args.protocol == "http":  # the echoes have no HTTP endpoint
        args.servers = [k for k in args.servers if k not in ECHOES]
    if args.shm:  # the echo has no shared-memory RPCs
        args.servers = [k for k in args.servers if k not in ECHOES]
        SHM[:] = ["--shared-memory", "system", "--output-shared-memory-size", str(args.shape * 4)]
    work = Path(tempfile.mkdtemp(prefix="bench_cpu_"))
    try:
        cpu = {} if args.no_cpu else cpu_phase(args, work)
        ir = {} if args.no_callgrind or not shutil.which("valgrind") else callgrind_phase(args, work)
        if args.keep:
            keep_dumps(work, args.keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(args, cpu, ir)


def report(
    args: argparse.Namespace,
    cpu: dict[tuple[str, int], list[dict[str, float]]],
    ir: dict[tuple[str, int], dict[str, float]],
) -> None:
    """Markdown: one row per server and concurrency; ratios to the echo floor (CPU and instructions)."""

    def med(k: str, c: int, field: str) -> float:
        rows = cpu.get((k, c), [])
        return statistics.median(r[field] for r in rows) if rows else 0.0

    print(
        f"\n{args.shape} FP32 per request over {args.protocol}{' through system shm' if args.shm else ''}; "
        f"CPU: median of {args.rounds} rounds x {args.requests} requests; "
        f"instructions: {args.cg_requests} requests under callgrind\n"
    )
    print(
        "| server | c | server CPU µs/req | children CPU µs/req | server wake-ups/req "
        "| server Ir/req | children Ir/req | total Ir ÷ echo | total Ir ÷ echo_registered | idle Ir/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        echo_ir = ir.get(("echo", c), {}).get("server", 0.0)
        echo_reg_ir = ir.get(("echo_registered", c), {}).get("server", 0.0)
        for k in args.servers:
            g = ir.get((k, c))
            total = (g["server"] + g["children"]) if g else 0.0
            ratio = f"{total / echo_ir:.2f}" if g and echo_ir else "-"
            ratio_reg = f"{total / echo_reg_ir:.2f}" if g and echo_reg_ir else "-"
            cells = [
                k,
                str(c),
                f"{med(k, c, 'server'):.0f}" if cpu else "-",
                f"{med(k, c, 'children'):.0f}" if cpu else "-",
                f"{med(k, c, 'wakeups'):.1f}" if cpu else "-",
                f"{g['server'] / 1e3:.0f}k" if g else "-",
                f"{g['children'] / 1e3:.0f}k" if g else "-",
                ratio,
                ratio_reg,
                f"{g['idle'] / 1e3:.0f}k" if g else "-",
            ]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
