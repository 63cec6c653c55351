"""The local copy of a remote repository, kept in step with its bucket.

A sync lists the repository's objects and downloads only those whose tag (ETag, md5, generation) changed since the
last sync; files whose objects are gone are deleted. So an unchanged repository costs one listing, and the local
files keep their modification times: poll mode's snapshots (snapshots.py) see exactly what changed upstream.
Downloads go to a hidden temporary name and are renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

from service.core.repository.storage.location import RemoteLocation, is_remote, parse_location
from service.core.repository.storage.store import ObjectStore, StorageError, open_store
from service.errors import ErrorCode, ServiceError

log = logging.getLogger("trireme.repository.storage")

MOUNT_DIRECTORY_ENV = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs": "TRITON_GCS_MOUNT_DIRECTORY",
    "as": "TRITON_AZURE_MOUNT_DIRECTORY",
}
DOWNLOAD_THREADS = 8


class Mirror:
    """One remote repository and its local folder."""

    def __init__(self, location: RemoteLocation) -> None:
        self.location = location
        variable = MOUNT_DIRECTORY_ENV[location.scheme]
        mount = os.environ.get(variable) or None
        if mount is not None and not os.path.isdir(mount):
            raise ServiceError(
                ErrorCode.INVALID_ARG, f"{variable} '{mount}' is not a directory (model repository {location.url})"
            )
        self.local = tempfile.mkdtemp(prefix=f"trireme-{location.scheme}-", dir=mount)
        self._store: ObjectStore | None = None
        self._tags: dict[str, str] = {}  # what the local copy holds: relative path -> tag
        self._lock = threading.Lock()
        self.downloads = 0  # objects downloaded so far (all syncs)

    def sync(self, model: str = "") -> None:
        """Bring the local copy (or one model's folder of it) in step with the bucket; ServiceError naming the URL."""
        with self._lock:
            try:
                if self._store is None:
                    self._store = open_store(self.location)
                self._sync(self._store, model)
            except StorageError as e:
                raise ServiceError(
                    ErrorCode.INTERNAL, f"failed to read model repository '{self.location.url}': {e}"
                ) from None

    def _sync(self, store: ObjectStore, model: str) -> None:
        listed = store.list()
        scope = f"{model}/" if model else ""
        remote = {k: t for k, t in listed.items() if k.startswith(scope)}
        local = {k: t for k, t in self._tags.items() if k.startswith(scope)}
        fetch = [k for k, t in remote.items() if not k.endswith("/") and local.get(k) != t]
        gone = [k for k in local if k not in remote]
        for key in remote:  # folders first: folder markers and the parents of every object
            folder = key if key.endswith("/") else os.path.dirname(key)
            if folder:
                os.makedirs(self._path(folder), exist_ok=True)
            if key.endswith("/"):
                self._tags[key] = remote[key]
        for key in gone:
            self._tags.pop(key, None)
            with contextlib.suppress(OSError):
                os.remove(self._path(key))
        with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            for key in pool.map(lambda k: self._download(store, k), fetch):
                self._tags[key] = remote[key]
        self.downloads += len(fetch)
        if gone:
            self._prune_folders(remote, scope)
        if fetch or gone:
            log.info(
                "model repository '%s': %d file(s) downloaded, %d removed", self.location.url, len(fetch), len(gone)
            )

    def _download(self, store: ObjectStore, key: str) -> str:
        dest = self._path(key)
        part = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.part")
        store.download(key, part)
        os.replace(part, dest)
        return key

    def _prune_folders(self, remote: dict[str, str], scope: str) -> None:
        """Remove local folders that no longer hold anything the bucket has (a deleted model or version)."""
        keep = {os.path.dirname(k.rstrip("/")) for k in remote} | {k.rstrip("/") for k in remote}
        keep |= {p for k in list(keep) for p in _parents(k)}
        root = self._path(scope) if scope else self.local
        for directory, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
            rel = os.path.relpath(directory, self.local)
            if rel != "." and rel not in keep:
                shutil.rmtree(directory, ignore_errors=True)

    def _path(self, relative: str) -> str:
        path = os.path.normpath(os.path.join(self.local, relative))
        if not path.startswith(self.local + os.sep) and path != self.local:  # a key such as "../x"
            raise StorageError(f"object {self.location.display(relative)} is outside the repository")
        return path

    def close(self) -> None:
        """Delete the local copy."""
        shutil.rmtree(self.local, ignore_errors=True)


def _parents(path: str) -> list[str]:
    out = []
    while path:
        path = os.path.dirname(path)
        if path:
            out.append(path)
    return out


class RemoteRepositories:
    """The --model-repository values with a local folder for each: remote ones are mirrors, local ones as given."""

    def __init__(self, paths: list[str]) -> None:
        self.mirrors: dict[int, Mirror] = {}  # index in paths -> mirror
        self.error: ServiceError | None = None  # a malformed URL: raised by the first sync (the server won't start)
        try:
            for i, path in enumerate(paths):
                if is_remote(path):
                    self.mirrors[i] = Mirror(parse_location(path))
        except ServiceError as e:
            self.error = e
        self.local_paths = [self.mirrors[i].local if i in self.mirrors else p for i, p in enumerate(paths)]
        if self.mirrors:
            atexit.register(self.close)

    def sync(self, model_dir: str = "") -> None:
        """Sync every remote repository (blocking); with model_dir (a local model folder), only the one holding it."""
        if self.error is not None:
            raise self.error
        for mirror in self.mirrors.values():
            if not model_dir:
                mirror.sync()
            elif os.path.dirname(model_dir) == mirror.local:
                mirror.sync(os.path.basename(model_dir))

    def close(self) -> None:
        """Delete every local copy (at stop, and at exit)."""
        for mirror in self.mirrors.values():
            mirror.close()
