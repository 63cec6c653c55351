"""gs:// repositories through google-cloud-storage (the `gcs` extra).

Credentials as Triton takes them: a TRITON_CLOUD_CREDENTIAL_PATH entry (the path of a credential JSON file), else
GOOGLE_APPLICATION_CREDENTIALS and the rest of Google's default chain (the attached service account), else
anonymous access (a public bucket). STORAGE_EMULATOR_HOST (google-cloud-storage's own variable) points the client
at an emulator.
"""

from __future__ import annotations

import os
from typing import Any

import google.auth
from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from service.core.repository.storage.credentials import credential_for
from service.core.repository.storage.location import RemoteLocation
from service.core.repository.storage.store import StorageError

_ERRORS = (gexc.GoogleAPIError, GoogleAuthError, OSError, ValueError)


def _client(location: RemoteLocation) -> storage.Client:
    key_file = credential_for("gs", location.url)
    if isinstance(key_file, str) and key_file:
        credentials, project = google.auth.load_credentials_from_file(key_file)
        return storage.Client(project=project or "trireme", credentials=credentials)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client.create_anonymous_client()
    try:
        credentials, project = google.auth.default()
    except DefaultCredentialsError:
        return storage.Client.create_anonymous_client()
    return storage.Client(project=project or "trireme", credentials=credentials)


class GcsStore:
    """One bucket, listed and read through a google-cloud-storage client."""

    def __init__(self, location: RemoteLocation, timeout_s: float) -> None:
        self.location = location
        self.client = _client(location)
        self.timeout: Any = (timeout_s, timeout_s)  # (connect, read)
        self.retry = DEFAULT_RETRY.with_timeout(timeout_s)
        self._checked = False

    def list(self) -> dict[str, str]:
        loc = self.location
        if not self._checked:
            try:
                self.client.get_bucket(loc.bucket, timeout=self.timeout, retry=self.retry)
            except _ERRORS as e:
                raise StorageError(f"Could not get MetaData for bucket with name {loc.bucket} : {e}") from None
            self._checked = True
        prefix = loc.key("")
        out: dict[str, str] = {}
        try:
            for blob in self.client.list_blobs(loc.bucket, prefix=prefix, timeout=self.timeout, retry=self.retry):
                rel = blob.name[len(prefix) :]
                if rel:
                    out[rel] = f"{blob.generation}:{blob.md5_hash}:{blob.size}"
        except _ERRORS as e:
            raise StorageError(f"Failed to list contents of directory at {loc.display()} : {e}") from None
        return out

    def download(self, relative: str, dest: str) -> None:
        blob = self.client.bucket(self.location.bucket).blob(self.location.key(relative))
        try:
            blob.download_to_filename(dest, timeout=self.timeout, retry=self.retry)
        except _ERRORS as e:
            raise StorageError(f"Failed to get object at {self.location.display(relative)} : {e}") from None


def open_store(location: RemoteLocation, timeout_s: float) -> GcsStore:
    """The store of a gs:// location."""
    try:
        return GcsStore(location, timeout_s)
    except _ERRORS as e:
        raise StorageError(f"Unable to create GCS client. Check account credentials. ({e})") from None
