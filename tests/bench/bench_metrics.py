"""Benchmark: does scraping /metrics every second cost throughput?

One Trireme server, one long perf_analyzer run (constant concurrency) as the load. Time is cut into short slices
that alternate between "scraped" (a thread GETs /metrics every --interval seconds) and "quiet" (nobody scrapes),
swapping the order in every pair; each slice's throughput comes from the server's statistics (read over gRPC at
both ends of every slice, in both modes). This VM's speed drifts over minutes, so adjacent slices are compared:
the result is the median of the per-pair ratios (scraped / quiet).

Usage: .venv/bin/python tests/bench/bench_metrics.py [--model identity_fp32] [--pairs 20] [--slice 5]
       [--concurrency 4] [--interval 1.0]
Needs tools/install-triton-tools.sh (perf_analyzer in $TRIREME_TOOLS/bin). Also prints how long a scrape
takes and the hot-path cost of the statistics the metrics read (ModelStats.record_request + record_end).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import ANCHORS, free_port, start_trireme, stop, wait_started  # noqa: E402


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


def hot_path_ns() -> tuple[float, float]:
    """(ns per histogram observation, ns per request in ModelStats.record_request + record_end), the minimum of
    repeated timeit runs (robust to a busy machine), the cost of an empty call subtracted."""
    from service.core.observability.stats import LatencyHistogram, ModelStats

    s, h, n = ModelStats(), LatencyHistogram(), 100_000

    def request() -> None:
        s.record_request(40_000, 20_000, 300_000, 10_000)
        s.record_end(True, 500_000)

    def best(fn: object) -> float:
        return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e9  # type: ignore[arg-type]

    empty = best(lambda: None)
    return best(lambda: h.observe(500_000)) - empty, best(request) - empty


def main() -> None:
    """Run the load, alternate the slices, print the table."""
    import tritonclient.grpc as grpcclient

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--slice", type=float, default=5.0, help="seconds per slice")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_metrics_"))
    repo = work / "repo"
    shutil.copytree(ROOT / "service" / "example_models", repo)  # every example model: a realistic scrape
    port, metrics_port = free_port(), free_port()
    server = start_trireme(repo, port, work / "trireme.log", extra_args=["--metrics-port", str(metrics_port)])
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    load: subprocess.Popen[bytes] | None = None
    ratios: list[float] = []
    rates: dict[str, list[float]] = {"quiet": [], "scraped": []}
    scrapes: list[float] = []
    size = 0
    try:
        wait_started(server, work / "trireme.log")
        duration_s = args.pairs * 2 * args.slice + 30
        load = subprocess.Popen(
            [str(ANCHORS / "bin" / "perf_analyzer"), "-m", args.model, "-i", "grpc", "-u", f"127.0.0.1:{port}",
             "--concurrency-range", f"{args.concurrency}:{args.concurrency}", "-p", str(int(duration_s * 1000)),
             "-r", "1", "-s", "999"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

        def count() -> int:
            return int(client.get_inference_statistics(args.model).model_stats[0].inference_stats.success.count)

        time.sleep(5)  # warm-up
        for pair in range(args.pairs):
            order = ("quiet", "scraped") if pair % 2 == 0 else ("scraped", "quiet")
            rate = {}
            for mode in order:
                scraper = Scraper(url, args.interval) if mode == "scraped" else None
                start_n, start_t = count(), time.monotonic()
                time.sleep(args.slice)
                end_n, end_t = count(), time.monotonic()
                if scraper is not None:
                    scraper.stop()
                    scrapes += scraper.durations_ms
                    size = scraper.size or size
                rate[mode] = (end_n - start_n) / (end_t - start_t)
                rates[mode].append(rate[mode])
            ratios.append(rate["scraped"] / rate["quiet"])
            print(f"pair {pair}: quiet {rate['quiet']:.0f}/s scraped {rate['scraped']:.0f}/s", file=sys.stderr)
        client.close()
    finally:
        if load is not None:
            load.kill()
            load.wait()
        stop([server])
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    print(
        f"model {args.model}, perf_analyzer concurrency {args.concurrency}, {args.pairs} pairs of {args.slice:g} s "
        f"slices, scrape every {args.interval:g} s\n"
    )
    print("| no scrape (median infer/s) | scraped (median infer/s) | ratio scraped/quiet: median (IQR) |")
    print("|---|---|---|")
    print(
        f"| {statistics.median(rates['quiet']):.0f} | {statistics.median(rates['scraped']):.0f} | "
        f"{med:.3f} ({q1:.3f}-{q3:.3f}) |"
    )
    print(
        f"\nscrape: {len(scrapes)} scrapes of {size} bytes, median {statistics.median(scrapes):.2f} ms, "
        f"max {max(scrapes):.2f} ms (round trip, client included)"
    )
    observe, per_request = hot_path_ns()
    print(
        f"hot path: one histogram observation {observe:.0f} ns; record_request + record_end (counters and three "
        f"observations) {per_request:.0f} ns per request"
    )


if __name__ == "__main__":
    main()
