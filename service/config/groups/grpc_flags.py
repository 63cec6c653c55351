"""gRPC flags beyond the security ones: header forwarding, response compression, port reuse (Triton's names)."""

from __future__ import annotations

import argparse

from service.config.access import GrpcSettings
from service.config.values import parse_bool

COMPRESSION_LEVELS = ("none", "low", "medium", "high")


def _level(text: str) -> str:
    value = text.lower()
    if value not in COMPRESSION_LEVELS:
        raise argparse.ArgumentTypeError("invalid argument for --grpc_infer_response_compression_level")
    return value


def add_grpc_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grpc-header-forward-pattern",
        default="",
        metavar="REGEX",
        help="gRPC request headers whose name matches are passed to the model as string request parameters (none)",
    )
    p.add_argument(
        "--grpc-infer-response-compression-level",
        type=_level,
        default="none",
        metavar="LEVEL",
        help="compress gRPC responses at this level (grpc core picks gzip or deflate): none, low, medium, high (none)",
    )
    p.add_argument(
        "--reuse-grpc-port",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="bind the gRPC port with SO_REUSEPORT so several servers can share it (false)",
    )


def apply_grpc_flags(settings: GrpcSettings, args: argparse.Namespace) -> None:
    settings.header_forward_pattern = args.grpc_header_forward_pattern
    settings.infer_compression_level = args.grpc_infer_response_compression_level
    settings.reuse_port = args.reuse_grpc_port
