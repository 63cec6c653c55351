"""pb_utils.InferenceRequest (given to execute, or built for BLS), its response sender, BLS response iterators."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

from service.worker.pb_utils.dtypes import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)
from service.worker.pb_utils.errors import TritonModelException, incompatible_arguments
from service.worker.pb_utils.hooks import runtime
from service.worker.pb_utils.responses import InferenceResponse, _checked_parameters, _deliver
from service.worker.pb_utils.tensor import Tensor


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


_REQUEST_SIGNATURE = (
    "triton_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, *, "
    "inputs: list[Tensor], requested_output_names: list[str], model_name: str, model_version: int = -1, "
    "flags: int = 0, timeout: int = 0, preferred_memory: PreferredMemory = ..., trace: InferenceTrace = ..., "
    "parameters: object = None)"
)


def _check_request_types(args: tuple[Any, ...], preferred_memory: Any, trace: Any) -> None:
    """TypeError, as Triton's bindings raise it, for an argument of the wrong type (None where none is taken)."""
    request_id, correlation_id, inputs, names, model_name, model_version, flags, timeout = args
    ok = (
        isinstance(request_id, str)
        and correlation_id is not None
        and isinstance(inputs, list | tuple)
        and all(t is None or isinstance(t, Tensor) for t in inputs)
        and isinstance(names, list | tuple | set)
        and all(isinstance(n, str) for n in names)
        and isinstance(model_name, str)
        and all(isinstance(v, int) for v in (model_version, flags, timeout))
        and (preferred_memory is None or isinstance(preferred_memory, PreferredMemory))
        and (trace is None or isinstance(trace, InferenceTrace))
    )
    if not ok:
        raise incompatible_arguments("__init__()", _REQUEST_SIGNATURE, args)


class InferenceRequest:
    """A request given to execute(), or one a model builds to call another model (BLS)."""

    # The arguments are typed Any on purpose: the constructor checks them itself and raises Triton's TypeError or
    # TritonModelException (a compiled build would otherwise raise its own TypeError before the checks run).
    # Documented types: request_id str, correlation_id int | str, inputs list[Tensor] (required),
    # requested_output_names list[str] (required), model_name str (required), model_version/flags/timeout int.
    def __init__(
        self,
        request_id: Any = "",
        correlation_id: Any = 0,
        inputs: Any = None,
        requested_output_names: Any = None,
        model_name: Any = None,
        model_version: Any = -1,
        flags: Any = 0,
        timeout: Any = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        args = (request_id, correlation_id, inputs, requested_output_names, model_name, model_version, flags, timeout)
        _check_request_types(args, preferred_memory, trace)
        assert inputs is not None and requested_output_names is not None and model_name is not None
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        for tensor in inputs:
            if tensor is None:
                raise TritonModelException(
                    f"Input tensor for request with id '{request_id}' and model name '{model_name}' should not be "
                    "empty."
                )
        if "" in requested_output_names:
            raise TritonModelException(
                f"Requested output name for request with id '{request_id}' and model name '{model_name}' should "
                "not be empty."
            )
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
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
        """Release flags for when execute is done with this request: TRITONSERVER_REQUEST_RELEASE_RESCHEDULE runs
        it again in a later batch (models with `sequence_batching { iterative_sequence: true }`)."""
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


_CPU_MEMORY = PreferredMemory()  # what incoming requests carry (never changed: they have no setter for it)


def _incoming(
    request_id: str,
    correlation_id: int | str,
    inputs: list[Tensor],
    requested: list[str],
    model_name: str,
    flags: int,
    timeout: int,
    trace_id: int,
    parameters: dict[str, Any],
    worker_request: Any,
    decoupled: bool,
) -> InferenceRequest:
    """A request given to execute(): the same object the public constructor builds, without its argument checks
    and copies (the worker made every part of it: this runs once per request)."""
    r = InferenceRequest.__new__(InferenceRequest)
    r._request_id = request_id
    r._correlation_id = correlation_id
    r._inputs = inputs
    r._requested = requested
    r._model_name = model_name
    r._model_version = -1
    r._flags = flags
    r._timeout = timeout
    r._preferred_memory = _CPU_MEMORY
    trace = r._trace = InferenceTrace.__new__(InferenceTrace)
    trace.trace_id = trace_id
    trace._context = None
    r._parameters = parameters
    r._worker_request = worker_request
    r._sender = None
    r._decoupled = decoupled
    r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
    return r


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
