"""Test certificates made on the fly with `cryptography`: a CA, a server certificate for 127.0.0.1/localhost and a
client certificate, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    """PEM files of one CA and the server and client certificates it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _issue(
    subject: str,
    issuer_name: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier | None,
    ca: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_certs(directory: Path, prefix: str = "") -> CertFiles:
    """A fresh CA with a server and a client certificate, as PEM files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{prefix}trireme test CA")
    ca_cert = _issue(f"{prefix}trireme test CA", ca_name, ca_key, ca_key, None, ca=True)
    files = CertFiles(*(directory / f"{prefix}{n}.pem" for n in ("ca", "server", "server-key", "client", "client-key")))
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for cert_path, key_path, usage in (
        (files.server_cert, files.server_key, ExtendedKeyUsageOID.SERVER_AUTH),
        (files.client_cert, files.client_key, ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"{prefix}{cert_path.stem}", ca_name, ca_key, key, usage)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
    return files
