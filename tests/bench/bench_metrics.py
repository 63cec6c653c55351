"""Benchmark: does scraping /metrics every second cost throughput? Same server, same run, rounds alternate
between perf_analyzer with a 1 s scraper running and without one; prints the per-round ratio.

Usage: .venv/bin/python tests/bench/bench_metrics.py [--model identity_fp32] [--rounds 4] [--concurrency 1 4]
       [--interval 1.0]
Needs tools/install-triton-tools.sh (perf_analyzer in /tmp/trireme-anchors/bin). Also prints the hot-path cost
of the statistics the metrics read (ModelStats.record_request + record_end, per request) measured with timeit.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, perf_analyzer, start_trireme, stop, wait_started  # noqa: E402

STABILITY = ["-p", "3000", "-s", "20", "-r", "20"]


class Scraper:
    """A thread that GETs the metrics URL every `interval_s` and records how long each scrape took."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.durations_ms: list[float] = []
        self.size = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            start = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as r:
                self.size = len(r.read())
            self.durations_ms.append((time.perf_counter() - start) * 1000)

    def stop(self) -> None:
        """Stop scraping."""
        self._stop.set()
        self._thread.join()


def hot_path_ns() -> float:
    """ns per request spent in ModelStats.record_request + record_end (counters, histograms)."""
    from service.core.stats import ModelStats

    s = ModelStats()
    n = 200_000
    t = timeit.timeit(
        lambda: (s.record_request(40_000, 20_000, 300_000, 10_000), s.record_end(True, 500_000)), number=n
    )
    return t / n * 1e9


def main() -> None:
    """Alternate scraping and quiet rounds on one server and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_metrics_"))
    repo = work / "repo"
    # every example model is loaded, so a scrape carries realistic per-model families
    shutil.copytree(ROOT / "service" / "example_models", repo)
    port, metrics_port = free_port(), free_port()
    proc = start_trireme(repo, port, work / "trireme.log", extra_args=["--metrics-port", str(metrics_port)])
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    results: dict[tuple[str, int], list[float]] = {}
    scrapes: list[float] = []
    size = 0
    try:
        wait_started(proc, work / "trireme.log")
        time.sleep(2)
        for r in range(args.rounds):
            for c in args.concurrency:
                modes = ("quiet", "scraped") if r % 2 == 0 else ("scraped", "quiet")
                for mode in modes:
                    scraper = Scraper(url, args.interval) if mode == "scraped" else None
                    try:
                        row = perf_analyzer(
                            args.model, port, c, (STABILITY, ["-p", "2000", "-s", "100", "-r", "6"]), work / "pa.csv"
                        )
                    finally:
                        if scraper is not None:
                            scraper.stop()
                            scrapes += scraper.durations_ms
                            size = scraper.size or size
                    ips = float(row["Inferences/Second"])
                    results.setdefault((mode, c), []).append(ips)
                    print(f"round {r} c={c} {mode}: {ips:.0f} infer/s", file=sys.stderr, flush=True)
    finally:
        stop([proc])
    print(f"model {args.model}, scrape every {args.interval:g} s, {args.rounds} rounds (median infer/s)\n")
    print("| concurrency | no scrape | scraped | per-round ratio (scraped / no scrape) |")
    print("|---|---|---|---|")
    for c in args.concurrency:
        quiet, scraped = results[("quiet", c)], results[("scraped", c)]
        ratios = ", ".join(f"{s / q:.3f}" for q, s in zip(quiet, scraped, strict=True))
        print(f"| {c} | {statistics.median(quiet):.0f} | {statistics.median(scraped):.0f} | {ratios} |")
    if scrapes:
        print(
            f"\nscrape: {len(scrapes)} scrapes, {size} bytes, median {statistics.median(scrapes):.2f} ms, "
            f"max {max(scrapes):.2f} ms"
        )
    print(f"hot path: record_request + record_end = {hot_path_ns():.0f} ns per request")


if __name__ == "__main__":
    main()
