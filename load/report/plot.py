"""Latency-vs-throughput plots, one line per run, from results or -f CSV files (ours or perf_analyzer's).

matplotlib is optional (the `plot` extra): `require_matplotlib` fails with a PlotError saying how to install it,
and the commands call it before they measure anything. Each point is labelled with its concurrency or request rate.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

from load.measure.data import PlotError
from load.measure.profiler import LevelResult

Series = tuple[str, list[tuple[float, float, str]]]  # label, [(infer/s, latency usec, point label)]
INSTALL_HINT = "pip install 'trireme[plot]' (or: pip install matplotlib)"


def _column(latency: str) -> str:
    if latency == "avg":
        return "Avg latency"
    if latency.startswith("p") and latency[1:].isdigit():
        return f"{latency} latency"
    raise PlotError(f"unknown latency '{latency}': use avg or pNN (e.g. p99)")


def series_from_results(label: str, results: Sequence[LevelResult], latency: str = "p99") -> Series:
    """(throughput, latency) points of a finished run."""
    _column(latency)
    points = []
    for r in results:
        m = r.merged
        value = m.avg_ns if latency == "avg" else float(m.percentile_ns(int(latency[1:])))
        points.append((m.infer_per_sec, value / 1000.0, point_label(r.mode, r.level)))
    return label, sorted(points)


def point_label(mode: str, level: float) -> str:
    """'c=4' for a concurrency level, '500/s' for a request rate."""
    return f"c={level:g}" if mode == "concurrency" else f"{level:g}/s"


def series_from_csv(path: str, latency: str = "p99", label: str | None = None) -> Series:
    """(throughput, latency) points from a CSV written by -f (trireme-perf or perf_analyzer)."""
    col = _column(latency)
    try:
        with Path(path).open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as err:
        raise PlotError(f"cannot read '{path}': {err}") from None
    if not rows or "Inferences/Second" not in rows[0] or col not in rows[0]:
        raise PlotError(f"'{path}' has no 'Inferences/Second' and '{col}' columns (avg needs --verbose-csv)")
    mode = "concurrency" if "Concurrency" in rows[0] else "request_rate" if "Request Rate" in rows[0] else ""
    key = "Concurrency" if mode == "concurrency" else "Request Rate"
    try:
        points = [
            (float(r["Inferences/Second"]), float(r[col]), point_label(mode, float(r[key])) if mode else "")
            for r in rows
        ]
    except ValueError as err:
        raise PlotError(f"'{path}': {err}") from None
    return label or Path(path).stem, sorted(points)


def require_matplotlib() -> None:
    """Fail now, before any measurement, when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise PlotError(f"plotting needs matplotlib, which cannot be imported ({err}): {INSTALL_HINT}") from None


def plot_series(series: Sequence[Series], out: str, latency: str = "p99", title: str = "") -> None:
    """Draw every series as a line of latency over throughput, each point labelled, and save a PNG."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in series:
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        ax.plot(xs, ys, marker="o", label=label)
        for x, y, text in points:
            if text:
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.margins(x=0.08, y=0.08)  # room for the point labels at the edges
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel(f"{latency} latency (usec)")
    ax.set_title(title or "latency vs throughput")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    """`trireme-perf plot A.csv [B.csv ...] -o out.png [--latency p99] [--label NAME ...]`."""
    from load.cli import guarded

    p = argparse.ArgumentParser(prog="trireme-perf plot", description="latency vs throughput from CSV files")
    p.add_argument("csv", nargs="+", help="CSV files written with -f")
    p.add_argument("-o", "--output", required=True, help="PNG to write")
    p.add_argument("--latency", default="p99", help="avg or pNN (default p99)")
    p.add_argument("--label", action="append", default=[], help="legend label per CSV, in order")
    p.add_argument("--title", default="", help="plot title")
    args = p.parse_args(list(argv))

    def run() -> int:
        require_matplotlib()
        labels = list(args.label) + [None] * len(args.csv)
        series = [series_from_csv(path, args.latency, labels[i]) for i, path in enumerate(args.csv)]
        plot_series(series, args.output, args.latency, args.title)
        return 0

    return guarded(run, False)
