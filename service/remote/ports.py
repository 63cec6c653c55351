"""The gRPC and HTTP ports a server's front-end processes share, made by the core process before it starts them.

Where the front end can serve a socket bound by another process (HTTP, and gRPC on the h2 transport), the core
binds and listens on one socket per address and every front end inherits it (pass_fds) and accepts from it, the
pre-fork model: one accept queue, so a connection still waiting to be accepted when a front end dies is accepted by
another one, and a stopped or hung front end takes no new connections (it does not call accept).

grpcio and native bind in their C and Rust cores from an address and cannot serve a socket made elsewhere: for
them the core only reserves the port (a bound, not listening SO_REUSEPORT socket) and each front end listens on it
with SO_REUSEPORT. Each then has its own accept queue and the kernel hashes every new connection onto one of them:
connections queued on a front end that dies are reset, and one that is hung keeps receiving its share (Linux's
machine-wide net.ipv4.tcp_migrate_req would move them; Trireme does not rely on it)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from service.frontend.grpc.h2.server import BACKLOG, bind_sockets
from service.frontend.grpc.transport import adopts_sockets
from service.frontend.http.server import listening_socket


@dataclass
class SharedPort:
    """A port the front ends share: `listening`, the sockets they inherit and accept from (empty: each binds the
    port itself with SO_REUSEPORT); `held`, what the core keeps open while the server runs."""

    port: int
    listening: list[socket.socket] = field(default_factory=list)
    held: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.held:
            sock.close()


def reserve_port(address: str, port: int, shared: bool = False) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket: fixes the port (port 0 picks one) for the front ends that share
    it and fails early, as a single process would, when the address is taken. Kept open while the server runs.
    Unless `shared` (--reuse-grpc-port / --reuse-http-port), a port another server holds, even with
    SO_REUSEPORT, is taken: a plain bind tries it first."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    if port and not shared:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # as a listener binds (grpc and asyncio set SO_REUSEADDR): connections of a server that just exited,
            # left in TIME_WAIT, do not count; a server still bound to the port does
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT connections on the port do not count
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def http_port(address: str, port: int, shared: bool) -> SharedPort:
    """One listening socket, bound as the HTTP front end of one process binds it; OSError when the address is
    taken. `shared` (--reuse-http-port): other servers may listen on it too."""
    sock = listening_socket(address, port, shared)
    return SharedPort(int(sock.getsockname()[1]), [sock], [sock])


def grpc_port(address: str, port: int, shared: bool, transport: str) -> SharedPort:
    """h2: one listening socket per address the host resolves to, bound as one process's h2 server binds them
    (h2/server.py bind_sockets); grpcio and native: the SO_REUSEPORT reservation. OSError when nothing could be
    bound, with the message of one process (frontend/grpc/server.py build_grpc_server). `shared`: --reuse-grpc-port."""
    address_port = f"{address}:{port}"
    failed = OSError(f"unable to bind the gRPC server to {address_port} (address already in use?)")
    if not adopts_sockets(transport):
        try:
            sock = reserve_port(address, port, shared)
        except OSError:
            raise failed from None
        return SharedPort(int(sock.getsockname()[1]), [], [sock])
    try:
        sockets = bind_sockets(address_port, shared)
    except RuntimeError:  # does not resolve
        raise failed from None
    bound = SharedPort(int(sockets[0].getsockname()[1]) if sockets else 0, sockets, list(sockets))
    try:
        if not sockets:
            raise failed
        for sock in sockets:
            sock.listen(BACKLOG)
    except OSError:
        bound.close()
        raise failed from None
    return bound
