"""Benchmark: Trireme vs real Triton on the same Python-backend model with the real perf_analyzer, interleaved.

Usage: .venv/bin/python tests/bench/bench_core_vs_triton.py [--model identity_fp32] [--rounds 3]
       [--concurrency 1 8] [--extra-pa-args "..."]
Needs tools/install-triton-tools.sh (perf_analyzer and tritonserver in $TRIREME_TOOLS/bin).
Prints a markdown table: infer/s and p50/p99 latency per server and concurrency, and the per-round ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, perf_analyzer, start_trireme, start_triton, stop, wait_port  # noqa: E402

# perf_analyzer stability settings; --stability overrides (this VM often needs a loose threshold)
STABILITY = ["-p", "3000", "-s", "20", "-r", "20"]


def perf(model: str, port: int, concurrency: int, extra: list[str], out: Path) -> dict[str, float]:
    """One perf_analyzer measurement; returns infer/s, p50 and p99 (µs). Retries once with a loose threshold."""
    attempts = (STABILITY, ["-p", "2000", "-s", "100", "-r", "6"])
    row = perf_analyzer(model, port, concurrency, attempts, out, ["--percentile", "99", *extra])
    return {"ips": float(row["Inferences/Second"]), "p50": float(row["p50 latency"]), "p99": float(row["p99 latency"])}


def main() -> None:
    """Interleave the two servers in rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--repo", default=str(ROOT / "service" / "example_models"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--extra-pa-args", default="")
    ap.add_argument("--stability", default=" ".join(STABILITY), help="perf_analyzer -p/-s/-r arguments")
    args = ap.parse_args()
    STABILITY[:] = args.stability.split()
    work = Path(tempfile.mkdtemp(prefix="bench_core_"))
    repo = work / "repo"
    repo.mkdir()
    shutil.copytree(Path(args.repo) / args.model, repo / args.model)
    ports = {"trireme": free_port(), "triton": free_port()}
    procs = {
        "trireme": start_trireme(repo, ports["trireme"], work / "trireme.log"),
        "triton": start_triton(repo, ports["triton"], work / "triton.log"),
    }
    try:
        for name, proc in procs.items():
            wait_port(ports[name], proc)
        time.sleep(2)
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for c in args.concurrency:
                for name in ("trireme", "triton"):
                    res = perf(args.model, ports[name], c, args.extra_pa_args.split(), work / f"{name}_{c}_{r}.csv")
                    results.setdefault((name, c), []).append(res)
                    print(f"round {r} c={c} {name}: {res['ips']:.0f} infer/s p50 {res['p50']:.0f} us", file=sys.stderr)
        print(
            f"| model | c | Trireme infer/s | Triton infer/s | ratio (median of {args.rounds} rounds) |"
            " Trireme p50/p99 µs | Triton p50/p99 µs |"
        )
        print("|---|---|---|---|---|---|---|")
        for c in args.concurrency:
            a, b = results[("trireme", c)], results[("triton", c)]
            ratios = [x["ips"] / y["ips"] for x, y in zip(a, b, strict=True)]

            def med(rows: list[dict[str, float]], key: str) -> float:
                return statistics.median(x[key] for x in rows)

            print(
                f"| {args.model} | {c} | {med(a, 'ips'):.0f} | {med(b, 'ips'):.0f} | {statistics.median(ratios):.2f}"
                f" ({min(ratios):.2f}-{max(ratios):.2f}) | {med(a, 'p50'):.0f}/{med(a, 'p99'):.0f} |"
                f" {med(b, 'p50'):.0f}/{med(b, 'p99'):.0f} |"
            )
    finally:
        stop(procs.values())
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
