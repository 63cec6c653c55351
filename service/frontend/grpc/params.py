"""InferParameter values: read one, write one (shared by the codec and the large-message path)."""

from __future__ import annotations

from typing import Any

from protos import grpc_service_pb2 as pb
from service.types import ParamValue


def param_value(p: pb.InferParameter) -> ParamValue | None:
    """The Python value of an InferParameter (None when unset)."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def set_param(target: pb.InferParameter, value: Any) -> None:
    """Write value into the InferParameter field of its type (bool, int64, double, else string)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)
