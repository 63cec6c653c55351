"""Cross-check trireme-perf against the real perf_analyzer: same server, same model, interleaved rounds.

`trireme-perf crosscheck -u HOST:PORT -m MODEL --concurrency 1,4 --rounds 3` runs perf_analyzer and
trireme-perf alternately at each concurrency and prints a markdown table: infer/s of both (medians), the
median of the per-round ratios, and each client's CPU cost (whole-run CPU time / wall time / infer/s).
With `--server triton|trireme` instead of `-u` it starts that server on the test models first.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from load.measure.data import ConfigError
from load.servers import PERF_ANALYZER_BIN, start_server, write_model_repo


@dataclass
class Run:
    """One tool run: reported infer/s and client CPU cores over the run."""

    infer_per_sec: float
    cpu_cores: float

    @property
    def cpu_us_per_request(self) -> float:
        """Client CPU microseconds per inference, from whole-run CPU and the reported rate."""
        return self.cpu_cores / self.infer_per_sec * 1e6 if self.infer_per_sec else 0.0


@dataclass
class Row:
    """All rounds at one concurrency."""

    concurrency: int
    pa: list[Run] = field(default_factory=list)
    ours: list[Run] = field(default_factory=list)

    def ratios(self) -> list[float]:
        """Per-round trireme-perf / perf_analyzer throughput ratios."""
        return [o.infer_per_sec / p.infer_per_sec for p, o in zip(self.pa, self.ours, strict=True) if p.infer_per_sec]


def _timed(cmd: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a command; return it and the CPU cores its process tree used over its wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, cpu / wall if wall > 0 else 0.0


def run_perf_analyzer(url: str, model: str, concurrency: int, stab: list[str], timeout_s: float) -> Run:
    """One perf_analyzer run at one concurrency."""
    cmd = [PERF_ANALYZER_BIN, "-m", model, "-u", url, "-i", "grpc", *stab, "--concurrency-range", str(concurrency)]
    proc, cores = _timed(cmd, timeout_s)
    found = re.search(r"Throughput: ([0-9.]+) infer/sec", proc.stdout)
    if proc.returncode != 0 or not found:
        raise ConfigError(f"perf_analyzer failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-500:]}")
    return Run(float(found.group(1)), cores)


def run_trireme_perf(
    url: str, model: str, concurrency: int, stab: list[str], extra: list[str], timeout_s: float
) -> Run:
    """One trireme-perf run at one concurrency (unstable levels are reported rather than dropped)."""
    cmd = [sys.executable, "-m", "load", "-m", model, "-u", url, *stab, "--concurrency-range", str(concurrency)]
    cmd += [*extra, "--allow-unstable", "--no-progress", "--json", "-"]
    proc, cores = _timed(cmd, timeout_s)
    if proc.returncode != 0:
        raise ConfigError(f"trireme-perf failed ({proc.returncode}): {proc.stderr[-500:]}")
    return Run(float(json.loads(proc.stdout)["results"][0]["infer_per_sec"]), cores)


def format_table(url: str, model: str, how: str, rows: Sequence[Row]) -> str:
    """Markdown table of the medians."""
    lines = [
        f"server {url}, model {model}, trireme-perf {how}; medians over rounds",
        "",
        "| c | perf_analyzer infer/s | trireme-perf infer/s | ratio (min-max) | PA CPU us/inf "
        "| trireme-perf CPU us/inf |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        rat = r.ratios()
        pa = statistics.median(x.infer_per_sec for x in r.pa)
        ours = statistics.median(x.infer_per_sec for x in r.ours)
        pa_cpu = statistics.median(x.cpu_us_per_request for x in r.pa)
        our_cpu = statistics.median(x.cpu_us_per_request for x in r.ours)
        span = f"{statistics.median(rat):.2f} ({min(rat):.2f}-{max(rat):.2f})" if rat else "n/a"
        lines.append(f"| {r.concurrency} | {pa:.0f} | {ours:.0f} | {span} | {pa_cpu:.0f} | {our_cpu:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    """Entry point of `trireme-perf crosscheck`."""
    from load.cli import guarded

    p = argparse.ArgumentParser(prog="trireme-perf crosscheck", description="trireme-perf vs perf_analyzer")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-u", dest="url", help="server gRPC host:port")
    where.add_argument("--server", choices=["triton", "trireme"], help="start this server on the test models")
    p.add_argument("-m", dest="model", default="identity_fp32")
    p.add_argument("--concurrency", default="1,4", help="comma-separated levels (default 1,4)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--processes", type=int, default=1, help="trireme-perf client processes")
    p.add_argument("--transport", choices=["h2", "grpc"], default="h2", help="trireme-perf transport")
    p.add_argument("-p", dest="window", default="3000", help="measurement window msec (default 3000)")
    p.add_argument("--stability", default="20", help="-s for both tools (default 20)")
    p.add_argument("--max-trials", default="20", help="-r for both tools (default 20)")
    args = p.parse_args(list(argv))
    return guarded(lambda: _run(args), False)


def _run(args: argparse.Namespace) -> int:
    if not Path(PERF_ANALYZER_BIN).exists():
        raise ConfigError(
            f"perf_analyzer not found at {PERF_ANALYZER_BIN} "
            "(run tools/install-triton-tools.sh; TRIREME_TOOLS sets the folder)"
        )
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    stab = ["-p", args.window, "-s", args.stability, "-r", args.max_trials]
    timeout_s = 60 + 1.3 * int(args.window) / 1000 * int(args.max_trials)
    extra = ["--processes", str(args.processes), "--transport", args.transport]
    with tempfile.TemporaryDirectory(prefix="trireme-crosscheck-") as tmp:
        handle = None
        url = args.url
        if args.server:
            repo = write_model_repo(Path(tmp) / "models", [args.model])
            handle = start_server(args.server, repo, Path(tmp))
            url = handle.url
        try:
            rows = [Row(c) for c in levels]
            for rnd in range(args.rounds):
                for row in rows:
                    first_pa = rnd % 2 == 0
                    for tool in ("pa", "ours") if first_pa else ("ours", "pa"):
                        if tool == "pa":
                            row.pa.append(run_perf_analyzer(url, args.model, row.concurrency, stab, timeout_s))
                        else:
                            row.ours.append(run_trireme_perf(url, args.model, row.concurrency, stab, extra, timeout_s))
                    sys.stderr.write(
                        f"round {rnd + 1} c={row.concurrency}: perf_analyzer {row.pa[-1].infer_per_sec:.0f}, "
                        f"trireme-perf {row.ours[-1].infer_per_sec:.0f} infer/s\n"
                    )
        finally:
            if handle is not None:
                handle.stop()
    how = f"--transport {args.transport} --processes {args.processes}"
    sys.stdout.write(format_table(url, args.model, how, rows))
    return 0
