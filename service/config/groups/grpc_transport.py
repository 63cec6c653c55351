"""--grpc-transport (Trireme only): which gRPC server implementation serves the gRPC port, and the flags the
native one cannot honour, refused when the server starts (docs/grpc.md)."""

from __future__ import annotations

import argparse
import importlib.util
import os

TRANSPORTS = ("grpcio", "native", "h2")
ENV = "TRIREME_GRPC_TRANSPORT"
# Trireme's own HTTP/2 server: the whole suite passes on it, at 0.65x grpcio's instructions per request
# (docs/grpc.md, "Why h2"); grpcio stays one flag away
DEFAULT = "h2"

# flags (argparse dest) pygrpc-native cannot honour: it cannot close connections by age, and it accepts the
# limits on client pings without enforcing them; TLS is checked from the TLS settings
NATIVE_REFUSED = (
    "grpc_max_connection_age",
    "grpc_max_connection_age_grace",
    "grpc_http2_max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data",
    "grpc_http2_max_ping_strikes",
)


def default_transport() -> str:
    """--grpc-transport when not given: $TRIREME_GRPC_TRANSPORT (the test suite runs either way), else h2."""
    env = os.environ.get(ENV, "").strip()
    return env if env in TRANSPORTS else DEFAULT


def add_transport_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grpc-transport",
        choices=TRANSPORTS,
        default=None,
        help="Trireme only: h2 (the default: Trireme's own HTTP/2 gRPC server, pure Python on the hpack package: "
        "every gRPC flag, unary and streaming calls in-process) or grpcio (grpc.aio, grpc C-core) or native "
        "(pygrpc-native, HTTP/2 in Rust: unary inference; no TLS, connection age or ping limits, which it refuses; "
        "ModelStreamInfer through its grpc.aio fallback) (default: $TRIREME_GRPC_TRANSPORT, else h2)",
    )


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_grpc_transport(args: argparse.Namespace, use_ssl: bool) -> str:
    """The transport the flags pick; SystemExit naming the flags when the native one cannot serve them."""
    transport: str = args.grpc_transport or default_transport()
    if transport == "h2":
        if importlib.util.find_spec("hpack") is None:
            raise SystemExit(
                "Error: --grpc-transport=h2 needs the hpack package (a dependency of trireme: pip install hpack); "
                "use --grpc-transport=grpcio"
            )
        return transport
    if transport != "native":
        return transport
    chosen = "--grpc-transport=native" + ("" if args.grpc_transport else f" (from ${ENV})")
    if importlib.util.find_spec("pygrpc_native") is None:
        raise SystemExit(
            f"Error: {chosen} needs the pygrpc-native package (pip install 'trireme[grpc-native]'); "
            "use --grpc-transport=grpcio"
        )
    refused = [flag_name(dest) for dest in NATIVE_REFUSED if getattr(args, dest, None) is not None]
    # neither response compression nor SO_REUSEPORT is offered by pygrpc-native's server
    level = str(getattr(args, "grpc_infer_response_compression_level", "none") or "none")
    if level.lower() != "none":
        refused.append("--grpc-infer-response-compression-level")
    if getattr(args, "reuse_grpc_port", False):
        refused.append("--reuse-grpc-port")
    if use_ssl:
        refused.insert(0, "--grpc-use-ssl" if args.grpc_use_ssl else "--grpc-use-ssl-mutual")
    if refused:
        raise SystemExit(
            f"Error: {chosen} cannot serve {', '.join(refused)} (the native transport has no TLS, no response "
            "compression and no port reuse, cannot close connections by age and does not enforce client ping "
            "limits); use --grpc-transport=grpcio"
        )
    return transport
