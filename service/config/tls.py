"""TLS of the front ends: one settings type for gRPC (Triton's --grpc-use-ssl* flags) and HTTP (Trireme's
--http-use-ssl* flags, Triton serves plain HTTP only), parsed once from the flags, checked once."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass

PROTOCOL_NAMES = {"grpc": "gRPC", "http": "HTTP"}


def bool_flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got '{text}'")


@dataclass(slots=True, frozen=True)
class TlsSettings:
    """TLS of one front end; `protocol` ("grpc" or "http") is the prefix of its flags."""

    protocol: str = "grpc"
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""

    def files(self) -> tuple[str, str, str]:
        """(certificate, key, root certificate or ''); OSError names the flag that is missing."""
        p = self.protocol
        if not self.server_cert or not self.server_key:
            raise OSError(f"--{p}-use-ssl needs --{p}-server-cert and --{p}-server-key")
        if self.use_ssl_mutual and not self.root_cert:
            raise OSError(f"--{p}-use-ssl-mutual needs --{p}-root-cert (the CA that signs client certificates)")
        return self.server_cert, self.server_key, self.root_cert


def add_tls_flags(p: argparse.ArgumentParser, protocol: str) -> None:
    """--PROTOCOL-use-ssl, -use-ssl-mutual, -server-cert, -server-key, -root-cert."""
    name = PROTOCOL_NAMES[protocol]
    pre = "" if protocol == "grpc" else "Trireme only: "  # Triton has the gRPC flags only
    flag = f"--{protocol}"
    switches = (
        ("use-ssl", f"serve {name} over TLS with {flag}-server-cert and {flag}-server-key"),
        (
            "use-ssl-mutual",
            f"serve {name} over mutual TLS: clients need a certificate signed by {flag}-root-cert (false)",
        ),
    )
    for suffix, what in switches:
        p.add_argument(f"{flag}-{suffix}", type=bool_flag, default=False, metavar="BOOL", help=pre + what + " (false)")
    files = (
        ("server-cert", f"PEM certificate of the {name} endpoint"),
        ("server-key", f"PEM private key of the {name} endpoint"),
        ("root-cert", "PEM CA certificate that client certificates chain to"),
    )
    for suffix, what in files:
        p.add_argument(f"{flag}-{suffix}", default="", metavar="FILE", help=pre + what)


def tls_settings(args: argparse.Namespace, protocol: str) -> TlsSettings:
    """TlsSettings of one front end from the parsed flags (mutual TLS implies TLS)."""
    mutual = bool(getattr(args, f"{protocol}_use_ssl_mutual"))
    return TlsSettings(
        protocol=protocol,
        use_ssl=bool(getattr(args, f"{protocol}_use_ssl")) or mutual,
        use_ssl_mutual=mutual,
        server_cert=getattr(args, f"{protocol}_server_cert"),
        server_key=getattr(args, f"{protocol}_server_key"),
        root_cert=getattr(args, f"{protocol}_root_cert"),
    )


def ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """The server-side TLS context for HTTPS (None: plain HTTP); OSError names the flag that is missing."""
    if not tls.use_ssl:
        return None
    cert, key, root = tls.files()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
        if root:
            context.load_verify_locations(root)
    except (OSError, ssl.SSLError) as e:
        raise OSError(f"unable to load the HTTPS certificate or key: {e}") from None
    context.verify_mode = ssl.CERT_REQUIRED if tls.use_ssl_mutual else ssl.CERT_NONE
    return context
