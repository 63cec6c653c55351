"""The tracing flags: --trace-config and Triton's older spellings (--trace-file, --trace-level, --trace-rate,
--trace-count, --trace-log-frequency), folded into one list of --trace-config entries checked at start-up."""

from __future__ import annotations

import argparse


def add_trace_flags(p: argparse.ArgumentParser) -> None:
    """--trace-config (repeatable) and the older one-setting flags."""
    p.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]KEY=VALUE",
        help="tracing: level=TIMESTAMPS|TENSORS|OFF (repeatable), rate=N (trace 1 request in N, 1000), "
        "count=N (-1: no limit), mode=triton|opentelemetry; triton,file=PATH and triton,log-frequency=N; "
        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_* (tracing OFF)",
    )
    for old, key, what in (
        ("--trace-file", "triton,file", "PATH"),
        ("--trace-level", "level", "LEVEL"),
        ("--trace-rate", "rate", "N"),
        ("--trace-count", "count", "N"),
        ("--trace-log-frequency", "triton,log-frequency", "N"),
    ):
        p.add_argument(
            old,
            action="append",
            default=[],
            dest=old[2:].replace("-", "_"),
            metavar=what,
            help=f"older Triton spelling of --trace-config {key}={what}",
        )


def trace_entries(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """Every tracing setting as --trace-config entries, older flags first; a bad one stops the server (exit 2)."""
    entries = [
        *(f"triton,file={v}" for v in args.trace_file),
        *(f"level={v}" for v in args.trace_level),
        *(f"rate={v}" for v in args.trace_rate),
        *(f"count={v}" for v in args.trace_count),
        *(f"triton,log-frequency={v}" for v in args.trace_log_frequency),
        *args.trace_config,
    ]
    from service.core.observability.trace_settings import parse_trace_config

    try:
        parse_trace_config(entries, warn=True)
    except ValueError as e:
        parser.error(f"--trace-config: {e}")
    return entries
