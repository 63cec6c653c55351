"""What a storage provider offers the mirror: list a repository's objects, download one; errors as StorageError."""

from __future__ import annotations

import importlib
import os
from typing import Any, Protocol

from service.core.repository.storage.location import RemoteLocation

TIMEOUT_ENV = "TRIREME_CLOUD_TIMEOUT_S"  # connect and read timeout of every storage request (seconds)
DEFAULT_TIMEOUT_S = 30.0


class StorageError(Exception):
    """A storage request failed; the message names the URL and the provider's reason."""


class ObjectStore(Protocol):
    """One remote repository's bucket (container), as a provider module opens it."""

    def list(self) -> dict[str, str]:
        """Path relative to the repository folder -> a tag that changes when the object changes (ETag, md5,
        generation...); folder markers end with '/'. StorageError when the bucket cannot be read."""
        ...

    def download(self, relative: str, dest: str) -> None:
        """Write one object to the local file dest (StorageError on failure)."""
        ...


def timeout_s() -> float:
    """Connect/read timeout of storage requests: TRIREME_CLOUD_TIMEOUT_S, else 30 s."""
    try:
        return max(0.1, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


_PROVIDERS = {  # scheme -> (module, the extra that installs its client)
    "s3": ("service.core.repository.storage.s3", "s3"),
    "gs": ("service.core.repository.storage.gcs", "gcs"),
    "as": ("service.core.repository.storage.azure", "azure"),
}


def open_store(location: RemoteLocation) -> ObjectStore:
    """The provider's store for a location (its client library is imported here, on first use)."""
    module_name, extra = _PROVIDERS[location.scheme]
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise StorageError(
            f"{location.scheme}:// model repositories need the '{extra}' extra: pip install 'trireme[{extra}]' ({e})"
        ) from None
    store: ObjectStore = module.open_store(location, timeout_s())
    return store
