"""Trireme's `triton_python_backend_utils`: the API unmodified Triton Python-backend models import as pb_utils.

The worker installs this module as `sys.modules["triton_python_backend_utils"]` before importing model.py.
Behaviour follows Triton's python_backend documentation (github.com/triton-inference-server/python_backend); the
implementation is our own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from service.worker.pb_utils.metrics import COUNTER, GAUGE, HISTOGRAM, Metric, MetricFamily  # noqa: F401 - pb_utils API
from shm.tensor import serialize_bytes_array

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_TRITON_INT_TO_NUMPY: dict[int, Any] = {
    1: bool,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}

_log = logging.getLogger("trireme.model")


class _Runtime:
    """Hooks the worker installs: the model dir and the BLS client (None until the worker sets them)."""

    model_dir: str = ""
    bls: Any = None


runtime = _Runtime()


# ---- helpers -----------------------------------------------------------------------------------------
def triton_string_to_numpy(triton_type_string: str) -> Any:
    """numpy type for a config type string such as 'TYPE_FP32'."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy type for a TRITONSERVER_DataType ordinal (1..13)."""
    return _TRITON_INT_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TRITONSERVER_DataType ordinal for a numpy type, or None."""
    if data_type in (np.object_, np.bytes_) or data_type is bytes:
        return 13
    for k, v in _TRITON_INT_TO_NUMPY.items():
        if v is data_type or (v is not bool and np.dtype(v) == np.dtype(data_type)):
            return k
    if np.dtype(data_type) == np.dtype(np.bool_):
        return 1
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Length-prefixed serialization of a BYTES tensor, as a uint8 numpy array (() for empty input)."""
    if input_tensor.size == 0:
        return ()
    return np.frombuffer(serialize_bytes_array(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    """1-D object array of bytes from a length-prefixed buffer."""
    raw = encoded_tensor.tobytes() if isinstance(encoded_tensor, np.ndarray) else bytes(encoded_tensor)
    from shm.tensor import deserialize_bytes

    items = deserialize_bytes(raw)
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor named `name`, or None."""
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output tensor named `name`, or None."""
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry of input `name`, or None."""
    for entry in model_config.get("input", []):
        if entry["name"] == name:
            return dict(entry)
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry of output `name`, or None."""
    for entry in model_config.get("output", []):
        if entry["name"] == name:
            return dict(entry)
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """True when the config declares the decoupled transaction policy."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_model_dir() -> str:
    """Directory of the running model.py (<model_dir>/<version>)."""
    return runtime.model_dir


# ---- errors ------------------------------------------------------------------------------------------
class TritonError:
    """An error a model attaches to a response; its code reaches the client as gRPC/HTTP status."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        """The error text."""
        return self._message

    def code(self) -> int:
        """The TritonError code."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail; a model may raise it too."""


# ---- tensors -----------------------------------------------------------------------------------------
class _Capsule:
    """Wraps a bare DLPack capsule so numpy.from_dlpack can consume it (CPU tensors only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A named tensor; CPU tensors are numpy arrays (views over shared memory for request inputs)."""

    def __init__(self, name: str, data: Any, *_: Any) -> None:
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if isinstance(data, Tensor):
            data = data.as_numpy()
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}': expected a numpy array, got {type(data).__name__}; use from_dlpack for "
                "framework tensors"
            )
        if data.dtype.kind in ("S", "U"):
            data = data.astype(np.object_)
        elif not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        self._name = name
        self._array = data

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor as a numpy array (BYTES as an object array of bytes)."""
        return self._array

    def triton_dtype(self) -> int:
        """TRITONSERVER_DataType ordinal."""
        if self._array.dtype.kind == "O":
            return 13
        return numpy_to_triton_type(self._array.dtype.type) or 0

    def shape(self) -> list[int]:
        """The shape as a list of ints."""
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        """False for GPU tensors (cupy arrays over a client's CUDA shm region), True otherwise."""
        return isinstance(self._array, np.ndarray)

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor (CPU)."""
        if self._array.dtype.kind == "O":
            raise TritonModelException("DLPack does not support BYTES tensors")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs) if kwargs else self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A Tensor from a DLPack capsule or any object with __dlpack__ (C-contiguous CPU data)."""
        source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        array = np.from_dlpack(source)
        if not array.flags.c_contiguous:
            raise TritonModelException("DLPack tensor is not contiguous. Only contiguous DLPack tensors are supported")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _tensor_from_input(name: str, array: np.ndarray) -> Tensor:
    """Wrap a request input without the checks/copies of the public constructor."""
    t = Tensor.__new__(Tensor)
    t._name = name
    t._array = array
    return t


def _checked_parameters(parameters: Any) -> dict[str, Any]:
    """Request/response parameters as a dict of str -> bool/int/str; other types raise Triton's messages."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):  # a JSON string, as parameters() returns it
        parameters = json.loads(parameters) if parameters else {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return dict(parameters)


# ---- responses ---------------------------------------------------------------------------------------
class InferenceResponse:
    """A model's answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = _checked_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return self._outputs

    def has_error(self) -> bool:
        """True when the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The error, or None."""
        return self._error

    def parameters(self) -> str:
        """Response parameters as a JSON string."""
        return json.dumps(self._parameters)


class InferenceResponseSender:
    """Sends responses for one request (decoupled models; default-mode models may send exactly one)."""

    def __init__(self, request: InferenceRequest, decoupled: bool) -> None:
        self._request = request
        self._decoupled = decoupled
        self._sent = 0
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send a response and/or the final flag (from any thread, also after execute returned)."""
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to 0."
            )
        worker_request = self._request._worker_request
        if worker_request is None:
            raise TritonModelException("this request has no response sender (it was not sent to the model)")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            self._check(response)
            if response is not None:
                self._sent += 1
            if final:
                self._closed = True
            if self._decoupled:
                _deliver(worker_request, response, final)
            elif response is not None:
                _deliver(worker_request, response, True)  # a default-mode model's one response ends the request

    def _check(self, response: InferenceResponse | None) -> None:
        if not self._decoupled and response is not None and self._sent:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send more than one response."
            )
        if not self._decoupled and response is None and not self._sent:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
            )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")

    def _take_returned(self, response: InferenceResponse) -> None:
        """Account for a response execute() returned for this request (it counts as sent with the final flag)."""
        with self._lock:
            self._check(response)
            self._sent += 1
            self._closed = True

    def _close(self) -> None:
        """Close after an error answered the request: later sends raise."""
        with self._lock:
            self._closed = True

    def is_cancelled(self) -> bool:
        """True when the client cancelled the request."""
        return self._request.is_cancelled()


def _deliver(worker_request: Any, response: InferenceResponse | None, final: bool) -> None:
    """Turn an InferenceResponse into the worker's respond() call."""
    if response is None:
        worker_request.respond(None, None, final, None)
        return
    err = response.error()
    if err is not None:
        worker_request.respond(None, (err.code(), err.message()), final, response._parameters or None, True)
        return
    outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
    worker_request.respond(outputs, None, final, response._parameters or None)


# ---- requests ----------------------------------------------------------------------------------------
class PreferredMemory:
    """Where a BLS caller prefers output tensors (CPU only without a GPU)."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """The server's trace of a request. Pass it to a BLS InferenceRequest (`trace=request.trace()`) so the
    called model's trace is recorded as a child of this one; a request that is not traced has trace_id 0."""

    def __init__(self, trace_id: int = 0, context: str | None = None) -> None:
        self.trace_id = trace_id
        self._context = context

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The OpenTelemetry context of the trace, when there is one (None otherwise)."""
        return self._context


class InferenceRequest:
    """A request given to execute(), or one a model builds to call another model (BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._trace = trace or InferenceTrace()
        self._parameters = _checked_parameters(parameters)
        self._worker_request: Any = None
        self._sender: InferenceResponseSender | None = None
        self._decoupled = False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return self._inputs

    def request_id(self) -> str:
        """The client's request id ('' when none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (0 when not in a sequence)."""
        return self._correlation_id

    def flags(self) -> int:
        """Sequence flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START/END)."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Set the request flags (BLS)."""
        self._flags = flags

    def timeout(self) -> int:
        """Timeout in microseconds (0 = none)."""
        return self._timeout

    def parameters(self) -> str:
        """Request parameters as a JSON string."""
        return json.dumps(self._parameters)

    def trace(self) -> InferenceTrace:
        """The request's trace handle."""
        return self._trace

    def model_name(self) -> str:
        """Target model of a BLS request."""
        return self._model_name

    def requested_output_names(self) -> list[str]:
        """Names of the outputs the client asked for (all outputs when it asked for none)."""
        return self._requested

    def get_response_sender(self) -> InferenceResponseSender:
        """The response sender of this request (one per request)."""
        if self._sender is None:
            self._sender = InferenceResponseSender(self, self._decoupled)
        return self._sender

    def is_cancelled(self) -> bool:
        """True when the client cancelled this request."""
        return bool(self._worker_request is not None and self._worker_request.cancelled)

    def set_release_flags(self, flags: int) -> None:
        """Record the release flags (rescheduling is not supported: RELEASE_ALL is assumed)."""
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model (BLS) and return its response (or an iterator if decoupled)."""
        if runtime.bls is None:
            raise TritonModelException("BLS requests are not supported by this server build")
        return runtime.bls.execute(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """Awaitable exec(): runs in the event loop's default executor so asyncio.gather works."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.exec, decoupled)


class ResponseIterator:
    """Iterator over the responses of a decoupled BLS call."""

    def __init__(self, source: Iterator[InferenceResponse], cancel: Any = None) -> None:
        self._source = source
        self._cancel = cancel

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._source)

    def __aiter__(self) -> ResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        """`async for` over the responses: each wait runs in the loop's default executor."""
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(None, next, self._source, None)
        if response is None:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        """Ask the server to cancel the BLS request."""
        if self._cancel is not None:
            self._cancel()


# ---- logging, model control (metrics are in pb_utils/metrics.py) ---------------------------------------
class Logger:
    """Model logging through the worker's log (reaches the server's output)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(msg: str, level: int = 0) -> None:
        """Log at a Logger level."""
        _log.log(Logger._LEVELS.get(level, logging.INFO), "%s", msg)

    @staticmethod
    def log_info(msg: str) -> None:
        """Log at INFO."""
        _log.info("%s", msg)

    @staticmethod
    def log_warn(msg: str) -> None:
        """Log at WARNING."""
        _log.warning("%s", msg)

    @staticmethod
    def log_error(msg: str) -> None:
        """Log at ERROR."""
        _log.error("%s", msg)

    @staticmethod
    def log_verbose(msg: str) -> None:
        """Log at VERBOSE."""
        _log.debug("%s", msg)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load a model from a model (explicit model control)."""
    if runtime.bls is None or not hasattr(runtime.bls, "load_model"):
        raise TritonModelException("model control from a model is not supported by this server build")
    runtime.bls.load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model from a model (explicit model control)."""
    if runtime.bls is None or not hasattr(runtime.bls, "unload_model"):
        raise TritonModelException("model control from a model is not supported by this server build")
    runtime.bls.unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether another model is ready."""
    if runtime.bls is None or not hasattr(runtime.bls, "is_model_ready"):
        raise TritonModelException("model readiness queries are not supported by this server build")
    return bool(runtime.bls.is_model_ready(model_name, model_version))


# ---- auto-complete -----------------------------------------------------------------------------------
class ModelConfig:
    """The config handed to auto_complete_config; edits build the completed config."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._model_config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        )

    def as_dict(self) -> dict[str, Any]:
        """The config as a dict."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size unless the config already has a larger non-zero one."""
        current = int(self._model_config.get("max_batch_size", 0))
        if current != 0 and current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._model_config.get('name', '')}' specified max_batch_size "
                f"{max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Enable dynamic batching (not allowed with sequence batching or ensembles)."""
        cfg = self._model_config
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in cfg:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    "function for model '" + cfg.get("name", "") + "' tries to set scheduling_choice as "
                    "'dynamic_batching'"
                )
        cfg.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: set[str]) -> None:
        extra = set(tensor) - allowed
        if extra:
            raise ValueError(
                f"{kind} '{tensor.get('name', '')}' in auto-complete-config has unexpected keys {sorted(extra)}"
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config must have 'name'")
        entries = self._model_config.setdefault(kind, [])
        for entry in entries:
            if entry.get("name") == tensor["name"]:
                for key in ("data_type", "dims"):
                    if (
                        key in tensor
                        and key in entry
                        and entry[key] not in ("TYPE_INVALID", [])
                        and entry[key] != tensor[key]
                    ):
                        raise ValueError(
                            f"unable to load model '{self._model_config.get('name', '')}', configuration expects "
                            f"{key} {entry[key]} for {kind} '{tensor['name']}', model provides {tensor[key]}"
                        )
                entry.update(tensor)
                return
        entries.append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        """Add (or merge) an input entry: name, data_type, dims[, optional]."""
        self._add_tensor("input", input, {"name", "data_type", "dims", "optional"})

    def add_output(self, output: dict[str, Any]) -> None:
        """Add (or merge) an output entry: name, data_type, dims."""
        self._add_tensor("output", output, {"name", "data_type", "dims"})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set model_transaction_policy, e.g. {"decoupled": True}."""
        self._model_config["model_transaction_policy"] = dict(transaction_policy_dict)


# Trireme extension (opt-in): stacked-batch execute helpers, see docs/batching.md.
from service.worker.pb_utils.batching import batched, execute_batched  # noqa: E402, F401
