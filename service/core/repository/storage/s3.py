"""s3:// repositories through boto3 (the `s3` extra).

Credentials as Triton takes them: a TRITON_CLOUD_CREDENTIAL_PATH entry (key_id/secret_key/session_token/region,
or a profile), else boto3's default chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN,
AWS_DEFAULT_REGION, AWS_PROFILE, ~/.aws/config and credentials, instance roles...). Without any credential the
requests go unsigned (a public bucket). An s3://host:port/... URL talks path-style to that server.
"""

from __future__ import annotations

import logging
from typing import Any

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from service.core.repository.storage.credentials import credential_for, field
from service.core.repository.storage.location import RemoteLocation
from service.core.repository.storage.store import StorageError

logging.getLogger("botocore.credentials").setLevel(logging.WARNING)  # not "Found credentials in ..." per client


def _reason(e: Exception) -> str:
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code', '')}, error message: {err.get('Message', '') or e}"
    return f"{type(e).__name__}, error message: {e}"


class S3Store:
    """One bucket, listed and read through a boto3 client."""

    def __init__(self, location: RemoteLocation, timeout_s: float) -> None:
        self.location = location
        entry = credential_for("s3", location.url)
        key_id, secret = field(entry, "key_id"), field(entry, "secret_key")
        if key_id and secret:
            session = boto3.session.Session(
                aws_access_key_id=key_id,
                aws_secret_access_key=secret,
                aws_session_token=field(entry, "session_token") or None,
                region_name=field(entry, "region") or None,
            )
        else:
            session = boto3.session.Session(profile_name=field(entry, "profile") or None)
        options: dict[str, Any] = {
            "connect_timeout": timeout_s,
            "read_timeout": timeout_s,
            "retries": {"max_attempts": 2, "mode": "standard"},
        }
        if location.endpoint:
            options["s3"] = {"addressing_style": "path"}
        if session.get_credentials() is None:
            options["signature_version"] = UNSIGNED
        self.client = session.client(
            "s3",
            endpoint_url=location.endpoint or None,
            region_name=session.region_name or "us-east-1",
            config=Config(**options),
        )
        self._checked = False

    def list(self) -> dict[str, str]:
        loc = self.location
        if not self._checked:  # as Triton: the bucket must answer HeadBucket first
            try:
                self.client.head_bucket(Bucket=loc.bucket)
            except (BotoCoreError, ClientError) as e:
                raise StorageError(
                    f"Could not get MetaData for bucket with name {loc.bucket} due to exception: {_reason(e)}"
                ) from None
            self._checked = True
        prefix = loc.key("")
        out: dict[str, str] = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(prefix) :]
                    if rel:
                        out[rel] = f"{obj.get('ETag', '')}:{obj.get('Size', 0)}"
        except (BotoCoreError, ClientError) as e:
            raise StorageError(
                f"Failed to list objects with prefix {loc.display()} due to exception: {_reason(e)}"
            ) from None
        return out

    def download(self, relative: str, dest: str) -> None:
        try:  # one GET per object (download_file would add a HEAD first)
            body = self.client.get_object(Bucket=self.location.bucket, Key=self.location.key(relative))["Body"]
            with open(dest, "wb") as f:
                for chunk in body.iter_chunks(1 << 20):
                    f.write(chunk)
        except (BotoCoreError, ClientError) as e:
            raise StorageError(
                f"Failed to get object at {self.location.display(relative)} due to exception: {_reason(e)}"
            ) from None


def open_store(location: RemoteLocation, timeout_s: float) -> S3Store:
    """The store of an s3:// location."""
    try:
        return S3Store(location, timeout_s)
    except BotoCoreError as e:  # e.g. a profile that is not configured
        raise StorageError(f"Unable to create S3 filesystem client. Check account credentials. ({e})") from None
