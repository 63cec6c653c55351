"""trireme-perf: a perf_analyzer-style load generator for Triton-compatible gRPC servers.

`trireme-perf -m MODEL [options]` profiles one server; `trireme-perf compare ...` alternates windows
between servers and prints ratios; `trireme-perf plot A.csv B.csv -o out.png` draws latency vs
throughput; `trireme-perf crosscheck ...` runs the real perf_analyzer and trireme-perf in turn.
Exit status: 0 ok, 1 server or request failure, 2 bad arguments or a load that does not fit the model,
3 no stable measurement.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from load.cli import EXIT_OK, EXIT_UNSTABLE, add_load_options, guarded, validate


def build_parser() -> argparse.ArgumentParser:
    """The profile command's parser."""
    p = argparse.ArgumentParser(
        prog="trireme-perf",
        description="perf_analyzer-style load generator (also: 'trireme-perf compare ...', 'trireme-perf plot ...')",
    )
    p.add_argument("-u", dest="url", default="localhost:8001", help="server gRPC host:port")
    add_load_options(p)
    p.add_argument("-f", dest="csv", default=None, help="write perf_analyzer-style CSV here")
    p.add_argument("--verbose-csv", action="store_true", help="extra CSV columns")
    p.add_argument("--json", dest="json_path", default=None, help="write a JSON summary here ('-' = stdout)")
    p.add_argument(
        "--plot", default=None, help="write a latency-vs-throughput PNG here (needs the plot extra: matplotlib)"
    )
    p.add_argument("--plot-latency", default="p99", help="latency column for --plot (p50/p90/p95/p99/avg)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `trireme-perf` and `python -m load`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        from load.compare import main as compare_main

        return compare_main(argv[1:])
    if argv and argv[0] == "crosscheck":
        from load.crosscheck import main as crosscheck_main

        return crosscheck_main(argv[1:])
    if argv and argv[0] == "plot":
        from load.report.plot import main as plot_main

        return plot_main(argv[1:])
    args = build_parser().parse_args(argv)
    return guarded(lambda: _profile(args), args.verbose)


def _profile(args: argparse.Namespace) -> int:
    from load.measure.session import Session
    from load.report import formats as report

    validate(args)
    if args.plot:
        from load.report.plot import require_matplotlib

        require_matplotlib()  # before the run, not after minutes of measuring
    out = sys.stderr if args.json_path == "-" else sys.stdout  # keep stdout pure JSON then
    with Session.open(args.url, args) as session:
        progress = report.ProgressLine(sys.stderr, args.progress)
        profiler = session.profiler(progress, verbose=args.verbose, out=out)
        out.write(report.format_settings(session.settings) + "\n")
        out.flush()
        results, problem = [], None
        for level in session.levels:
            results_one, problem = profiler.sweep([level], args.allow_unstable)
            progress.clear()
            for r in results_one:
                out.write(report.format_level(r, session.include_server) + "\n")
                out.flush()
            results += results_one
            if problem:
                break
        if problem:
            sys.stderr.write(f"trireme-perf: {problem}\n")
        out.write(report.format_summary(results))
        if args.csv and results:
            report.write_csv(args.csv, results, session.include_server, args.verbose_csv)
        if args.json_path:
            report.write_json(args.json_path, report.summary_dict(session.settings, results, problem))
        if args.plot and results:
            from load.report.plot import plot_series, series_from_results

            plot_series([series_from_results(args.model, results, args.plot_latency)], args.plot)
    if problem and "stable" in problem:
        return EXIT_UNSTABLE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
