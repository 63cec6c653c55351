"""The logging flags Trireme implements beyond --log-verbose: --log-file, --log-format and the severity switches
--log-info, --log-warning, --log-error (docs/logging.md)."""

from __future__ import annotations

import argparse

from service.config.values import parse_bool

LOG_FORMATS = ("default", "ISO8601", "json")  # json: Trireme's, one JSON object per line


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """--log-file and --log-format (Triton's names)."""
    p.add_argument(
        "--log-file",
        default="",
        metavar="PATH",
        help="append the log to PATH instead of stderr; SIGHUP reopens it (for log rotation) (stderr)",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="",
        metavar="FORMAT",
        help="log line layout: default (Triton's 'I1127 01:13:12.123456 pid file:line] \"msg\"'), ISO8601, or json "
        "(one object per line); without this flag and --log-file, Python's layout",
    )
    for severity in ("info", "warning", "error"):
        p.add_argument(
            f"--log-{severity}",
            type=parse_bool,
            default=True,
            metavar="BOOL",
            help=f"log {severity.upper()} lines, the models' pb_utils.Logger lines included (true)",
        )
