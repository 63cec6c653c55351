"""Sliding-window latency samples behind Triton's optional summaries (--metrics-config summary_latencies=true).

Only allocated when summaries are enabled; a request then appends (time, duration) per phase, and a scrape
computes the configured quantiles over the last WINDOW_S seconds with numpy (an empty window gives NaN, as
Triton's summaries do).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
PHASES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
WINDOW_S = 60.0
MAX_SAMPLES = 100_000  # per phase: bounds memory under very high request rates


def parse_quantiles(text: str) -> list[tuple[float, float]]:
    """`0.5:0.05,0.9:0.01` -> [(0.5, 0.05), (0.9, 0.01)]; malformed pairs are skipped."""
    out = []
    for pair in text.replace(" ", ",").split(","):
        q, sep, err = pair.partition(":")
        try:
            if sep and 0.0 <= float(q) <= 1.0:
                out.append((float(q), float(err)))
        except ValueError:
            continue
    return out


class SummaryWindow:
    """Recent durations (ns) per phase, with their arrival times."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: dict[str, deque[tuple[int, int]]] = {p: deque(maxlen=MAX_SAMPLES) for p in PHASES}

    def observe(self, phase: str, ns: int) -> None:
        """Record one duration of `phase` now."""
        self.samples[phase].append((time.monotonic_ns(), ns))

    def quantiles(self, phase: str, quantiles: list[tuple[float, float]]) -> list[tuple[float, float]]:
        """(q, value in us) over the window; NaN values when nothing happened in the window."""
        samples = self.samples[phase]
        horizon = time.monotonic_ns() - int(WINDOW_S * 1e9)
        while samples and samples[0][0] < horizon:
            samples.popleft()
        if not samples:
            return [(q, float("nan")) for q, _ in quantiles]
        values = np.fromiter((ns for _, ns in samples), dtype=np.int64, count=len(samples))
        computed = np.quantile(values, [q for q, _ in quantiles], method="inverted_cdf")
        return [(q, float(v // 1000)) for (q, _), v in zip(quantiles, computed, strict=True)]
