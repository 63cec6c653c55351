"""The environment cache: one folder per content digest, made once (under a lock, by an atomic rename) and
reused by every instance, every model that names the same content, and later server runs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator

CACHE_ENV = "TRIREME_PYTHON_ENV_CACHE"  # where environments are kept (default ~/.cache/trireme/python_envs)

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def cache_root() -> str:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "trireme", "python_envs")
    os.makedirs(root, exist_ok=True)
    return root


def file_digest(path: str) -> str:
    """sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """A lock on `path`: threads of this server, and other servers sharing the cache (flock)."""
    with _locks_guard:
        lock = _locks.setdefault(path, threading.Lock())
    with lock, open(path + ".lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_dir(kind: str, digest: str, make: Callable[[str], None]) -> tuple[str, bool]:
    """(<cache>/<kind>/<digest>, made now): `make(tmp)` fills a temporary folder that is renamed into place,
    so a half-made environment (a crash, a failed build) is never reused."""
    parent = os.path.join(cache_root(), kind)
    os.makedirs(parent, exist_ok=True)
    final = os.path.join(parent, digest)
    if os.path.isdir(final):
        return final, False
    with _locked(final):
        if os.path.isdir(final):
            return final, False
        tmp = tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=parent)
        try:
            make(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final, True
