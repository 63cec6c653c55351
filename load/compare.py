"""Compare mode: the same sweep against two or more servers, alternating windows, reported as ratios.

For every level and round, each server in turn gets a warm-up and one measurement window while the
others are idle (the order reverses every other round). Throughput ratios against the first server are
taken per round and summarized by their median, which is robust to a VM whose speed drifts between
rounds (its speed can swing 3-5x within minutes, so only same-round ratios compare).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from load.measure.data import ConfigError
from load.measure.profiler import Measurement
from load.measure.session import Session
from load.report.formats import ProgressLine, level_key, write_json


@dataclass
class Cell:
    """One server at one level: its per-round measurements."""

    rates: list[float] = field(default_factory=list)
    p50_us: list[float] = field(default_factory=list)
    p99_us: list[float] = field(default_factory=list)

    def add(self, m: Measurement) -> None:
        """Record one window."""
        self.rates.append(m.infer_per_sec)
        self.p50_us.append(m.percentile_ns(50) / 1000)
        self.p99_us.append(m.percentile_ns(99) / 1000)


def ratios(base: Cell, other: Cell) -> list[float]:
    """Per-round throughput ratios other/base (rounds where base measured nothing are skipped)."""
    return [o / b for b, o in zip(base.rates, other.rates, strict=True) if b > 0]


def build_parser() -> argparse.ArgumentParser:
    """The compare command's parser (load options as in the profile command)."""
    from load.cli import add_load_options

    p = argparse.ArgumentParser(prog="trireme-perf compare", description="alternate windows between servers")
    p.add_argument("-u", dest="urls", action="append", required=True, help="server host:port (2 or more)")
    p.add_argument("--label", action="append", default=[], help="name per -u, in order")
    p.add_argument("--rounds", type=int, default=5, help="windows per server and level (default 5)")
    p.add_argument("--warmup", type=int, default=1000, help="msec of load before each window (default 1000)")
    p.add_argument("-f", dest="csv", default=None, help="write the comparison as CSV")
    p.add_argument("--json", dest="json_path", default=None, help="write a JSON summary ('-' = stdout)")
    add_load_options(p)
    return p


def main(argv: Sequence[str]) -> int:
    """Entry point of `trireme-perf compare`."""
    from load.cli import guarded

    args = build_parser().parse_args(list(argv))
    return guarded(lambda: run(args), args.verbose)


def run(args: argparse.Namespace) -> int:
    """Measure every level on every server in alternating windows, then print and write ratios."""
    from load.cli import validate

    validate(args)
    if len(args.urls) < 2:
        raise ConfigError("compare needs at least two -u servers")
    if args.rounds < 1:
        raise ConfigError("--rounds must be at least 1")
    labels = [*args.label, *args.urls[len(args.label) :]][: len(args.urls)]
    out = sys.stderr if args.json_path == "-" else sys.stdout
    progress = ProgressLine(sys.stderr, args.progress)
    with ExitStack() as stack:
        sessions: list[Session] = []
        for url in args.urls:
            s = Session.open(url, args, shared=sessions[0] if sessions else None)
            sessions.append(s)
            stack.callback(s.close)
        profilers = [s.profiler(progress) for s in sessions]
        levels = sessions[0].levels
        mode = sessions[0].mode
        table: dict[float, list[Cell]] = {}
        for level in levels:
            cells = [Cell() for _ in sessions]
            for rnd in range(args.rounds):
                order = list(range(len(sessions)))
                if rnd % 2:
                    order.reverse()
                for i in order:
                    label = f"{level_key(mode).lower()} {level:g} round {rnd + 1}/{args.rounds}: {labels[i]}"
                    cells[i].add(profilers[i].measure_once(level, args.warmup / 1000.0, label))
            table[level] = cells
            progress.clear()
            out.write(format_level(mode, level, labels, cells))
            out.flush()
    if args.csv:
        write_csv(args.csv, mode, labels, table)
    if args.json_path:
        write_json(args.json_path, summary(args, mode, labels, table))
    return 0


def _fmt_ratio(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


def format_level(mode: str, level: float, labels: list[str], cells: list[Cell]) -> str:
    """A few lines per level: median infer/s and latency per server, and ratios to the first."""
    lines = [f"{level_key(mode)}: {level:g}"]
    width = max(len(x) for x in labels)
    for label, cell in zip(labels, cells, strict=True):
        lines.append(
            f"  {label:<{width}}  {statistics.median(cell.rates):10.1f} infer/s  "
            f"p50 {statistics.median(cell.p50_us):7.0f} usec  p99 {statistics.median(cell.p99_us):7.0f} usec  "
            f"windows: {', '.join(f'{r:.0f}' for r in cell.rates)}"
        )
    for label, cell in zip(labels[1:], cells[1:], strict=True):
        lines.append(f"  ratio {label}/{labels[0]}: {_fmt_ratio(ratios(cells[0], cell))}")
    return "\n".join(lines) + "\n\n"


def write_csv(path: str, mode: str, labels: list[str], table: dict[float, list[Cell]]) -> None:
    """One row per level: median infer/s, p50 and p99 per server, median ratios to the first server."""
    head = [level_key(mode)]
    for label in labels:
        head += [f"{label} infer/s", f"{label} p50 latency", f"{label} p99 latency"]
    head += [f"{label}/{labels[0]}" for label in labels[1:]]
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(head)
        for level, cells in table.items():
            row = [f"{level:g}"]
            for c in cells:
                row += [
                    f"{statistics.median(c.rates):.6g}",
                    f"{statistics.median(c.p50_us):.0f}",
                    f"{statistics.median(c.p99_us):.0f}",
                ]
            for c in cells[1:]:
                r = ratios(cells[0], c)
                row.append(f"{statistics.median(r):.4f}" if r else "")
            w.writerow(row)


def summary(args: argparse.Namespace, mode: str, labels: list[str], table: dict[float, list[Cell]]) -> dict[str, Any]:
    """The --json document of a comparison."""
    levels = []
    for level, cells in table.items():
        servers = [
            {"label": lb, "url": u, "window_infer_per_sec": c.rates, "p50_us": c.p50_us, "p99_us": c.p99_us}
            for lb, u, c in zip(labels, args.urls, cells, strict=True)
        ]
        ratio = {f"{lb}/{labels[0]}": ratios(cells[0], c) for lb, c in zip(labels[1:], cells[1:], strict=True)}
        median = {k: (statistics.median(v) if v else None) for k, v in ratio.items()}
        levels.append({"level": level, "servers": servers, "ratios": ratio, "median_ratios": median})
    return {
        "tool": "trireme-perf compare",
        "mode": mode,
        "model": args.model,
        "rounds": args.rounds,
        "measurement_interval_ms": args.measurement_interval,
        "levels": levels,
    }
