"""Benchmark: the cost of tracing, with the real perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_trace.py [--rounds 3] [--stability "-p 3000 -s 20 -r 20"]
Needs perf_analyzer (tools/install-triton-tools.sh, $TRIREME_TOOLS/bin).

One server on the identity example model (FP32[16]); each round measures, back to back, tracing off
(level OFF: the request path does not look at the tracer beyond one flag), level TIMESTAMPS at rate 1000 (one
request in 1000 traced) and at rate 1 (every request traced, trace file written every 1000 traces), switching
with the TraceSetting RPC. Prints infer/s medians and the same-round ratios to "off", at c=1 and c=4.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import (  # noqa: E402
    free_port,
    perf_analyzer,
    rounds_and_attempts,
    start_trireme,
    stop,
    wait_started,
)

MODEL = "identity_fp32"
SETTINGS = {
    "off": {"trace_level": ["OFF"]},
    "rate 1000": {"trace_level": ["TIMESTAMPS"], "trace_rate": ["1000"]},
    "rate 1": {"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]},
}


def main() -> None:
    import tritonclient.grpc as grpcclient

    args, attempts = rounds_and_attempts(__doc__)
    results: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port = free_port()
        log = root / "server.log"
        trace_args = [
            "--trace-config",
            f"triton,file={root / 'trace.json'}",
            "--trace-config",
            "triton,log-frequency=1000",
        ]
        proc = start_trireme(ROOT / "service" / "example_models", port, log, extra_args=trace_args)
        try:
            wait_started(proc, log)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            for r in range(args.rounds):
                for c in (1, 4):
                    for name, setting in SETTINGS.items():
                        client.update_trace_settings(settings=setting)
                        row = perf_analyzer(MODEL, port, c, attempts, root / f"{r}-{c}-{name}.csv")
                        results.setdefault((name, c), []).append(float(row["Inferences/Second"]))
                        print(f"round {r + 1} c={c} {name}: {row['Inferences/Second']} infer/s", file=sys.stderr)
            client.close()
        finally:
            stop([proc])
    print(f"Tracing cost, {args.rounds} interleaved rounds, medians (perf_analyzer {args.stability}):\n")
    print("| tracing | c | infer/s | ÷ off (same round) |")
    print("|---|---|---|---|")
    for c in (1, 4):
        for name in SETTINGS:
            ratios = [x / y for x, y in zip(results[(name, c)], results[("off", c)], strict=True)]
            print(f"| {name} | {c} | {statistics.median(results[(name, c)]):.0f} | {statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    main()
