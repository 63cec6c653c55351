"""A connection's peer as grpc names it ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000") and, over mutual TLS, the
client certificate's common names (the ServicerContext's peer_identities)."""

from __future__ import annotations

from typing import Any


def peer_name(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or len(peer) < 2:
        return ""
    host = str(peer[0])
    return f"ipv6:[{host}]:{peer[1]}" if ":" in host else f"ipv4:{host}:{peer[1]}"


def peer_identities(transport: Any) -> list[bytes] | None:
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    names = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
    return [n.encode() for n in names] or None
