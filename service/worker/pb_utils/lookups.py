"""pb_utils lookups: a tensor of a request or response by name, a config entry by name, the transaction policy."""

from __future__ import annotations

from typing import Any

from service.worker.pb_utils.requests import InferenceRequest
from service.worker.pb_utils.responses import InferenceResponse
from service.worker.pb_utils.tensor import Tensor


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor named `name`, or None."""
    for t in inference_request._inputs:  # the attributes, not the accessors: models call this per request
        if t._name == name:
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
