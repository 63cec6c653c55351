"""gRPC over TLS and mutual TLS with Triton's flags (tritonclient's secure channel), HTTPS with our --http-use-ssl*
flags (tritonclient.http with ssl=True); certificates are made by the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.certs import CertFiles, make_certs


def _infer(client: grpcclient.InferenceServerClient) -> np.ndarray:
    x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    x.set_data_from_numpy(data)
    out = client.infer("identity_fp32", [x], client_timeout=10).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, data)
    return out


def _refused(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.is_server_live(client_timeout=5)
    assert info.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    client.close()


def _tls_args(certs: CertFiles, mutual: bool) -> list[str]:
    args = [
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={certs.server_cert}",
        f"--grpc-server-key={certs.server_key}",
        f"--grpc-root-cert={certs.ca}",
    ]
    return [*args, "--grpc-use-ssl-mutual=true"] if mutual else args


def test_tls(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    certs = make_certs(tmp_path / "certs")
    other = make_certs(tmp_path / "other", "other-")
    server = start_server(args=_tls_args(certs, mutual=False))
    client = grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(certs.ca))
    assert client.is_server_ready()
    _infer(client)
    client.close()
    _refused(grpcclient.InferenceServerClient(server.url))  # plaintext client
    _refused(grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(other.ca)))  # untrusted


def test_mutual_tls(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    certs = make_certs(tmp_path / "certs")
    other = make_certs(tmp_path / "other", "other-")
    server = start_server(args=_tls_args(certs, mutual=True))
    client = grpcclient.InferenceServerClient(
        server.url,
        ssl=True,
        root_certificates=str(certs.ca),
        private_key=str(certs.client_key),
        certificate_chain=str(certs.client_cert),
    )
    _infer(client)
    client.close()
    # no client certificate, or one signed by another CA: the handshake fails
    _refused(grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(certs.ca)))
    _refused(
        grpcclient.InferenceServerClient(
            server.url,
            ssl=True,
            root_certificates=str(certs.ca),
            private_key=str(other.client_key),
            certificate_chain=str(other.client_cert),
        )
    )
    _refused(grpcclient.InferenceServerClient(server.url))


def test_tls_without_a_key_refuses_to_start(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    certs = make_certs(tmp_path / "certs")
    server = start_server(args=["--grpc-use-ssl=true", f"--grpc-server-cert={certs.server_cert}"], wait=False)
    assert server.proc.wait(60) != 0
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in server.log()


def _https_args(certs: CertFiles, mutual: bool) -> list[str]:
    args = ["--http-use-ssl=true", f"--http-server-cert={certs.server_cert}", f"--http-server-key={certs.server_key}"]
    return [*args, "--http-use-ssl-mutual=true", f"--http-root-cert={certs.ca}"] if mutual else args


def _https_infer(client: httpclient.InferenceServerClient) -> None:
    x = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    x.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_fp32", [x]).as_numpy("OUTPUT0"), data)


def test_https(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    certs = make_certs(tmp_path / "certs")
    server = start_server(args=_https_args(certs, mutual=False))
    client = httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options={"ca_certs": str(certs.ca)})
    assert client.is_server_ready()
    _https_infer(client)
    client.close()
    with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP on the HTTPS port
        requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10)
    with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the CA
        requests.get(f"https://{server.http_url}/v2/health/ready", timeout=10)
    assert requests.get(f"https://{server.http_url}/v2/health/ready", verify=str(certs.ca), timeout=10).ok


def test_https_mutual(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    certs = make_certs(tmp_path / "certs")
    other = make_certs(tmp_path / "other", "other-")
    server = start_server(args=_https_args(certs, mutual=True))
    client = httpclient.InferenceServerClient(
        server.http_url,
        ssl=True,
        ssl_options={"ca_certs": str(certs.ca), "certfile": str(certs.client_cert), "keyfile": str(certs.client_key)},
    )
    _https_infer(client)
    client.close()
    url = f"https://{server.http_url}/v2/health/ready"
    for cert in (None, (str(other.client_cert), str(other.client_key))):  # no certificate, or an untrusted one
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, verify=str(certs.ca), cert=cert, timeout=10)
    assert requests.get(url, verify=str(certs.ca), cert=(str(certs.client_cert), str(certs.client_key)), timeout=10).ok
