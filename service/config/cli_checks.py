"""Command-line rules Triton applies that are not single flags: an unknown option stops the server (a typo in a
port or TLS flag must not start a server on its defaults), `--version`, and Triton's gRPC thread/pool flags."""

from __future__ import annotations

import argparse
import difflib
import sys

from service import version_text

GRPC_INFER_THREADS = (2, 128)  # Triton's allowed range of --grpc-infer-thread-count


def _infer_thread_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {text}") from None
    low, high = GRPC_INFER_THREADS
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"invalid argument for --grpc_infer_thread_count. Must be in the range {low} to {high}."
        )
    return value


def _response_pool_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {text}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("Error: --grpc-max-response-pool-size must be greater than 0.")
    return value


class _Version(argparse.Action):
    """Print the version line as it is (argparse's own version action re-wraps it) and exit 0."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(version_text() + "\n")
        raise SystemExit(0)


def add_cli_flags(p: argparse.ArgumentParser) -> None:
    """--version, and the gRPC thread/pool flags of Triton 2.5x+ (validated as Triton does; see their help)."""
    p.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print Trireme's version and the Triton version it follows, and exit",
    )
    p.add_argument(
        "--grpc-infer-thread-count",
        type=_infer_thread_count,
        default=2,
        metavar="N",
        help="Triton: gRPC inference handler threads, 2 to 128 (2); validated as Triton does, but Trireme serves "
        "gRPC on one event loop, so the count changes nothing",
    )
    p.add_argument(
        "--grpc-max-response-pool-size",
        type=_response_pool_size,
        default=None,
        metavar="N",
        help="Triton: most inference responses a gRPC stream holds unwritten (unbounded); must be > 0. Trireme "
        "bounds a stream's unwritten responses by size instead: --grpc-stream-buffer-bytes",
    )


def reject_unknown(parser: argparse.ArgumentParser, tokens: list[str]) -> None:
    """Exit 1, as tritonserver does, naming the first option nobody knows and the closest known flag."""
    if not tokens:
        return
    known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
    name = tokens[0].partition("=")[0]
    if not name.startswith("-"):
        message = f"unexpected argument '{name}'"
    else:
        message = f"unrecognized option '{name}'"
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if close:
            message += f"; did you mean '{close[0]}'?"
    sys.stderr.write(
        f"usage: {parser.usage}\n{parser.prog}: error: {message} (`{parser.prog} --help` lists every flag)\n"
    )
    raise SystemExit(1)
