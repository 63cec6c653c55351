"""Benchmark: the response cache, with the real perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_cache.py [--rounds 3] [--stability "-p 3000 -s 20 -r 20"]
Needs perf_analyzer (tools/install-triton-tools.sh, $TRIREME_TOOLS/bin).

Scenarios, each measured in every round (interleaved, so the VM's speed swings hit both sides of a ratio alike),
all on one server started with a small cache budget:
- `sleep5_cached` vs `sleep5_plain`: execute sleeps 5 ms; perf_analyzer repeats one input, so every request
  after the first is a hit on the cached model. Infer/s at c=1 and c=4.
- `echo_cached` vs `echo_plain`: identity FP32[16], fed 256 distinct inputs in turn; the budget holds far fewer
  entries, so every request on the cached model misses (lookup + insert + eviction): the cost of a miss.
Prints a markdown table (medians over rounds), then the in-process cost of the cache's own work per request
(key + lookup, and key + lookup + insert with eviction), which perf_analyzer cannot resolve on a noisy VM.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_batching import SLEEP_MODEL  # noqa: E402
from tests.bench.servers import (  # noqa: E402
    free_port,
    perf_analyzer,
    rounds_and_attempts,
    start_trireme,
    stop,
    wait_started,
)

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] }} ]
response_cache {{ enable: {cached} }}
"""
BUDGET_BYTES = 4096  # ~20 entries of 16 floats: far fewer than the 256 distinct inputs of the miss scenario
DISTINCT_INPUTS = 256


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    for name, seconds, cached in (
        ("sleep5_cached", 0.005, "true"),
        ("sleep5_plain", 0.005, "false"),
        ("echo_cached", 0, "true"),
        ("echo_plain", 0, "false"),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, cached=cached))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(SLEEP_MODEL.format(seconds=seconds)))
    return repo


def distinct_inputs(path: Path) -> Path:
    rows = [{"IN": np.full(16, i, np.float32).tolist()} for i in range(DISTINCT_INPUTS)]
    path.write_text(json.dumps({"data": rows}))
    return path


def main() -> None:
    args, attempts = rounds_and_attempts(__doc__)
    scenarios = [
        ("sleep5_cached", 1, []),
        ("sleep5_plain", 1, []),
        ("sleep5_cached", 4, []),
        ("sleep5_plain", 4, []),
        ("echo_cached", 1, "distinct"),
        ("echo_plain", 1, "distinct"),
    ]
    results: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = make_repo(root)
        data = distinct_inputs(root / "distinct.json")
        port = free_port()
        log = root / "server.log"
        proc = start_trireme(repo, port, log, extra_args=["--cache-config", f"local,size={BUDGET_BYTES}"])
        try:
            wait_started(proc, log)
            for r in range(args.rounds):
                for model, c, feed in scenarios:
                    extra = ["--input-data", str(data)] if feed else []
                    row = perf_analyzer(model, port, c, attempts, root / f"{model}-{c}-{r}.csv", extra)
                    results.setdefault((model, c), []).append(float(row["Inferences/Second"]))
                    print(f"round {r + 1} {model} c={c}: {row['Inferences/Second']} infer/s", file=sys.stderr)
        finally:
            stop([proc])

    def med(model: str, c: int) -> float:
        return statistics.median(results[(model, c)])

    def ratio(a: str, b: str, c: int) -> float:
        return statistics.median(x / y for x, y in zip(results[(a, c)], results[(b, c)], strict=True))

    print(f"Response cache, {args.rounds} interleaved rounds, medians (perf_analyzer {args.stability}):\n")
    print("| scenario | c | cached infer/s | uncached infer/s | cached / uncached |")
    print("|---|---|---|---|---|")
    for c in (1, 4):
        print(
            f"| 5 ms model, every request a hit | {c} | {med('sleep5_cached', c):.0f} | "
            f"{med('sleep5_plain', c):.0f} | {ratio('sleep5_cached', 'sleep5_plain', c):.2f} |"
        )
    print(
        f"| identity, every request a miss | 1 | {med('echo_cached', 1):.0f} | {med('echo_plain', 1):.0f} | "
        f"{ratio('echo_cached', 'echo_plain', 1):.2f} |"
    )
    hit_us, miss_us = micro_costs()
    print(f"\nIn process (no server): a hit costs {hit_us:.1f} µs, a miss {miss_us:.1f} µs (16 floats).")


def micro_costs(n: int = 20000) -> tuple[float, float]:
    """µs per request of a hit (key + lookup) and of a miss (key + lookup + insert + eviction), 16 floats."""
    import timeit

    from service.core.pipeline.response_cache import ResponseCache, request_key
    from service.types import InferRequest, InputTensor, OutputTensor

    data = np.arange(16, dtype=np.float32).tobytes()
    outputs = [OutputTensor("OUT", "FP32", [16], data)]
    cache = ResponseCache(BUDGET_BYTES)
    every = frozenset({"OUT"})
    counter = iter(range(10**9))

    def no_shm(request: InferRequest, name: str) -> None:
        return None

    def miss() -> None:
        tail = next(counter).to_bytes(4, "little")
        request = InferRequest("m", "1", inputs=[InputTensor("IN", "FP32", [16], data[:-4] + tail)])
        key = request_key(request, no_shm, every)
        assert key is not None and cache.lookup(key) is None
        cache.insert(key, outputs, {})

    def hit() -> None:
        request = InferRequest("m", "1", inputs=[InputTensor("IN", "FP32", [16], data)])
        key = request_key(request, no_shm, every)
        assert key is not None
        if cache.lookup(key) is None:
            cache.insert(key, outputs, {})

    return timeit.timeit(hit, number=n) / n * 1e6, timeit.timeit(miss, number=n) / n * 1e6


if __name__ == "__main__":
    main()
