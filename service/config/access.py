"""Flags and settings of who may call what and how connections behave: restricted API groups (Triton's
--grpc-restricted-protocol / --http-restricted-api), gRPC keepalive and connection age, admission bounds; the
TLS flags of both front ends are added here in their place and parsed by config/tls.py."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from service.config.groups.grpc_transport import add_transport_flag, check_grpc_transport, default_transport
from service.config.tls import TlsSettings, add_tls_flags, bool_flag, tls_settings

API_GROUP_NAMES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)


@dataclass(slots=True, frozen=True)
class RestrictedApi:
    """Triton's restricted-API rule: requests to `groups` must carry header `key` (gRPC: with the
    'triton-grpc-protocol-' prefix) set to `value`."""

    groups: frozenset[str]
    key: str
    value: str


def parse_restricted(text: str) -> RestrictedApi:
    """`<group>[,<group>...]:<key>=<value>` as Triton's --grpc-restricted-protocol / --http-restricted-api."""
    groups_text, sep, kv = text.partition(":")
    key, eq, value = kv.partition("=")
    if not sep or not eq or not key.strip() or not groups_text.strip():
        raise argparse.ArgumentTypeError(f"expected <groups>:<key>=<value>, got '{text}'")
    groups = frozenset(g.strip() for g in groups_text.split(",") if g.strip())
    unknown = sorted(groups - set(API_GROUP_NAMES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown API group(s) {', '.join(unknown)} in '{text}'; allowed: {', '.join(API_GROUP_NAMES)}"
        )
    return RestrictedApi(groups, key.strip().lower(), value)


def check_restricted(rules: list[RestrictedApi], flag: str) -> None:
    """Exit when an API group is restricted by two rules (Triton refuses that too)."""
    seen: set[str] = set()
    for rule in rules:
        twice = seen & rule.groups
        if twice:
            raise SystemExit(f"{flag}: API group(s) {', '.join(sorted(twice))} restricted more than once")
        seen |= rule.groups


# Triton's gRPC keepalive / connection flags and the grpc core channel argument each one sets (milliseconds)
GRPC_CHANNEL_FLAGS = {
    "grpc_keepalive_time": "grpc.keepalive_time_ms",
    "grpc_keepalive_timeout": "grpc.keepalive_timeout_ms",
    "grpc_keepalive_permit_without_calls": "grpc.keepalive_permit_without_calls",
    "grpc_http2_max_pings_without_data": "grpc.http2.max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data": "grpc.http2.min_ping_interval_without_data_ms",
    "grpc_http2_max_ping_strikes": "grpc.http2.max_ping_strikes",
    "grpc_max_connection_age": "grpc.max_connection_age_ms",
    "grpc_max_connection_age_grace": "grpc.max_connection_age_grace_ms",
}


@dataclass(slots=True)
class GrpcSettings:
    """How the gRPC front end listens: TLS, restricted API groups, connection options, stream buffering."""

    restricted: list[RestrictedApi] = field(default_factory=list)
    tls: TlsSettings = field(default_factory=TlsSettings)
    channel_args: dict[str, int] = field(default_factory=dict)  # grpc core arguments from the keepalive flags
    stream_buffer_bytes: int = 64 << 20  # responses one ModelStreamInfer call may hold unwritten
    header_forward_pattern: str = ""  # --grpc-header-forward-pattern (config/groups/grpc_flags.py)
    infer_compression_level: str = "none"  # --grpc-infer-response-compression-level
    reuse_port: bool = False  # --reuse-grpc-port
    # --grpc-transport: h2, grpcio or native (frontend/grpc/transport.py); the Python API's KServeGrpc too
    transport: str = field(default_factory=default_transport)


# help of the keepalive / connection flags (Triton's meaning; unset ones keep grpc's defaults, which are Triton's)
_CHANNEL_HELP = {
    "grpc_keepalive_time": "period of the keepalive pings on a connection, in ms (7200000)",
    "grpc_keepalive_timeout": "how long a keepalive ping may go unanswered before the connection closes, in ms (20000)",
    "grpc_keepalive_permit_without_calls": "allow keepalive pings on a connection with no call in flight (false)",
    "grpc_http2_max_pings_without_data": "pings sent with no data/header frame in between; 0: no limit (2)",
    "grpc_http2_min_recv_ping_interval_without_data": "shortest interval between client pings without data, in "
    "ms; shorter ones are strikes (300000)",
    "grpc_http2_max_ping_strikes": "bad pings tolerated before GOAWAY; 0: any number (2)",
    "grpc_max_connection_age": "maximum age of a connection, in ms; the client then reconnects (unbounded)",
    "grpc_max_connection_age_grace": "time calls may still finish after the maximum age, in ms (unbounded)",
}


def add_security_flags(p: argparse.ArgumentParser) -> None:
    """TLS, restricted API groups, keepalive and admission flags (see docs/security.md)."""
    rule = "GROUPS:KEY=VALUE"
    p.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        type=parse_restricted,
        metavar=rule,
        help="gRPC requests to these API groups (comma-separated: " + ", ".join(API_GROUP_NAMES) + ") need "
        "header triton-grpc-protocol-KEY=VALUE, others get UNAVAILABLE; repeatable with other groups",
    )
    p.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        type=parse_restricted,
        metavar=rule,
        help="HTTP requests to these API groups need header KEY=VALUE, others get 403",
    )
    add_tls_flags(p, "grpc")
    for flag, meaning in _CHANNEL_HELP.items():
        kind = bool_flag if flag == "grpc_keepalive_permit_without_calls" else int
        metavar = "BOOL" if kind is bool_flag else "MS" if "ping" not in flag or "interval" in flag else "N"
        p.add_argument("--" + flag.replace("_", "-"), type=kind, default=None, metavar=metavar, help=meaning)
    add_tls_flags(p, "http")
    p.add_argument(
        "--grpc-stream-buffer-bytes",
        type=int,
        default=64 << 20,
        metavar="BYTES",
        help="Trireme only: responses a ModelStreamInfer call may hold unwritten before the server stops reading "
        "its requests (64 MiB)",
    )
    add_transport_flag(p)
    p.add_argument(
        "--max-inflight-requests",
        type=int,
        default=0,
        metavar="N",
        help="Trireme only: inference requests in flight in the whole server; more are refused with "
        "UNAVAILABLE (0: no bound)",
    )
    p.add_argument(
        "--max-inflight-requests-per-model",
        type=int,
        default=0,
        metavar="N",
        help="Trireme only: the same bound for each model version (0: no bound)",
    )


def grpc_settings(args: argparse.Namespace) -> GrpcSettings:
    """GrpcSettings from the parsed flags."""
    tls = tls_settings(args, "grpc")
    return GrpcSettings(
        restricted=list(args.grpc_restricted_protocol),
        tls=tls,
        channel_args={
            arg: int(getattr(args, flag)) for flag, arg in GRPC_CHANNEL_FLAGS.items() if getattr(args, flag) is not None
        },
        stream_buffer_bytes=max(0, args.grpc_stream_buffer_bytes),
        transport=check_grpc_transport(args, tls.use_ssl),
    )
