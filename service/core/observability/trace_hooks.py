"""Where a traced request gets its core timestamps and tensor records (called only for traced requests)."""

from __future__ import annotations

from typing import Any

from service.core.observability.tracer import TENSOR_BACKEND_OUTPUT, TENSOR_QUEUE_INPUT, Trace
from service.types import InferRequest, InferResponse, ResponseCallback


def _array(data: Any, datatype: str, shape: list[int]) -> Any:
    from shm.views import buffer_to_numpy

    try:
        return buffer_to_numpy(data, datatype, shape)
    except Exception:  # a record of what was sent; never fail the request over it
        return None


def queued(trace: Trace, request: InferRequest, model_version: int) -> None:
    """The request is valid and about to enter its scheduler's queue."""
    trace.model_version = model_version
    trace.request_id = request.id
    trace.stamp("QUEUE_START")
    if trace.with_tensors:
        for t in request.inputs:
            data = _array(t.data, t.datatype, t.shape) if t.data is not None else None
            trace.tensor(TENSOR_QUEUE_INPUT, t.name, t.datatype, t.shape, data)


def answering(trace: Trace, deliver: ResponseCallback) -> ResponseCallback:
    """Wrap a response callback: output tensors per response, REQUEST_END on the final one.

    Traces of ensemble steps and BLS calls end there; a front end finishes its own (after its send stamps).
    """

    def on_response(response: InferResponse) -> None:
        if trace.with_tensors:
            for o in response.outputs:
                data = _array(o.data, o.datatype, o.shape) if o.data is not None else None
                trace.tensor(TENSOR_BACKEND_OUTPUT, o.name, o.datatype, o.shape, data)
        if response.final:
            trace.stamp("REQUEST_END")
            if trace.parent is not None:
                trace.finish()
        deliver(response)

    return on_response


def computed(trace: Trace, start_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
    """The execution that served this request, from its dispatch and the durations the worker measured.

    Deriving the stamps from those durations keeps a trace's compute spans equal to ModelStatistics' figures;
    the hand-off to and from the worker shows as the gaps QUEUE_START..COMPUTE_START and COMPUTE_END..REQUEST_END.
    """
    trace.stamp("COMPUTE_START", start_ns)
    trace.stamp("COMPUTE_INPUT_END", start_ns + input_ns)
    trace.stamp("COMPUTE_OUTPUT_START", start_ns + input_ns + infer_ns)
    trace.stamp("COMPUTE_END", start_ns + input_ns + infer_ns + output_ns)
