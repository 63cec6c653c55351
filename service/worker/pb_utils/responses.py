"""pb_utils.InferenceResponse, the parameter checks requests and responses share, and delivery to the worker."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from service.worker.pb_utils.errors import TritonError, TritonModelException, incompatible_arguments
from service.worker.pb_utils.tensor import Tensor


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


_SIGNATURE = (
    "triton_python_backend_utils.InferenceResponse(output_tensors: list[Tensor] = [], error: TritonError = None, "
    "parameters: object = None)"
)


def _check_output(tensor: object, args: tuple[object, ...]) -> None:
    if tensor is None:
        raise TritonModelException("Output tensor for inference response should not be empty.")
    if not isinstance(tensor, Tensor):
        raise incompatible_arguments("__init__()", _SIGNATURE, args)


class InferenceResponse:
    """A model's answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None or isinstance(output_tensors, str):
            raise incompatible_arguments("__init__()", _SIGNATURE, (output_tensors, error, parameters))
        self._outputs = outputs = list(output_tensors)
        for t in outputs:  # runs per response: a class check per tensor
            if t.__class__ is not Tensor:
                _check_output(t, (output_tensors, error, parameters))
        self._error = error
        self._parameters = {} if parameters is None else _checked_parameters(parameters)

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


def _deliver(worker_request: Any, response: InferenceResponse | None, final: bool) -> None:
    """Turn an InferenceResponse into the worker's respond() call (WorkerRequest.respond's responder, called
    directly: this runs per response)."""
    if response is None:
        worker_request.responder(worker_request, None, None, final, None)
        return
    err = response._error
    if err is not None:
        # an error response the model returned: statistics count the request as a success (as Triton)
        error = (err.code(), err.message())
        worker_request.responder(worker_request, None, error, final, response._parameters or None, True)
        return
    outputs = {}
    for t in response._outputs:  # a loop over the attributes: this runs per response
        outputs[t._name] = t._array
    worker_request.responder(worker_request, outputs, None, final, response._parameters or None)
