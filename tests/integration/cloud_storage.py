"""Real storage servers for the cloud-repository tests: moto's S3 server, a GCS emulator, Azurite.

Each is started on a free port by the test that needs it (a fixture in test_cloud_repositories.py) and killed
after; `Bucket` uploads a local folder with the provider's own client. `CountingProxy` sits between Trireme and
the S3 server and counts the requests it forwards (listings vs object downloads).
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import free_port

BIN = Path(sys.executable).parent
# Azurite's well-known development account (documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on {port} within {timeout_s} s")


@contextmanager
def _process(args: list[str], port: int, what: str, env: dict[str, str] | None = None) -> Iterator[None]:
    proc = subprocess.Popen(
        args, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port, proc, what)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _need(module: str, reason: str) -> None:
    try:
        with warnings.catch_warnings():  # google.api_core warns (ImportWarning) without grpcio-status
            warnings.simplefilter("ignore")
            __import__(module)
    except ImportError:
        pytest.skip(f"{reason} ({module} is not installed: tools/test.sh installs it)")


# ---- S3 (moto's server mode) ------------------------------------------------------------------------------------
class S3:
    """A moto S3 server; `client()` is a boto3 client of it (with auth on, of the IAM user made at start)."""

    def __init__(self, port: int, key_id: str, secret: str, ca: Path | None = None) -> None:
        self.port = port
        self.endpoint = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
        self.key_id, self.secret = key_id, secret
        self.ca = ca

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            verify=str(self.ca) if self.ca else None,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )

    def upload(self, bucket: str, prefix: str, folder: Path) -> None:
        c = self.client()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                c.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}".lstrip("/"))


@contextmanager
def s3_server(auth: bool = False, tls: Any = None) -> Iterator[S3]:
    """moto_server on a free port. auth=True: requests must be signed with the IAM key made here (moto enforces
    IAM after INITIAL_NO_AUTH_ACTION_COUNT unauthenticated calls: the three that make the user). tls: a
    tests.certs.CertFiles: HTTPS with its server certificate."""
    _need("moto", "moto[server] runs the S3 server")
    _need("boto3", "boto3 is the S3 client (trireme[s3])")
    exe = BIN / "moto_server"
    if not exe.exists():
        pytest.skip("moto_server is not installed (pip install 'moto[server]'; tools/test.sh installs it)")
    port = free_port()
    env = {"INITIAL_NO_AUTH_ACTION_COUNT": "3"} if auth else {}
    args = [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    if tls is not None:
        args += ["-s", "-c", str(tls.server_cert), "-k", str(tls.server_key)]
    with _process(args, port, "moto_server", env):
        key_id, secret = "testing", "testing"
        if auth:
            import boto3

            iam = boto3.client(
                "iam", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1", aws_access_key_id="x",
                aws_secret_access_key="y",
            )  # fmt: skip
            iam.create_user(UserName="trireme")
            key = iam.create_access_key(UserName="trireme")["AccessKey"]
            policy = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'
            iam.put_user_policy(UserName="trireme", PolicyName="all", PolicyDocument=policy)
            key_id, secret = key["AccessKeyId"], key["SecretAccessKey"]
        yield S3(port, key_id, secret, tls.ca if tls is not None else None)


class CountingProxy:
    """An HTTP proxy in front of an S3 server that counts what it forwards: 'list' (ListObjects), 'get' (object
    downloads), 'head' and 'other'."""

    def __init__(self, upstream_port: int) -> None:
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        counts = self.counts

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
                parts = urlsplit(self.path).path.strip("/").split("/", 1)
                if self.command == "GET" and ("list-type" in query or "prefix" in query or len(parts) == 1):
                    kind = "list"
                elif self.command == "GET":
                    kind = "get"
                else:
                    kind = self.command.lower()
                with lock:
                    counts[kind] += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def silent_endpoint() -> Iterator[int]:
    """A port that accepts connections and never answers (a storage endpoint that hangs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


# ---- GCS (gcp-storage-emulator) ---------------------------------------------------------------------------------
class Gcs:
    """A GCS emulator; STORAGE_EMULATOR_HOST points google-cloud-storage at it."""

    def __init__(self, port: int) -> None:
        self.host = f"http://127.0.0.1:{port}"

    def client(self) -> Any:
        os.environ.setdefault("STORAGE_EMULATOR_HOST", self.host)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from google.cloud import storage

        c = storage.Client.create_anonymous_client()
        c.project = "trireme-tests"
        return c

    def upload(self, bucket: str, prefix: str, folder: Path) -> None:
        b = self.client().bucket(bucket)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                b.blob(f"{prefix}/{path.relative_to(folder).as_posix()}".lstrip("/")).upload_from_filename(str(path))


@contextmanager
def gcs_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcs]:
    """gcp-storage-emulator (in memory) on a free port; STORAGE_EMULATOR_HOST set for this test and its servers."""
    _need("google.cloud.storage", "google-cloud-storage is the GCS client (trireme[gcs])")
    exe = BIN / "gcp-storage-emulator"
    if not exe.exists():
        pytest.skip("gcp-storage-emulator is not installed (tools/test.sh installs it from PyPI)")
    port = free_port()
    with _process([str(exe), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"], port, "GCS emulator"):
        gcs = Gcs(port)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.host)
        yield gcs


# ---- Azure Blob (Azurite) ---------------------------------------------------------------------------------------
def azurite_binary() -> str | None:
    """azurite-blob: $TRIREME_AZURITE, on PATH, or where tools/test.sh installs it ($TRIREME_TOOLS/npm)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tools = Path(os.environ.get("TRIREME_TOOLS") or cache / "trireme" / "tools")
    for candidate in (os.environ.get("TRIREME_AZURITE"), shutil.which("azurite-blob")):
        if candidate:
            return candidate
    local = tools / "npm" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else None


class Azurite:
    """An Azurite blob service; `connection_string(key)` as AZURE_STORAGE_CONNECTION_STRING takes it."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"

    def connection_string(self, key: str = AZURITE_KEY) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.endpoint};"
        )

    def upload(self, container: str, prefix: str, folder: Path) -> None:
        from azure.storage.blob import BlobServiceClient

        c = BlobServiceClient.from_connection_string(self.connection_string()).get_container_client(container)
        if not c.exists():
            c.create_container()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                name = f"{prefix}/{path.relative_to(folder).as_posix()}".lstrip("/")
                with open(path, "rb") as f:
                    c.upload_blob(name, f, overwrite=True)


@contextmanager
def azurite_server(workdir: Path) -> Iterator[Azurite]:
    """Azurite's blob service on a free port, its data under workdir."""
    _need("azure.storage.blob", "azure-storage-blob is the Azure client (trireme[azure])")
    exe = azurite_binary()
    if exe is None:
        pytest.skip("azurite is not installed (npm install azurite; tools/test.sh installs it into $TRIREME_TOOLS/npm)")
    port = free_port()
    args = [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(workdir), "--silent"]
    with _process([*args, "--skipApiVersionCheck"], port, "azurite"):
        yield Azurite(port)
