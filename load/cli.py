"""What every trireme-perf command shares: option types and options, cross-option checks, exit codes, and the
wrapper that turns expected failures into one-line messages (`guarded`)."""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any

from load.measure.data import ConfigError, PlotError

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_UNSTABLE = 0, 1, 2, 3


def _range(text: str, kind: type) -> tuple[Any, Any, Any]:
    parts = text.split(":")
    try:
        values = [kind(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not start[:end[:step]]") from None
    if not 1 <= len(values) <= 3 or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}' is not start[:end[:step]] with non-negative values")
    start = values[0]
    end = values[1] if len(values) > 1 else start
    step = values[2] if len(values) > 2 else kind(1)
    if end < start or step <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': need start <= end and step > 0")
    return start, end, step


def int_range(text: str) -> tuple[Any, Any, Any]:
    """argparse type for --concurrency-range."""
    return _range(text, int)


def float_range(text: str) -> tuple[Any, Any, Any]:
    """argparse type for --request-rate-range."""
    return _range(text, float)


def add_load_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the profile and compare commands (perf_analyzer's names and meanings)."""
    p.add_argument("-m", dest="model", required=True, help="model name")
    p.add_argument("-x", dest="model_version", default="", help="model version (default: server's choice)")
    p.add_argument("-i", dest="protocol", default="grpc", choices=["grpc", "http"], help="protocol (grpc)")
    p.add_argument("-b", dest="batch_size", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--shape", action="append", default=[], help="NAME:d1,d2 for inputs with variable dims")
    p.add_argument("--input-data", default="random", help="random, zero, or a JSON data file")
    p.add_argument("--string-length", type=int, default=128, help="length of random BYTES elements")
    p.add_argument("--string-data", default=None, help="use this string for every BYTES element")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--concurrency-range", type=int_range, default=None, help="start:end:step (default 1)")
    g.add_argument("--request-rate-range", type=float_range, default=None, help="start:end:step requests/s")
    p.add_argument("--request-distribution", choices=["constant", "poisson"], default="constant")
    p.add_argument("--streaming", action="store_true", help="use the ModelStreamInfer bidirectional stream")
    p.add_argument(
        "--transport",
        choices=["h2", "grpc"],
        default="h2",
        help="unary calls over trireme-perf's lean HTTP/2 client (default) or the grpc library",
    )
    p.add_argument("-a", "--async", dest="use_async", action="store_true", help="grpc: callbacks, not threads")
    p.add_argument("--sync", dest="use_async", action="store_false", help="grpc: a blocking thread per slot (default)")
    p.add_argument("--sequence-length", type=int, default=None, help="requests per sequence (default 20)")
    p.add_argument("--sequence-length-variation", type=float, default=20.0, help="+/- percent (default 20)")
    p.add_argument("--sequence-id-range", default="1", help="start[:end] of sequence ids (end exclusive)")
    p.add_argument("--num-of-sequences", type=int, default=4, help="active sequences in request-rate mode")
    p.add_argument("--shared-memory", choices=["none", "system", "cuda"], default="none")
    p.add_argument("--output-shared-memory-size", type=int, default=102400, help="bytes per output region")
    # defaults for a shared, noisy machine; perf_analyzer's are -p 5000 -s 10 -r 10
    p.add_argument("-p", "--measurement-interval", type=int, default=3000, help="window in msec (default 3000)")
    p.add_argument(
        "-s", "--stability-percentage", type=float, default=20.0, help="allowed spread of the last 3 windows (20)"
    )
    p.add_argument("-r", "--max-trials", type=int, default=20, help="windows per level before giving up (20)")
    p.add_argument("--percentile", type=int, default=None, help="stabilize on this latency percentile")
    p.add_argument("-l", "--latency-threshold", type=float, default=0.0, help="msec; stop the sweep above it")
    p.add_argument("--max-threads", type=int, default=16, help="threads per process before callbacks take over")
    p.add_argument("--processes", "--workers", dest="processes", type=int, default=1, help="client processes")
    p.add_argument("--allow-unstable", action="store_true", help="report levels that did not stabilize")
    p.add_argument("--rpc-timeout", type=float, default=10.0, help="seconds for control RPCs")
    p.add_argument("--seed", type=int, default=0, help="seed for random data and Poisson gaps")
    p.add_argument("-v", dest="verbose", action="store_true", help="print every measurement window")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="live progress line")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line")


def validate(args: argparse.Namespace) -> None:
    """Cross-option checks argparse cannot express; raises ConfigError."""
    if args.protocol == "http":
        raise ConfigError("HTTP is not supported by trireme-perf yet; use -i grpc")
    checks = [
        (args.measurement_interval > 0, "--measurement-interval must be > 0"),
        (args.max_trials >= 3, "--max-trials must be at least 3 (stability needs 3 windows)"),
        (args.stability_percentage > 0, "--stability-percentage must be > 0"),
        (args.processes >= 1, "--processes must be at least 1"),
        (args.max_threads >= 1, "--max-threads must be at least 1"),
        (args.percentile is None or 0 < args.percentile < 100, "--percentile must be in 1..99"),
        (args.num_of_sequences >= 1, "--num-of-sequences must be at least 1"),
        (args.sequence_length is None or args.sequence_length >= 1, "--sequence-length must be at least 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def guarded(fn: Any, verbose: bool) -> int:
    """Run a command, turning expected failures into one-line messages and exit codes."""
    from load.measure.profiler import LoadError
    from load.transports.client import ClientError

    try:
        return int(fn())
    except ConfigError as err:
        return _fail(str(err), EXIT_CONFIG)
    except ClientError as err:
        return _fail(f"server error: {err}", EXIT_FAILURE)
    except LoadError as err:
        return _fail(f"inference failed: {err}", EXIT_FAILURE)
    except PlotError as err:
        return _fail(str(err), EXIT_FAILURE)
    except ConnectionError as err:
        return _fail(f"server error: {err}", EXIT_FAILURE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as err:  # a bug: say so in one line unless -v asks for the traceback
        if verbose:
            traceback.print_exc()
        return _fail(f"internal error: {type(err).__name__}: {err}", EXIT_FAILURE)


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"trireme-perf: error: {message}\n")
    return code
