"""Credentials of a remote repository: Triton's TRITON_CLOUD_CREDENTIAL_PATH file, else the providers' own chains.

The file groups credentials by provider ("gs", "s3", "as"), each entry keyed by a URL prefix; the longest key that
starts the repository's URL wins ("" matches every URL). Without the variable, each provider's environment
variables and default chain apply (the provider modules read them).
"""

from __future__ import annotations

import json
import os
from typing import Any

from service.errors import ErrorCode, ServiceError

CREDENTIAL_PATH_ENV = "TRITON_CLOUD_CREDENTIAL_PATH"


def credential_for(scheme: str, url: str) -> Any:
    """The credential-file entry for url (a dict for s3/as, a key-file path for gs); None without a file or entry."""
    path = os.environ.get(CREDENTIAL_PATH_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError) as e:
        raise ServiceError(ErrorCode.INVALID_ARG, f"failed to read {CREDENTIAL_PATH_ENV} file '{path}': {e}") from None
    entries = table.get(scheme) if isinstance(table, dict) else None
    if not isinstance(entries, dict):
        return None
    matches = [k for k in entries if url.startswith(k)]
    return entries[max(matches, key=len)] if matches else None


def field(entry: Any, name: str) -> str:
    """A string field of a credential-file entry ("" when absent)."""
    value = entry.get(name, "") if isinstance(entry, dict) else ""
    return value if isinstance(value, str) else ""
