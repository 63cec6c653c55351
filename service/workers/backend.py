"""The worker-side Backend interface that every framework (python, pytorch, onnxruntime, tensorrt) implements.

A backend runs inside a worker process. It sees requests whose inputs are numpy arrays (views over shared
memory when possible) and answers each request through `WorkerRequest.respond`, which the worker turns into
frames for the server. Nothing here knows about gRPC, HTTP or the scheduler.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import ErrorCode


@dataclass(slots=True)
class BackendContext:
    """What a backend is told about the model instance it serves."""

    model_name: str
    model_version: str
    model_dir: str  # the model directory (Triton's args['model_repository'])
    version_dir: str  # <model_dir>/<version>
    config: dict[str, Any]  # the normalized config as JSON (PROTOCOL.md §3.4)
    config_json: str
    instance_name: str
    instance_kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int
    # set by the worker: lets backends issue requests to other models (BLS); None when unsupported
    bls: Any = None


RespondFn = Callable[
    ["WorkerRequest", dict[str, np.ndarray] | None, tuple[int, str] | None, bool, dict[str, Any] | None],
    None,
]


@dataclass(slots=True, eq=False)
class WorkerRequest:
    """One request inside a batch, as a backend sees it."""

    rid: int
    id: str
    inputs: dict[str, np.ndarray]  # in the client's order
    requested_outputs: list[str]  # empty = every output of the config
    parameters: dict[str, Any]
    flags: int
    correlation_id: int | str
    timeout_us: int
    responder: RespondFn
    cancelled: bool = False
    responses_sent: int = 0
    closed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def respond(
        self,
        outputs: dict[str, np.ndarray] | None = None,
        error: tuple[int, str] | None = None,
        final: bool = True,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """Send a response (outputs or an (ErrorCode, message) error); outputs=None and error=None with
        final=True sends only the final flag (a decoupled model's empty final)."""
        self.responder(self, outputs, error, final, parameters)

    def fail(self, code: ErrorCode, message: str) -> None:
        """Send a final error response."""
        self.respond(None, (int(code), message), True)


class Backend(ABC):
    """A model instance's implementation inside a worker process."""

    #: whether execute() may return before every request has its final response (decoupled models)
    decoupled: bool = False

    def __init__(self, context: BackendContext) -> None:
        self.context = context

    @abstractmethod
    def initialize(self) -> None:
        """Load the model; raising fails the model load with the exception's message."""

    @abstractmethod
    def execute(self, requests: list[WorkerRequest]) -> None:
        """Run one batch. Every request must get a final response, during this call unless decoupled."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release resources before the worker exits."""

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Return the config completed from the model itself (default: unchanged)."""
        return config


# backend name -> "module:Class", imported lazily so a worker only imports its own framework
BACKENDS: dict[str, str] = {
    "python": "service.workers.python_backend:PythonBackend",
    "pytorch": "service.workers.torch_backend:TorchBackend",
    "onnxruntime": "service.workers.onnx_backend:OnnxBackend",
    "tensorrt": "service.workers.tensorrt_backend:TensorRTBackend",
}


def load_backend_class(name: str) -> type[Backend]:
    """Import the Backend class registered under `name`; ValueError when unknown."""
    target = BACKENDS.get(name)
    if target is None:
        raise ValueError(f"unsupported backend '{name}' (supported: {', '.join(sorted(BACKENDS))})")
    module_name, class_name = target.split(":")
    backend_cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return backend_cls
