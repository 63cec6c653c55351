"""The h2 transport listens on every address its host resolves to, as grpc core does: a name with two addresses
gets two listening sockets on one port (port 0: the first socket's ephemeral port for both)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from service.frontend.grpc.h2.server import H2Server


def test_every_resolved_address_on_one_port(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def two_loopbacks(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "twohomed":
            return real(host, port, *args, **kwargs)
        stream = (socket.AF_INET, socket.SOCK_STREAM, 6, "")
        # Linux routes all of 127/8 to the loopback device; the duplicate is what getaddrinfo may also return
        return [(*stream, ("127.0.0.1", port)), (*stream, ("127.0.0.2", port)), (*stream, ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", two_loopbacks)
    server = H2Server(())
    port = server.add_insecure_port("twohomed:0")
    try:
        assert port > 0
        bound = sorted(sock.getsockname() for sock, _ in server._sockets)
        assert bound == [("127.0.0.1", port), ("127.0.0.2", port)]
    finally:
        for sock, _ in server._sockets:
            sock.close()


def test_unbindable_address_gives_port_zero() -> None:
    server = H2Server(())
    assert server.add_insecure_port("192.0.2.1:0") == 0  # TEST-NET-1: not an address of this machine
    assert server._sockets == []
