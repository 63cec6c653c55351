"""The worker-side Backend interface that every framework (python, pytorch, onnxruntime, tensorrt) implements.

A backend runs inside a worker process. It sees requests whose inputs are numpy arrays (views over shared
memory when possible) and answers each request through `WorkerRequest.respond`, which the worker turns into
frames for the server. Nothing here knows about gRPC, HTTP or the scheduler.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import ErrorCode
from service.worker.backends.batch_io import batch_inputs, scatter
from service.worker.backends.tensor_batch import concat_rows, group_compatible, split_rows


@dataclass(slots=True)
class BackendContext:
    """What a backend is told about the model instance it serves."""

    model_name: str
    model_version: str
    model_dir: str  # the model directory (Triton's args['model_repository'])
    version_dir: str  # <model_dir>/<version>
    config: dict[str, Any]  # the normalized config as JSON (as the ModelConfig RPC returns it)
    config_json: str
    instance_name: str
    instance_kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int
    # set by the worker: lets backends issue requests to other models (BLS); None when unsupported
    bls: Any = None
    # run first by every thread the backend starts for the model (in-process instances route BLS calls by thread)
    thread_init: Callable[[], None] | None = None


RespondFn = Callable[..., None]  # (request, outputs, error, final, parameters[, model_error])


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
    # answered after execute() returns, through its response sender (a default-mode Python model may do that)
    deferred: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    rescheduled: bool = False  # released for rescheduling: its final (nothing in it) says so to the server

    def respond(
        self,
        outputs: dict[str, np.ndarray] | None = None,
        error: tuple[int, str] | None = None,
        final: bool = True,
        parameters: dict[str, Any] | None = None,
        model_error: bool = False,
    ) -> None:
        """Send a response (outputs or an (ErrorCode, message) error); outputs=None and error=None with
        final=True sends only the final flag (a decoupled model's empty final). `model_error`: the error is a
        response the model returned, which statistics count as a success (an exception is a failure)."""
        if model_error:
            self.responder(self, outputs, error, final, parameters, True)
        else:  # responders that never see model errors (other backends, tests) may take five arguments
            self.responder(self, outputs, error, final, parameters)

    def reschedule(self) -> None:
        """End this execution of the request without an answer: the server runs it again later (iterative
        sequences, pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)."""
        self.rescheduled = True
        self.respond(None, None, True)

    def fail(self, code: ErrorCode, message: str) -> None:
        """Send a final error response."""
        self.respond(None, (int(code), message), True)


class Backend(ABC):
    """A model instance's implementation inside a worker process."""

    #: whether execute() may return before every request has its final response (decoupled models)
    decoupled: bool = False
    #: whether the model defines its own readiness check (is_ready() then asks it)
    has_ready_fn: bool = False
    #: whether inputs in CUDA shared memory reach execute() as device arrays (cupy, no host copy) instead of
    #: numpy copies; read by the worker after initialize()
    device_inputs: bool = False
    #: the folder of a Python-based backend (--backend-directory DIR, DIR/<name>/model.py) whose model.py this
    #: class runs; "" for a built-in backend (set by load_backend_class)
    backend_dir: str = ""

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

    def is_ready(self) -> bool:
        """The model's own readiness check (asked on every model-ready probe when has_ready_fn)."""
        return True

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Return the config completed from the model itself (default: unchanged)."""
        return config


class BackendError(Exception):
    """A load or execution error whose message is already in Triton's words (reported without a type prefix)."""


class BatchingBackend(Backend):
    """Base for framework backends (pytorch, onnxruntime, tensorrt): one forward call per batch.

    `execute` groups the batch's requests by input shape (everything but dim 0), concatenates each group's
    inputs along dim 0 (`gather`, one write into a contiguous buffer the framework can use), calls `run`
    once per group, and splits every output back into per-request row ranges (numpy views, no copy).
    Models with max_batch_size 0 run one request at a time. Subclasses implement `run` and may override
    `gather` to write straight into framework-owned memory.
    """

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.max_batch_size = int(context.config.get("max_batch_size", 0) or 0)
        self.config_inputs: list[dict[str, Any]] = list(context.config.get("input", []))
        self.config_outputs: list[dict[str, Any]] = list(context.config.get("output", []))
        # config `reshape`: the model sees reshape.shape where clients see dims (Triton does this in its core)
        self.input_reshape = {
            t["name"]: [int(d) for d in t["reshape"].get("shape", [])] for t in self.config_inputs if "reshape" in t
        }
        self.output_reshape = {
            t["name"]: [int(d) for d in t.get("dims", [])] for t in self.config_outputs if "reshape" in t
        }
        # ragged batching (docs/ragged-batching.md): inputs concatenated as one 1-D tensor, inputs the batch makes,
        # outputs scattered back by an input's shapes
        self.ragged = frozenset(t["name"] for t in self.config_inputs if t.get("allow_ragged_batch"))
        self.batch_input_specs: list[dict[str, Any]] = list(context.config.get("batch_input", []))
        self.batch_input_names = [n for spec in self.batch_input_specs for n in spec.get("target_name", [])]
        self.scatter_outputs = {
            name: spec["source_input"][0]
            for spec in context.config.get("batch_output", [])
            if spec.get("source_input")
            for name in spec.get("target_name", [])
        }
        self._ragged_io = bool(self.ragged or self.batch_input_specs or self.scatter_outputs)

    @abstractmethod
    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """One forward call over gathered inputs holding `rows` batch rows; returns outputs by config name."""

    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        """The input `name` of a group, concatenated along dim 0 (a single part is passed through)."""
        return parts[0] if len(parts) == 1 else concat_rows(parts)

    def model_input_names(self) -> list[str]:
        """The inputs the model itself takes: the config's, then the batch inputs' targets."""
        return [t["name"] for t in self.config_inputs] + self.batch_input_names

    def execute(self, requests: list[WorkerRequest]) -> None:
        """Run each shape-compatible group of requests as one forward call and answer every request."""
        groups = [[r] for r in requests] if self.max_batch_size == 0 else group_compatible(requests, self.ragged)
        for group in groups:
            try:
                self._run_group(group)
            except Exception as e:
                message = str(e) if isinstance(e, BackendError) else f"{type(e).__name__}: {e}"
                for req in group:
                    if not req.closed:
                        req.fail(ErrorCode.INTERNAL, message)

    def _run_group(self, group: list[WorkerRequest]) -> None:
        first = group[0]
        names = list(first.inputs)
        if self.max_batch_size > 0 and names:
            # the batch dimension of a ragged input says the same, but other inputs are the usual witnesses
            witness = next((n for n in names if n not in self.ragged), names[0])
            sizes = [int(r.inputs[witness].shape[0]) for r in group]
        else:
            sizes = [1] * len(group)
        rows = sum(sizes)
        ragged = self.ragged
        inputs = {
            name: self.gather(
                name, [r.inputs[name].reshape(-1) for r in group] if name in ragged else [r.inputs[name] for r in group]
            )
            for name in names
        }
        if self.input_reshape:
            inputs = {
                n: self._reshape(a, self.input_reshape.get(n), rows) if n not in ragged else a
                for n, a in inputs.items()
            }
        if self.batch_input_specs:
            try:
                made = batch_inputs(self.batch_input_specs, group)
            except ValueError as e:
                raise BackendError(str(e)) from None
            inputs.update((name, self.gather(name, [value])) for name, value in made.items())
        outputs = self.run(inputs, rows)
        if self.output_reshape:
            outputs = {n: self._reshape(a, self.output_reshape.get(n), rows) for n, a in outputs.items()}
        if len(group) == 1 and not self._ragged_io:
            _respond(first, outputs)
            return
        pieces: dict[str, list[np.ndarray]] = {}
        for name, array in outputs.items():
            source = self.scatter_outputs.get(name)
            if source is not None:
                dims = next((list(map(int, t.get("dims", []))) for t in self.config_outputs if t["name"] == name), [])
                try:
                    pieces[name] = scatter(array, dims, source, group, self.max_batch_size > 0)
                except ValueError as e:
                    raise BackendError(f"output '{name}' of model '{self.context.model_name}': {e}") from None
                continue
            if array.ndim == 0 or array.shape[0] != rows:
                raise BackendError(
                    f"output '{name}' of model '{self.context.model_name}' has shape {list(array.shape)}; its "
                    f"first dimension must be the batch size {rows} to split it between {len(group)} requests"
                )
            pieces[name] = split_rows(array, sizes)
        for i, req in enumerate(group):
            _respond(req, {name: parts[i] for name, parts in pieces.items()})

    def _reshape(self, array: Any, shape: list[int] | None, rows: int) -> Any:
        if shape is None:
            return array
        return array.reshape([rows, *shape] if self.max_batch_size > 0 else shape)


def _respond(req: WorkerRequest, outputs: dict[str, np.ndarray]) -> None:
    wanted = req.requested_outputs
    if wanted:
        outputs = {name: array for name, array in outputs.items() if name in wanted}
    req.respond(outputs)


def check_tensor(
    model: str,
    kind: str,
    name: str,
    config_type: str,
    config_dims: list[int],
    model_type: str,
    model_shape: list[int],
    max_batch_size: int,
) -> None:
    """Compare a config tensor with what the model file reports (-1 = dynamic); BackendError naming both values.

    Types are config enum names (TYPE_FP32). With max_batch_size > 0 the model's shape includes the batch
    dimension, which must be dynamic; every other model dimension that is fixed must equal the config's.
    """
    if config_type != model_type:
        raise BackendError(
            f"unable to load model '{model}', configuration expects datatype {config_type} for {kind} '{name}', "
            f"model provides {model_type}"
        )
    full = ([-1, *config_dims]) if max_batch_size > 0 else list(config_dims)
    batch_note = (
        " (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
        f"complete shape {_dims(full)})"
        if max_batch_size > 0
        else f" (shape {_dims(full)})"
    )
    mismatch = len(full) != len(model_shape)
    if not mismatch and max_batch_size > 0 and model_shape[0] != -1:
        raise BackendError(
            f"unable to load model '{model}', {kind} '{name}' has a fixed first dimension {model_shape[0]} "
            f"(shape {_dims(model_shape)}), so the model does not support batching while max_batch_size is "
            f"{max_batch_size}"
        )
    if not mismatch:
        mismatch = any(m != -1 and m != c for m, c in zip(model_shape, full, strict=True))
    if mismatch:
        raise BackendError(
            f"model '{model}', tensor '{name}': the model expects {len(model_shape)} dimensions (shape "
            f"{_dims(model_shape)}) but the model configuration specifies {len(full)} dimensions{batch_note}"
        )


def _dims(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def config_parameter(config: dict[str, Any], key: str, default: str = "") -> str:
    """A model config `parameters` entry's string_value (`default` when absent)."""
    entry = config.get("parameters", {}).get(key)
    if not isinstance(entry, dict):
        return default
    return str(entry.get("string_value", default))


def instance_count(config: dict[str, Any]) -> int:
    """How many instances the config asks for across its instance groups (at least 1)."""
    total = 0
    for group in config.get("instance_group", []):
        total += max(1, int(group.get("count", 1) or 1)) * max(1, len(group.get("gpus", [])))
    return max(1, total)


def default_thread_count(config: dict[str, Any]) -> int:
    """Threads per instance so that all of the model's instances together use each core about once: the cores this
    process may run on (a host policy's cpu-cores pins the worker before the model loads)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS)
        cores = os.cpu_count() or 1
    return max(1, cores // instance_count(config))


# Triton's --backend-config=default-max-batch-size default: what auto-complete gives a batching model
DEFAULT_MAX_BATCH_SIZE = 4


# The built-in backends, the one list of them (docs/backends.md points here): backend name -> "module:Class",
# imported lazily so a worker only imports its own framework. Any other name is looked up as a Python-based
# backend, DIR/<name>/model.py under --backend-directory, and runs on the python backend.
BACKENDS: dict[str, str] = {
    "python": "service.worker.backends.python:PythonBackend",
    "pytorch": "service.worker.backends.pytorch:TorchBackend",
    "onnxruntime": "service.worker.backends.onnxruntime:OnnxBackend",
    "tensorrt": "service.worker.backends.tensorrt:TensorRTBackend",
    "fil": "service.worker.backends.fil:FilBackend",
    "openvino": "service.worker.backends.openvino:OpenVINOBackend",
    "tensorflow": "service.worker.backends.tensorflow:TensorFlowBackend",
}


def load_backend_class(name: str, backend_dir: str = "") -> type[Backend]:
    """Import the Backend class registered under `name`; ValueError when unknown.

    With `backend_dir` (the folder of a Python-based backend) it is the python backend bound to that folder.
    """
    target = BACKENDS["python"] if backend_dir else BACKENDS.get(name)
    if target is None:
        raise ValueError(f"unsupported backend '{name}' (supported: {', '.join(sorted(BACKENDS))})")
    module_name, class_name = target.split(":")
    backend_cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    if backend_dir:
        return type(f"{class_name}[{name}]", (backend_cls,), {"backend_dir": backend_dir})
    return backend_cls
