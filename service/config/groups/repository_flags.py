"""Flags of model loading (Triton's names): load threads and retries, namespacing, repository agents."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from service.config.values import parse_bool

DEFAULT_REPOAGENT_DIRECTORY = "/opt/tritonserver/repoagents"  # Triton's default


@dataclass(slots=True)
class LoadingOptions:
    """--model-load-thread-count, --model-load-retry-count, --model-namespacing, --repoagent-directory."""

    load_thread_count: int = 4
    load_retry_count: int = 0
    namespacing: bool = False
    repoagent_directory: str = DEFAULT_REPOAGENT_DIRECTORY


def add_repository_flags(p: argparse.ArgumentParser) -> None:
    """The model-loading flags."""
    p.add_argument(
        "--model-load-thread-count",
        type=int,
        default=4,
        metavar="N",
        help="how many model versions load at once (their instances start, initialize() runs) (4)",
    )
    p.add_argument(
        "--model-load-retry-count",
        type=int,
        default=0,
        metavar="N",
        help="how many more times a model version that failed to load is tried again (0)",
    )
    p.add_argument(
        "--model-namespacing",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="models of the same name may be served from different repositories; a name that is ambiguous is "
        "refused, an ensemble's steps resolve in its own repository first (false)",
    )
    p.add_argument(
        "--repoagent-directory",
        default=DEFAULT_REPOAGENT_DIRECTORY,
        metavar="DIR",
        help="where repository agents are found: DIR/<name>/agent.py (Python); 'checksum' is built in "
        f"({DEFAULT_REPOAGENT_DIRECTORY})",
    )


def loading_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LoadingOptions:
    """The options from parsed flags; a thread count below 1 is an error."""
    if args.model_load_thread_count < 1:
        parser.error(f"--model-load-thread-count must be 1 or more, got {args.model_load_thread_count}")
    if args.model_load_retry_count < 0:
        parser.error(f"--model-load-retry-count must be 0 or more, got {args.model_load_retry_count}")
    return LoadingOptions(
        args.model_load_thread_count, args.model_load_retry_count, args.model_namespacing, args.repoagent_directory
    )
