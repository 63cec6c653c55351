"""Cloud repository parts without a storage server: URL forms (Triton's), the credential file's longest-prefix
match, and what a mirror sync downloads and deletes (a store over a local folder stands in for the bucket; the
real providers are exercised in tests/integration/test_cloud_repositories.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from service.core.repository.storage import mirror as mirror_module
from service.core.repository.storage.credentials import credential_for
from service.core.repository.storage.location import parse_location
from service.core.repository.storage.mirror import RemoteRepositories
from service.errors import ServiceError


@pytest.mark.parametrize(
    ("url", "bucket", "prefix", "endpoint", "account"),
    [
        ("s3://bucket/path/to/repo", "bucket", "path/to/repo", "", ""),
        ("s3://bucket", "bucket", "", "", ""),
        ("s3://10.0.0.1:9000/bucket/repo/", "bucket", "repo", "http://10.0.0.1:9000", ""),
        ("s3://https://minio.local:443/bucket//repo", "bucket", "repo", "https://minio.local:443", ""),
        ("s3://http://minio.local:80/b.c-d/x", "b.c-d", "x", "http://minio.local:80", ""),
        ("gs://bucket/team/repo", "bucket", "team/repo", "", ""),
        ("as://acct/container/path/repo", "container", "path/repo", "", "acct"),
        ("as://acct.blob.core.windows.net/container", "container", "", "", "acct"),
    ],
)
def test_url_forms(url: str, bucket: str, prefix: str, endpoint: str, account: str) -> None:
    loc = parse_location(url)
    assert (loc.bucket, loc.prefix, loc.endpoint, loc.account) == (bucket, prefix, endpoint, account)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://", "No bucket name found in path: s3://"),
        ("gs://", "No bucket name found in path: gs://"),
        ("s3://Upper_Case/x", "Invalid bucket name: 'Upper_Case'"),
        ("s3://https://host/bucket", "Invalid S3 path"),
        ("as://account", "Invalid azure storage path: as://account"),
    ],
)
def test_malformed_urls(url: str, message: str) -> None:
    with pytest.raises(ServiceError, match=message):
        parse_location(url)
    repos = RemoteRepositories([url])  # the server reports it when it syncs (at start: it does not start)
    with pytest.raises(ServiceError, match=message):
        repos.sync()


def test_credential_file_longest_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"s3": {"": {"key_id": "any"}, "s3://b2": {"key_id": "b2"}, "s3://b2/team": {"key_id": "team"}}}
    path = tmp_path / "creds.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    assert credential_for("s3", "s3://b1/x")["key_id"] == "any"
    assert credential_for("s3", "s3://b2/x")["key_id"] == "b2"
    assert credential_for("s3", "s3://b2/team/repo")["key_id"] == "team"
    assert credential_for("gs", "gs://b/x") is None
    path.write_text("{not json")
    with pytest.raises(ServiceError, match="TRITON_CLOUD_CREDENTIAL_PATH"):
        credential_for("s3", "s3://b1/x")
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH")
    assert credential_for("s3", "s3://b1/x") is None


class FolderStore:
    """A bucket stood in for by a local folder; counts listings and downloads."""

    def __init__(self, root: Path) -> None:
        self.root, self.listings, self.downloads = root, 0, []

    def list(self) -> dict[str, str]:
        self.listings += 1
        return {
            p.relative_to(self.root).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in self.root.rglob("*")
            if p.is_file()
        }

    def download(self, relative: str, dest: str) -> None:
        self.downloads.append(relative)
        Path(dest).write_bytes((self.root / relative).read_bytes())


def test_sync_downloads_only_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = tmp_path / "bucket"
    for rel, text in {"m/config.pbtxt": "a", "m/1/model.py": "b", "n/1/model.py": "c"}.items():
        (bucket / rel).parent.mkdir(parents=True, exist_ok=True)
        (bucket / rel).write_text(text)
    store = FolderStore(bucket)
    monkeypatch.setattr(mirror_module, "open_store", lambda location: store)
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path / "mount"))
    (tmp_path / "mount").mkdir()
    repos = RemoteRepositories([str(tmp_path / "local"), "s3://bucket/repo"])
    local = Path(repos.local_paths[1])
    assert repos.local_paths[0] == str(tmp_path / "local") and local.parent == tmp_path / "mount"
    repos.sync()
    assert sorted(store.downloads) == ["m/1/model.py", "m/config.pbtxt", "n/1/model.py"]
    mtime = (local / "m" / "1" / "model.py").stat().st_mtime_ns
    repos.sync()  # unchanged: a listing, no download, files untouched
    assert store.listings == 2 and len(store.downloads) == 3
    assert (local / "m" / "1" / "model.py").stat().st_mtime_ns == mtime

    (bucket / "m" / "config.pbtxt").write_text("changed")
    (bucket / "m" / "2").mkdir()
    (bucket / "m" / "2" / "model.py").write_text("v2")
    for f in (bucket / "n").rglob("*"):
        if f.is_file():
            f.unlink()
    repos.sync(str(local / "m"))  # one model's folder only: n stays as it is
    assert sorted(store.downloads[3:]) == ["m/2/model.py", "m/config.pbtxt"]
    assert (local / "m" / "config.pbtxt").read_text() == "changed" and (local / "n").is_dir()
    repos.sync()
    assert not (local / "n").exists() and len(store.downloads) == 5
    assert not [p for p in local.rglob(".*")]  # no temporary file left behind
    repos.close()
    assert not local.exists()
