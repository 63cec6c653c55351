"""Remote repository URLs, parsed the way Triton parses them.

s3://bucket/path                      AWS S3 (region and credentials from the AWS chain)
s3://host:port/bucket/path            an S3-compatible server over HTTP
s3://https://host:port/bucket/path    ... over HTTPS (s3://http://host:port/... is HTTP, as without a scheme)
gs://bucket/path                      Google Cloud Storage
as://account/container/path           Azure Blob Storage
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.errors import ErrorCode, ServiceError

SCHEMES = ("s3://", "gs://", "as://")
# Triton's S3 form with an endpoint: an optional scheme, host:port, then the bucket and the path
_S3_ENDPOINT = re.compile(r"s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)((?:/[^/]+)*)/?")
_S3_BUCKET = re.compile(r"[0-9a-z.\-]+")
_AS_URL = re.compile(r"as://([^/]+)/([^/?]+)(?:/([^?]*))?")


@dataclass(frozen=True, slots=True)
class RemoteLocation:
    """Where a remote repository is: its provider, bucket (container) and the path inside it."""

    url: str  # as given on the command line
    scheme: str  # "s3", "gs" or "as"
    bucket: str  # the S3/GCS bucket, the Azure container
    prefix: str  # the repository folder inside the bucket, without slashes at either end ("" = the root)
    endpoint: str = ""  # s3: "http(s)://host:port" of an S3-compatible server
    account: str = ""  # as: the storage account

    def key(self, relative: str) -> str:
        """The object key of a path relative to the repository folder."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def display(self, relative: str = "") -> str:
        """A URL naming a path inside the repository (messages)."""
        return self.url.rstrip("/") + ("/" + relative if relative else "")


def is_remote(path: str) -> bool:
    """Whether a --model-repository value names cloud storage."""
    return path.startswith(SCHEMES)


def _clean(path: str, scheme: str) -> str:
    """Collapse repeated slashes after the scheme (and after an endpoint's http(s)://), as Triton does."""
    rest = path[len(scheme) :]
    inner = ""
    for proto in ("https://", "http://"):
        if rest.startswith(proto):
            inner, rest = proto, rest[len(proto) :]
            break
    return scheme + inner + re.sub(r"/{2,}", "/", rest.lstrip("/"))


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_ARG, message)


def parse_location(url: str) -> RemoteLocation:
    """The RemoteLocation of an s3://, gs:// or as:// URL; ServiceError (Triton's message) when malformed."""
    if url.startswith("s3://"):
        return _parse_s3(url)
    if url.startswith("gs://"):
        clean = _clean(url, "gs://")
        bucket, _, prefix = clean[len("gs://") :].partition("/")
        if not bucket:
            raise _invalid(f"No bucket name found in path: {url}")
        return RemoteLocation(url, "gs", bucket, prefix.strip("/"))
    if url.startswith("as://"):
        m = _AS_URL.fullmatch(_clean(url, "as://"))
        if m is None:
            raise _invalid(f"Invalid azure storage path: {url}")
        account = m.group(1).removesuffix(".blob.core.windows.net")
        return RemoteLocation(url, "as", m.group(2), (m.group(3) or "").strip("/"), account=account)
    raise _invalid(f"not a cloud storage path: {url}")


def _parse_s3(url: str) -> RemoteLocation:
    clean = _clean(url, "s3://")
    m = _S3_ENDPOINT.fullmatch(clean)
    if m is not None:
        proto = m.group(1) or "http://"
        return RemoteLocation(
            url, "s3", m.group(4), m.group(5).strip("/"), endpoint=f"{proto}{m.group(2)}:{m.group(3)}"
        )
    rest = clean[len("s3://") :]
    if rest.startswith(("http://", "https://")) or re.match(r"[^/]*:", rest):
        raise _invalid(f"Invalid S3 path (expected s3://[http(s)://]host:port/bucket/path): {url}")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise _invalid(f"No bucket name found in path: {url}")
    if not _S3_BUCKET.fullmatch(bucket):
        raise _invalid(f"Invalid bucket name: '{bucket}'")
    return RemoteLocation(url, "s3", bucket, prefix.strip("/"))
