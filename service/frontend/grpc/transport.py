"""The gRPC transport under the servicers (--grpc-transport, docs/grpc.md): grpcio's grpc.aio server,
pygrpc-native's grpcio-compatible aio server, whose HTTP/2 and gRPC framing run in Rust outside the GIL, or
Trireme's own HTTP/2 server (h2/, a grpc.aio.Server look-alike with a ServicerContext of its own).

The servicers, handlers and their checks are the same on all three; what differs is how handlers are registered
and what the transport can do. pygrpc-native serves unary methods natively and hands the bidirectional
ModelStreamInfer to a grpc.aio server of its own behind a Unix socket (same handlers, no speed gain); it has no
TLS, cannot close connections by age and accepts but does not enforce the limits on client pings, so those flags
are refused when the server starts (config/access.py check_grpc_transport) rather than silently dropped.
h2 serves every flag grpcio does (TLS through Python's ssl)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import grpc

GRPCIO = "grpcio"
NATIVE = "native"
H2 = "h2"


def make_server(transport: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Server:
    """An aio server of the transport, with grpc core channel options (both read the same names)."""
    if transport == NATIVE:
        # optional dependency, checked at start (config/groups/grpc_transport.py); `import pygrpc_native.aio`, not
        # `from pygrpc_native import aio`: 0.5.0's lazy module __getattr__ recurses on the latter
        import pygrpc_native.aio

        return pygrpc_native.aio.server(options=list(options))
    if transport == H2:  # Trireme's own HTTP/2 server (h2/), a grpc.aio.Server look-alike
        from service.frontend.grpc.h2.server import H2Server

        return H2Server(options)  # type: ignore[return-value]
    return grpc.aio.server(options=list(options))


def add_service(server: grpc.aio.Server, transport: str, service: str, handlers: dict[str, Any]) -> None:
    """Register a service's method handlers the way the transport serves fastest.

    grpcio: for lookup by method name (a generic handler), not as "registered methods". The generated
    add_*_to_server functions also call server.add_registered_method_handlers; grpc.aio then keeps one pending
    request-call task per registered method and its server loop waits on all of them (asyncio.wait over ~20
    tasks, twice per call): measured with callgrind, 115k instructions per ModelInfer, a fifth of the server's
    cost (docs/benchmarks.md). Clients see the same methods either way.

    native: as registered methods. pygrpc-native serves only registered unary methods in Rust; a generic
    handler would send every call through its grpc.aio fallback server behind the Rust front (no gain).

    h2: either way; registered methods are one dict lookup by :path."""
    if transport in (NATIVE, H2):  # h2: looked up by path in one dict
        server.add_registered_method_handlers(service, handlers)
    else:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


def adopts_sockets(transport: str) -> bool:
    """Whether the transport can serve a listening socket bound by another process (the one socket that all
    front-end processes accept from, service/remote/supervisor.py): h2 only. grpcio and native bind inside their
    native cores from an address; front ends on them share the port with SO_REUSEPORT."""
    return transport == H2


def adopt_sockets(server: grpc.aio.Server, transport: str, sockets: Sequence[socket.socket], credentials: Any) -> int:
    """`server` (of an adopts_sockets transport) serves `sockets`; returns their port."""
    if not adopts_sockets(transport):
        raise ValueError(f"the {transport} gRPC transport cannot serve a socket it did not bind")
    from service.frontend.grpc.h2.server import H2Server

    assert isinstance(server, H2Server)
    return server.adopt_sockets(sockets, credentials)
