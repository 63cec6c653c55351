"""Official storage SDKs vs the fsspec family for cloud model repositories (docs/cloud-repositories.md).

For each provider: the import time of the client (a fresh interpreter, best of 5) and the time to copy a
repository of N files from the local emulator (moto's S3 server, gcp-storage-emulator, Azurite) into an empty
folder: Trireme's mirror (boto3 / google-cloud-storage / azure-storage-blob) against s3fs / gcsfs / adlfs `get`
(recursive). Needs both families installed in the interpreter that runs it (they are not Trireme's dependencies):

    python -m venv /tmp/v && /tmp/v/bin/pip install boto3 google-cloud-storage azure-storage-blob s3fs gcsfs adlfs
    PYTHONPATH=. /tmp/v/bin/python tests/bench/bench_cloud_clients.py --files 200 \
        --moto .venv/bin/moto_server --gcs .venv/bin/gcp-storage-emulator --azurite "$(command -v azurite-blob)"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.integration.cloud_storage import AZURITE_ACCOUNT, AZURITE_KEY, _process

# gcsfs >= 2025 first asks a gRPC control API for the bucket's layout; an emulator does not serve it and each probe
# waits 60 s. Off, so that the copy time is measured (a real deployment pays the probe once per bucket).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

IMPORTS = {
    "s3": ("boto3", "s3fs"),
    "gs": ("google.cloud.storage", "gcsfs"),
    "as": ("azure.storage.blob", "adlfs"),
}


def import_time(module: str) -> float:
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-W", "ignore", "-c", f"import {module}"], check=True)
        best = min(best, time.perf_counter() - began)
    py = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return best - (time.perf_counter() - py)  # less the interpreter's own start


def make_tree(root: Path, files: int, size: int) -> None:
    for i in range(files):
        p = root / f"model_{i // 10}" / ("config.pbtxt" if i % 10 == 0 else f"1/part_{i}.bin")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def sync_mirror(url: str) -> float:
    from service.core.repository.storage.mirror import RemoteRepositories

    repos = RemoteRepositories([url])
    try:
        return timed(repos.sync)
    finally:
        repos.close()


def sync_fsspec(fs, remote: str) -> float:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as d:
        return timed(lambda: fs.get(remote, d + "/", recursive=True))


def bench_s3(args: argparse.Namespace, tree: Path, port: int) -> tuple[float, float]:
    import boto3
    import s3fs

    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    c = boto3.client("s3", endpoint_url=endpoint)
    c.create_bucket(Bucket="bench")
    for p in tree.rglob("*"):
        if p.is_file():
            c.upload_file(str(p), "bench", f"repo/{p.relative_to(tree).as_posix()}")
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
    return sync_mirror(f"s3://127.0.0.1:{port}/bench/repo"), sync_fsspec(fs, "bench/repo")


def bench_gs(args: argparse.Namespace, tree: Path, port: int) -> tuple[float, float]:
    import gcsfs
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    client = storage.Client.create_anonymous_client()
    client.project = "bench"
    b = client.create_bucket("bench")
    for p in tree.rglob("*"):
        if p.is_file():
            b.blob(f"repo/{p.relative_to(tree).as_posix()}").upload_from_filename(str(p))
    fs = gcsfs.GCSFileSystem(endpoint_url=f"http://127.0.0.1:{port}", token="anon")
    return sync_mirror("gs://bench/repo"), sync_fsspec(fs, "bench/repo")


def bench_as(args: argparse.Namespace, tree: Path, port: int) -> tuple[float, float]:
    import adlfs
    from azure.storage.blob import BlobServiceClient

    conn = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = conn
    cc = BlobServiceClient.from_connection_string(conn).create_container("bench")
    for p in tree.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                cc.upload_blob(f"repo/{p.relative_to(tree).as_posix()}", f)
    fs = adlfs.AzureBlobFileSystem(connection_string=conn)
    return sync_mirror(f"as://{AZURITE_ACCOUNT}/bench/repo"), sync_fsspec(fs, "bench/repo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size", type=int, default=64 << 10, help="bytes per file")
    parser.add_argument("--moto", default="moto_server")
    parser.add_argument("--gcs", default="gcp-storage-emulator")
    parser.add_argument("--azurite", default="azurite-blob")
    args = parser.parse_args()
    from tests.conftest import free_port

    print(f"{args.files} files of {args.size} bytes; seconds")
    print("| provider | import SDK | import fsspec | copy: Trireme mirror (SDK) | copy: fsspec get |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tree = Path(d) / "tree"
        make_tree(tree, args.files, args.size)
        for scheme, bench in (("s3", bench_s3), ("gs", bench_gs), ("as", bench_as)):
            port = free_port()
            command = {
                "s3": [args.moto, "-H", "127.0.0.1", "-p", str(port)],
                "gs": [args.gcs, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
                "as": [args.azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                       str(Path(d) / "az"), "--silent", "--skipApiVersionCheck"],
            }[scheme]  # fmt: skip
            with _process(command, port, scheme):
                mirror, fsspec = bench(args, tree, port)
            sdk, fss = (import_time(m) for m in IMPORTS[scheme])
            print(f"| {scheme} | {sdk:.2f} | {fss:.2f} | {mirror:.2f} | {fsspec:.2f} |", flush=True)


if __name__ == "__main__":
    main()
