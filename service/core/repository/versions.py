"""Repository helpers: model and version folders, the version policy's choice, the request signature."""

from __future__ import annotations

import os
from typing import Any

from protos import model_config_pb2 as mc
from service.core.repository.signature import ModelSignature, tensor_spec
from service.errors import ErrorCode, ServiceError


def scan_repositories(paths: list[str]) -> dict[str, str]:
    """Model name -> model directory across all repositories (names must be unique); blocking."""
    found: dict[str, str] = {}
    for root in paths:
        if not os.path.isdir(root):
            raise ServiceError(ErrorCode.INVALID_ARG, f"model repository path '{root}' is not a directory")
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if not os.path.isdir(path) or name.startswith("."):
                continue
            if name in found:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f"model '{name}' appears in two repositories: '{found[name]}' and '{path}'",
                )
            found[name] = path
    return found


def numeric_versions(model_dir: str) -> list[int]:
    """Version sub-directories: numeric names not starting with '0', ascending."""
    out = []
    for entry in os.listdir(model_dir):
        if entry.isdigit() and not entry.startswith("0") and os.path.isdir(os.path.join(model_dir, entry)):
            out.append(int(entry))
    return sorted(out)


def select_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """Apply version_policy to the available versions."""
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        return available
    if policy == "specific":
        return [v for v in config.version_policy.specific.versions if v in available]
    n = max(1, config.version_policy.latest.num_versions)
    return available[-n:]


def build_signature(config: mc.ModelConfig) -> ModelSignature:
    """What requests are validated against."""

    def dims(t: Any) -> list[int]:
        return list(t.dims)

    inputs = {t.name: tensor_spec(t.name, mc.DataType.Name(t.data_type), dims(t), t.optional) for t in config.input}
    outputs = {t.name: tensor_spec(t.name, mc.DataType.Name(t.data_type), dims(t)) for t in config.output}
    required = tuple(t.name for t in config.input if not t.optional)
    internal = frozenset(
        [c.name for c in config.sequence_batching.control_input]
        + [s.input_name for s in config.sequence_batching.state]
    )
    return ModelSignature(config.name, config.max_batch_size, inputs, outputs, required, internal)
