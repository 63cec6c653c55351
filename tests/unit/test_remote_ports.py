"""The ports front-end processes share (service/remote/ports.py): on h2 one listening socket per address the gRPC
host resolves to, all on one port; on grpcio only a SO_REUSEPORT reservation; a taken port fails with the message of
one process; the front end rebuilds the inherited sockets from their descriptor numbers."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from service.remote.frontend_main import Ports
from service.remote.ports import grpc_port, http_port


def test_h2_listens_on_every_resolved_address(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def two_loopbacks(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "twohomed":
            return real(host, port, *args, **kwargs)
        stream = (socket.AF_INET, socket.SOCK_STREAM, 6, "")
        return [(*stream, ("127.0.0.1", port)), (*stream, ("127.0.0.2", port))]  # Linux: all of 127/8 is loopback

    monkeypatch.setattr(socket, "getaddrinfo", two_loopbacks)
    shared = grpc_port("twohomed", 0, False, "h2")
    try:
        assert shared.port > 0 and shared.held == shared.listening
        assert sorted(s.getsockname() for s in shared.listening) == [
            ("127.0.0.1", shared.port),
            ("127.0.0.2", shared.port),
        ]
        for host in ("127.0.0.1", "127.0.0.2"):  # listening already: the kernel completes the handshake
            socket.create_connection((host, shared.port), timeout=10).close()
    finally:
        shared.close()


def test_grpcio_only_reserves_the_port() -> None:
    shared = grpc_port("127.0.0.1", 0, False, "grpcio")
    try:
        assert shared.listening == [] and len(shared.held) == 1
        assert shared.held[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        with pytest.raises(ConnectionRefusedError):  # bound, not listening: each front end listens itself
            socket.create_connection(("127.0.0.1", shared.port), timeout=10)
    finally:
        shared.close()


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
def test_taken_port(transport: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"unable to bind the gRPC server to 127.0.0.1:{port} \(address already"):
            grpc_port("127.0.0.1", port, False, transport)
        with pytest.raises(OSError, match="in use"):
            http_port("127.0.0.1", port, False)


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
def test_time_wait_connections_do_not_take_the_port(transport: str) -> None:
    """A server restarted on its port right after serving: its side of the connections it closed is in TIME_WAIT."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        for _ in clients:
            listener.accept()[0].close()  # the server closes first: its end goes to TIME_WAIT
        for c in clients:
            assert c.recv(1) == b""
            c.close()
    shared = grpc_port("127.0.0.1", port, False, transport)
    assert shared.port == port
    shared.close()
    shared = http_port("127.0.0.1", port, False)
    assert shared.port == port
    shared.close()


def test_frontend_rebuilds_inherited_sockets() -> None:
    grpc, http = grpc_port("127.0.0.1", 0, False, "h2"), http_port("127.0.0.1", 0, False)
    try:
        fds = [os.dup(s.fileno()) for s in grpc.listening + http.listening]  # as the front end inherits them
        ports = Ports.parse(str(grpc.port), str(http.port), str(fds[0]), str(fds[1]))
        assert [s.fileno() for s in ports.grpc_sockets + ports.http_sockets] == fds
        assert ports.grpc_sockets[0].getsockname() == ("127.0.0.1", grpc.port)
        assert ports.http_sockets[0].getsockname() == ("127.0.0.1", http.port)
        for s in ports.grpc_sockets + ports.http_sockets:
            s.close()
        assert Ports.parse("1", "2", "-", "-") == Ports(1, 2)  # nothing inherited: each binds the port itself
    finally:
        grpc.close()
        http.close()
