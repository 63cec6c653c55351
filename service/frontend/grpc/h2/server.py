"""H2Server: the h2 transport's stand-in for grpc.aio.Server (what frontend/grpc/server.py and the front-end
processes call of it: handler registration, ports, start, stop, wait_for_termination), serving the servicers'
grpc.RpcMethodHandlers on H2Connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Sequence
from typing import Any

import grpc

from service.frontend.grpc.h2.connection import H2Connection

_GRPC_DEFAULT_MAX_RECEIVE = 4 << 20  # grpc core's defaults when the option is not given
_UNLIMITED = 2**31 - 1


class _Details:
    """grpc.HandlerCallDetails for a generic handler's lookup."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def _limit(value: Any, default: int) -> int:
    value = default if value is None else int(value)
    return _UNLIMITED if value < 0 else value


def ssl_context(key: bytes, cert: bytes, root: bytes | None, mutual: bool) -> ssl.SSLContext:
    """Server TLS over Python's ssl, ALPN h2 (grpc clients require it); mutual: client certificates signed by
    `root` required, as grpc.ssl_server_credentials(require_client_auth=True)."""
    import os
    import tempfile

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory() as tmp:  # ssl loads a certificate chain from files only
        cert_path, key_path = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        with open(cert_path, "wb") as fc:
            fc.write(cert)
        with open(key_path, "wb") as fk:
            fk.write(key)
        ctx.load_cert_chain(cert_path, key_path)
    if root:
        ctx.load_verify_locations(cadata=root.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_NONE
    return ctx


BACKLOG = 1024  # pending connections a listening socket holds (as the HTTP front end's)


def bind_sockets(address: str, reuse_port: bool) -> list[socket.socket]:
    """Bound (not yet listening) sockets for every address the host resolves to, as grpc core listens
    ("localhost": 127.0.0.1 and ::1); with port 0 the first socket's port is taken for the others. Empty when no
    address could be bound; RuntimeError when the address does not resolve."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"cannot resolve {address}: {e}") from None
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    for family, kind, proto, _, sockaddr in infos:
        if (family, sockaddr) in seen:
            continue
        seen.add((family, sockaddr))
        if sockets:
            sockaddr = (sockaddr[0], sockets[0].getsockname()[1], *sockaddr[2:])
        sock = _bound_socket(family, kind, proto, sockaddr, reuse_port)
        if sock is not None:
            sockets.append(sock)
    return sockets


def _bound_socket(family: int, kind: int, proto: int, sockaddr: Any, reuse_port: bool) -> socket.socket | None:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        return None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class H2Server:
    def __init__(self, options: Sequence[tuple[str, Any]]) -> None:
        self.options = dict(options)
        self.max_receive = _limit(self.options.get("grpc.max_receive_message_length"), _GRPC_DEFAULT_MAX_RECEIVE)
        self.max_send = _limit(self.options.get("grpc.max_send_message_length"), _UNLIMITED)
        # grpc core's GRPC_ARG_MAX_CONCURRENT_STREAMS: announced in SETTINGS and enforced when given; without it
        # nothing is announced and no stream refused, as grpc core (and so Triton, which does not set it) does
        streams = self.options.get("grpc.max_concurrent_streams")
        self.max_streams = -1 if streams is None or int(streams) < 0 else int(streams)
        self.compression_level = int(self.options.get("grpc.default_compression_level", 0))
        self.connections: set[H2Connection] = set()
        self._generic: list[Any] = []
        self._methods: dict[str, grpc.RpcMethodHandler | None] = {}
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._stopped: asyncio.Event | None = None

    # ---- registration ----------------------------------------------------------------------------------------
    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[Any]) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict[str, Any]) -> None:
        for name, handler in method_handlers.items():
            self._methods[f"/{service_name}/{name}"] = handler

    def handler(self, path: str) -> grpc.RpcMethodHandler | None:
        """The method handler of a :path (None: UNIMPLEMENTED), looked up once per path."""
        try:
            return self._methods[path]
        except KeyError:
            pass
        found = None
        for generic in self._generic:
            found = generic.service(_Details(path))
            if found is not None:
                break
        if len(self._methods) < 4096:  # unknown paths are remembered too, up to a bound
            self._methods[path] = found
        return found

    def response_encoding(self, accepted: tuple[str, ...]) -> str:
        """--grpc-infer-response-compression-level: the algorithm for responses when the client accepts it."""
        if not self.compression_level:
            return ""
        # grpc core's choice among what the client accepts: gzip for low, deflate for medium and high
        order = ("gzip", "deflate") if self.compression_level == 1 else ("deflate", "gzip")
        for name in order:
            if name in accepted:
                return name
        return ""

    # ---- ports -----------------------------------------------------------------------------------------------
    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, server_credentials: Any) -> int:
        if not isinstance(server_credentials, ssl.SSLContext):
            raise TypeError("the h2 transport takes an ssl.SSLContext (h2/server.py ssl_context)")
        return self._bind(address, server_credentials)

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        """Listen on every address the host resolves to (bind_sockets). The port, or 0 when none could be bound."""
        return self.adopt_sockets(bind_sockets(address, bool(self.options.get("grpc.so_reuseport", 0))), context)

    def adopt_sockets(self, sockets: Sequence[socket.socket], context: ssl.SSLContext | None) -> int:
        """Serve on sockets bound elsewhere (listening or not): a front-end process's, inherited from the core,
        which every front end accepts from (service/remote/supervisor.py). The port, or 0 when there are none."""
        self._sockets.extend((sock, context) for sock in sockets)
        return int(sockets[0].getsockname()[1]) if sockets else 0

    # ---- life --------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        for sock, context in self._sockets:
            server = await loop.create_server(lambda: H2Connection(self), sock=sock, ssl=context, backlog=BACKLOG)
            self._servers.append(server)

    async def stop(self, grace: float | None) -> None:
        """Stop listening, GOAWAY every connection, let calls in flight finish for `grace` seconds, then close."""
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.shutdown()
        if self.connections and grace:
            self._stopped = self._stopped or asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), grace)
        for conn in list(self.connections):
            conn.abort_connection()
        await asyncio.sleep(0)  # connection_lost runs: handlers' tasks are cancelled
        if self._stopped is not None:
            self._stopped.set()

    def connection_closed(self) -> None:
        if not self.connections and self._stopped is not None and not self._servers_serving():
            self._stopped.set()

    def _servers_serving(self) -> bool:
        return any(s.is_serving() for s in self._servers)

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._stopped is None:
            return True
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout)
        except TimeoutError:
            return False
        return True
