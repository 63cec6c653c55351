"""PyTriton's declarations of a bound function: Tensor, DynamicBatcher and ModelConfig (same fields and
defaults; `instance_count` is Trireme's addition), and the config.pbtxt they make."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from shm.tensor import DATATYPE_TO_CONFIG, numpy_to_datatype

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")  # PyTriton's rule for model names


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output: its shape without the batch dimension (-1: any size), numpy dtype, and name
    (INPUT_<n> / OUTPUT_<n> when not given)."""

    shape: tuple
    dtype: Any
    name: str | None = None
    optional: bool | None = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)

    def datatype(self) -> str:
        """The Triton datatype (FP32, BYTES, ...); ValueError when numpy's dtype has none."""
        try:
            return numpy_to_datatype(np.dtype(self.dtype))
        except (TypeError, ValueError, KeyError):
            raise ValueError(f"tensor '{self.name}': dtype {self.dtype!r} has no Triton data type") from None


@dataclasses.dataclass
class QueuePolicy:
    """A dynamic batcher's queue policy (Triton's ModelQueuePolicy)."""

    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """The dynamic batcher of a batched function (Triton's dynamic_batching)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None


@dataclasses.dataclass
class ModelConfig:
    """How a bound function is served: batching (with max_batch_size and the dynamic batcher), response cache,
    decoupled responses; `instance_count` instances (PyTriton: a list of functions, one per instance)."""

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list | None = None
    instance_count: int = 1


def named(tensors: Sequence[Tensor], prefix: str) -> list[Tensor]:
    """The tensors with PyTriton's default names filled in; ValueError on a repeated name."""
    out = [t if t.name else dataclasses.replace(t, name=f"{prefix}_{i}") for i, t in enumerate(tensors, start=1)]
    names = [t.name for t in out]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"{prefix.lower()} name '{name}' is declared more than once")
    return out


def _queue_policy(p: QueuePolicy) -> str:
    return (
        f"{{ timeout_action: {p.timeout_action} default_timeout_microseconds: {p.default_timeout_microseconds} "
        f"allow_timeout_override: {str(p.allow_timeout_override).lower()} max_queue_size: {p.max_queue_size} }}"
    )


def _tensor_text(t: Tensor, is_input: bool) -> str:
    dims = ", ".join(str(int(d)) for d in t.shape)
    optional = f" optional: {str(bool(t.optional)).lower()}" if is_input else ""
    return f'  {{ name: "{t.name}" data_type: {DATATYPE_TO_CONFIG[t.datatype()]} dims: [ {dims} ]{optional} }}'


def config_text(
    name: str,
    inputs: list[Tensor],
    outputs: list[Tensor],
    config: ModelConfig,
    instances: int,
    parameters: dict[str, str],
) -> str:
    """config.pbtxt of a bound function (a Python-backend model)."""
    lines = [
        f'name: "{name}"',
        'backend: "python"',
        f"max_batch_size: {config.max_batch_size if config.batching else 0}",
    ]
    if config.batching and config.max_batch_size > 0:
        b = config.batcher
        parts = [f"max_queue_delay_microseconds: {b.max_queue_delay_microseconds}"]
        if b.preferred_batch_size:
            parts.append(f"preferred_batch_size: [ {', '.join(str(int(s)) for s in b.preferred_batch_size)} ]")
        parts.append(f"preserve_ordering: {str(b.preserve_ordering).lower()}")
        if b.priority_levels:
            parts.append(f"priority_levels: {b.priority_levels} default_priority_level: {b.default_priority_level}")
        if b.default_queue_policy is not None:
            parts.append(f"default_queue_policy {_queue_policy(b.default_queue_policy)}")
        for level, policy in (b.priority_queue_policy or {}).items():
            parts.append(f"priority_queue_policy {{ key: {int(level)} value {_queue_policy(policy)} }}")
        lines.append("dynamic_batching { " + " ".join(parts) + " }")
    lines.append("input [\n" + ",\n".join(_tensor_text(t, True) for t in inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor_text(t, False) for t in outputs) + "\n]")
    lines.append(f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]")
    if config.decoupled:
        lines.append("model_transaction_policy { decoupled: true }")
    if config.response_cache:
        lines.append("response_cache { enable: true }")
    for key, value in parameters.items():
        lines.append(f"parameters {{ key: {json.dumps(key)} value {{ string_value: {json.dumps(value)} }} }}")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class TritonConfig:
    """PyTriton's server settings that trireme.Server(config=...) uses (None: trireme.Server's default)."""

    http_address: str | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    model_repository: str | None = None
