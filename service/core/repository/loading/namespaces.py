"""--model-namespacing: models of the same name in different repositories, as Triton resolves them.

Each repository is a namespace. A name found in one repository only keeps its plain name as its key; a name found
in several is kept once per repository, keyed by its folder (<repository>/<name>). A request naming such a model
is ambiguous and refused with Triton's message; load and unload by name act on every model of that name; an
ensemble's step prefers the model of the ensemble's own repository (its `model_namespace` is set to it, as Triton
does), else the one model of that name elsewhere.
"""

from __future__ import annotations

import os

from protos import model_config_pb2 as mc
from service.core.repository.versions import scan_repositories
from service.errors import ErrorCode, ServiceError


def scan_namespaced(paths: list[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(key -> model folder, name -> keys of the names found in several repositories)."""
    per_root = [scan_repositories([root]) for root in paths]
    count: dict[str, int] = {}
    for found in per_root:
        for name in found:
            count[name] = count.get(name, 0) + 1
    keyed: dict[str, str] = {}
    shared: dict[str, list[str]] = {}
    for found in per_root:
        for name, path in found.items():
            if count[name] == 1:
                keyed[name] = path
            else:
                keyed[path] = path
                shared.setdefault(name, []).append(path)
    return keyed, shared


def ambiguous(name: str, keys: list[str]) -> ServiceError:
    """Triton's error for a name that several namespaces hold."""
    return ServiceError(
        ErrorCode.INVALID_ARG,
        f"There are {len(keys)} identifiers of model '{name}' in global map, model namespace must be provided to "
        "resolve ambiguity.",
    )


def resolve_steps(config: mc.ModelConfig, model_dir: str, shared: dict[str, list[str]]) -> None:
    """Point each step of an ensemble whose model name is shared at the ensemble's own repository."""
    namespace = os.path.dirname(model_dir)
    for step in config.ensemble_scheduling.step:
        if step.model_name in shared and os.path.join(namespace, step.model_name) in shared[step.model_name]:
            step.model_namespace = namespace
