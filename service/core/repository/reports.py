"""What the repository reports about its models through the engine: the repository index (one row per model
version) and the inference statistics of one model, one version or every READY version. Read-only; not on the
inference path."""

from __future__ import annotations

from service.core.observability.stats import ModelStats
from service.core.repository.model_version import READY
from service.core.repository.repository import ModelRepository
from service.core.repository.signature import parse_version
from service.errors import ErrorCode, ServiceError
from service.types import IndexEntry


def model_statistics(
    repository: ModelRepository, name: str = "", version: str = ""
) -> list[tuple[str, str, ModelStats]]:
    """(name, version, stats) for one model/version or every READY one."""
    if not name:
        return [
            (e.name, str(v), mv.stats)
            for e in sorted(repository.models.values(), key=lambda e: e.name)
            for v, mv in sorted(e.versions.items())
            if mv.state == READY
        ]
    entry = repository.entry(name)
    ready = {v: mv for v, mv in (entry.versions.items() if entry else []) if mv.state == READY}
    if not ready:
        raise ServiceError(ErrorCode.INVALID_ARG, f"requested model '{name}' is not available")
    if version:
        mv = ready.get(parse_version(version))
        if mv is None:
            raise ServiceError(ErrorCode.INVALID_ARG, f"requested model version is not available for model '{name}'")
        return [(name, version, mv.stats)]
    return [(name, str(v), mv.stats) for v, mv in sorted(ready.items())]


def repository_index(repository: ModelRepository, ready_only: bool = False) -> list[IndexEntry]:
    """One row per (model, version) known, or just the name for never-loaded models."""
    rows = []
    for entry in sorted(repository.models.values(), key=lambda e: e.name):
        if entry.error and not entry.versions:
            if not ready_only:
                rows.append(IndexEntry(entry.name, "", "UNAVAILABLE", entry.error))
            continue
        if not entry.versions:
            if not ready_only:
                rows.append(IndexEntry(entry.name))
            continue
        for v, mv in sorted(entry.versions.items()):
            if ready_only and mv.state != READY:
                continue
            rows.append(IndexEntry(entry.name, str(v), mv.state, mv.reason))
    return rows
