"""tritonserver.InferenceRequest, and its translation into the core's InferRequest."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from typing import Any

from service.types import InferRequest, InputTensor
from trireme.tritonserver._errors import InvalidArgumentError
from trireme.tritonserver._tensor import Tensor


@dataclass
class InferenceRequest:
    """One inference request: inputs by name (Tensor, numpy array, list or DLPack object), Triton's request
    fields (`timeout` in microseconds) and parameters."""

    model: Any  # the trireme.tritonserver.Model (not imported: it imports this module)
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Tensor | Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Any = None
    response_queue: queue.SimpleQueue | asyncio.Queue | None = None

    def _to_core(self) -> InferRequest:
        """The core's request (the inputs serialized once, in the wire layout)."""
        inputs = []
        for name, value in self.inputs.items():
            tensor = Tensor._from_object(value)
            inputs.append(InputTensor(name, tensor.data_type.name, list(tensor.shape), data=tensor._raw()))
        for key, value in self.parameters.items():
            if not isinstance(value, (str, int, bool, float)):
                raise InvalidArgumentError(f"Invalid parameter type {type(value)} for key '{key}'")
        version = self.model.version
        return InferRequest(
            model_name=self.model.name,
            model_version="" if version is None or version < 0 else str(version),
            id=self.request_id or "",
            inputs=inputs,
            parameters=dict(self.parameters),
            sequence_id=self.correlation_id if self.correlation_id is not None else 0,
            flags=self.flags,
            priority=self.priority,
            timeout_us=self.timeout,
        )
