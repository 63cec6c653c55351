"""as:// repositories through azure-storage-blob (the `azure` extra).

Credentials as Triton takes them: a TRITON_CLOUD_CREDENTIAL_PATH entry (account_str, account_key, auth_type,
client_id), else AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY / AZURE_STORAGE_AUTH_TYPE / AZURE_STORAGE_CLIENT_ID.
auth_type "managed_identity" and "default" use azure-identity (installed separately); no key means anonymous
access. The endpoint is https://<account>.blob.core.windows.net, as in Triton; Trireme also honours
AZURE_STORAGE_CONNECTION_STRING (the Azure tools' own variable: endpoint and key, e.g. the Azurite emulator's).
"""

from __future__ import annotations

import os
from typing import Any

from azure.core.exceptions import AzureError
from azure.storage.blob import BlobServiceClient

from service.core.repository.storage.credentials import credential_for, field
from service.core.repository.storage.location import RemoteLocation
from service.core.repository.storage.store import StorageError

_ERRORS = (AzureError, OSError, ValueError)


def _settings(location: RemoteLocation) -> dict[str, str]:
    entry = credential_for("as", location.url)
    if entry is not None:
        names = ("account_str", "account_key", "auth_type", "client_id")
        return {n: field(entry, n) for n in names}
    env = os.environ.get
    return {
        "account_str": env("AZURE_STORAGE_ACCOUNT", ""),
        "account_key": env("AZURE_STORAGE_KEY", ""),
        "auth_type": env("AZURE_STORAGE_AUTH_TYPE", ""),
        "client_id": env("AZURE_STORAGE_CLIENT_ID", ""),
    }


def _token_credential(auth_type: str, client_id: str) -> Any:
    try:
        from azure import identity  # type: ignore[attr-defined]
    except ImportError as e:
        raise StorageError(
            f"AZURE_STORAGE_AUTH_TYPE={auth_type} needs azure-identity: pip install azure-identity ({e})"
        ) from None
    if auth_type == "managed_identity":
        return identity.ManagedIdentityCredential(client_id=client_id or None)
    return identity.DefaultAzureCredential()


def _client(location: RemoteLocation, timeout_s: float) -> BlobServiceClient:
    options: dict[str, Any] = {"connection_timeout": timeout_s, "read_timeout": timeout_s, "retry_total": 1}
    s = _settings(location)
    connection_string = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    if connection_string and not s["account_key"] and s["auth_type"] not in ("managed_identity", "default"):
        return BlobServiceClient.from_connection_string(connection_string, **options)
    account = s["account_str"] or location.account
    url = f"https://{account}.blob.core.windows.net"
    credential: Any = None
    if s["auth_type"] in ("managed_identity", "default"):
        credential = _token_credential(s["auth_type"], s["client_id"])
    elif s["account_key"]:
        credential = {"account_name": account, "account_key": s["account_key"]}
    return BlobServiceClient(url, credential=credential, **options)


class AzureStore:
    """One container, listed and read through an azure-storage-blob client."""

    def __init__(self, location: RemoteLocation, timeout_s: float) -> None:
        self.location = location
        self.container = _client(location, timeout_s).get_container_client(location.bucket)
        self._checked = False

    def list(self) -> dict[str, str]:
        loc = self.location
        if not self._checked:
            try:
                self.container.get_container_properties()
            except _ERRORS as e:
                raise StorageError(f"Failed to check if directory at {loc.display()}: {_first_line(e)}") from None
            self._checked = True
        prefix = loc.key("")
        out: dict[str, str] = {}
        try:
            for blob in self.container.list_blobs(name_starts_with=prefix or None):
                rel = blob.name[len(prefix) :]
                if rel:
                    out[rel] = f"{blob.etag}:{blob.size}"
        except _ERRORS as e:
            raise StorageError(f"Failed to get contents of directory {loc.display()}: {_first_line(e)}") from None
        return out

    def download(self, relative: str, dest: str) -> None:
        try:
            with open(dest, "wb") as f:
                self.container.download_blob(self.location.key(relative)).readinto(f)
        except _ERRORS as e:
            raise StorageError(
                f"Failed to download file at {self.location.display(relative)}: {_first_line(e)}"
            ) from None


def _first_line(e: Exception) -> str:
    """Azure errors carry the whole HTTP exchange; the first line says what went wrong."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def open_store(location: RemoteLocation, timeout_s: float) -> AzureStore:
    """The store of an as:// location."""
    try:
        return AzureStore(location, timeout_s)
    except _ERRORS as e:
        raise StorageError(f"Unable to create Azure filesystem client. Check account credentials. ({e})") from None
