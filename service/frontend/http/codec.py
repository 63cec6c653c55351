"""Pure translation between HTTP/REST inference bodies (JSON + binary tensor extension) and the core's types.

A request body is a JSON header optionally followed by the raw bytes of the inputs that declare
`binary_data_size`, in input order; `Inference-Header-Content-Length` gives the header's length (0 means the
whole body is the data of the model's single input). A response is JSON, or JSON followed by the bytes of the
outputs sent as binary (`binary_data_size` in their parameters). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from service.core.engine import TensorMetadata
from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.http.json_tensors import json_data_to_bytes, json_output_data
from service.frontend.http.util import check_json_depth
from service.types import (
    FLAG_SEQUENCE_END,
    FLAG_SEQUENCE_START,
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
    ShmRef,
    unresolved_shm_ref,
)
from shm.tensor import ELEMENT_SIZE, element_count, serialize_bytes

INFER_HEADER = "Inference-Header-Content-Length"
# output-size guard: JSON text takes 5-20 bytes per element, so a large output is refused as JSON (binary is fine)
MAX_JSON_OUTPUT_BYTES = 64 << 20
# request parameter names with a meaning of their own (Triton's reserved keys, plus the 'triton_' prefix)
RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)
_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY
_ONE_OF = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
    "'shared_memory_region' in 'parameters'."
)


@dataclass(slots=True)
class OutputChoice:
    """How each output travels back: binary (True) or JSON (False); `default` for outputs not listed."""

    default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)


def parse_json(data: bytes | memoryview) -> Any:
    """orjson.loads; a body that is not JSON is answered as Triton does (500, 'failed to parse ...'), one that
    nests deeper than Triton's limit is 400."""
    check_json_depth(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ServiceError(ErrorCode.INTERNAL, f"failed to parse the request JSON buffer: {e}") from None


def _uint(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_arg(f"Unable to parse '{what}': expected an unsigned integer, got {orjson.dumps(value).decode()}")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise invalid_arg(f"Unable to parse '{what}': expected a boolean, got {orjson.dumps(value).decode()}")
    return value


def _request_params(params: Any, req: InferRequest, choice: OutputChoice) -> None:
    if not isinstance(params, dict):
        raise invalid_arg("failed to get request params: 'parameters' must be a JSON object")
    for key, value in params.items():
        if key == "sequence_id":
            if isinstance(value, str):
                req.sequence_id = value
            else:
                req.sequence_id = _uint(value, "sequence_id")
        elif key == "sequence_start":
            if _bool(value, key):
                req.flags |= FLAG_SEQUENCE_START
        elif key == "sequence_end":
            if _bool(value, key):
                req.flags |= FLAG_SEQUENCE_END
        elif key == "priority":
            req.priority = _uint(value, key)
        elif key == "timeout":
            req.timeout_us = _uint(value, key)
        elif key == "binary_data_output":
            choice.default = _bool(value, key)
        elif key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        elif isinstance(value, bool | int | float | str):
            req.parameters[key] = value
        else:
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', 'double' or 'string'."
            )


def _shm_ref(params: dict[str, Any], tensor: str) -> ShmRef | None:
    """A (not yet resolved) shared-memory reference from tensor parameters, or None."""
    region = params.get("shared_memory_region")
    if region is None:
        for key in ("shared_memory_offset", "shared_memory_byte_size"):
            if key in params:
                raise invalid_arg(
                    f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{tensor}'"
                )
        return None
    if not isinstance(region, str):
        raise invalid_arg(f"Unable to parse 'shared_memory_region' for tensor '{tensor}': expected a string")
    if "shared_memory_byte_size" not in params:
        raise invalid_arg(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            f"'{tensor}'"
        )
    size = _uint(params["shared_memory_byte_size"], "shared_memory_byte_size")
    offset = _uint(params.get("shared_memory_offset", 0), "shared_memory_offset")
    return unresolved_shm_ref(region, offset, size)


INT64_MAX = (1 << 63) - 1


def _shape(value: Any, name: str, datatype: str) -> list[int]:
    """A request input's shape, checked as Triton 2.73 checks it: non-negative integers whose element count and
    byte size fit in int64."""
    if not isinstance(value, list):
        raise invalid_arg(f"Unable to parse 'shape' of input '{name}': expected an array of integers")
    count, negative = 1, False
    for d in value:  # one loop, no generators: this runs for every input of every request
        if type(d) is not int:  # bool is not an int here, nor is anything else JSON can hold
            raise invalid_arg(f"Unable to parse 'shape' of input '{name}': expected an array of integers")
        if d < 0:
            negative = True
        count *= d
    if negative:
        raise ServiceError(
            ErrorCode.INTERNAL,
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
        )
    if count > INT64_MAX:
        raise invalid_arg(
            f"shape {value} of input '{name}' causes total element count to exceed maximum size of {INT64_MAX}"
        )
    if count * ELEMENT_SIZE.get(datatype, 1) > INT64_MAX:
        raise invalid_arg(f"byte size overflow for input '{name}': shape {value} of {datatype} exceeds {INT64_MAX}")
    return value


def decode_infer(
    header: Any, binary: memoryview, model: str, version: str, has_header: bool
) -> tuple[InferRequest, OutputChoice]:
    """Request JSON (+ the binary section after it) -> InferRequest and the output encoding choices.

    `has_header` tells whether Inference-Header-Content-Length was sent (binary data needs it).
    """
    if not isinstance(header, dict):
        raise invalid_arg("Unable to parse the request: the JSON body must be an object")
    rid = header.get("id", "")
    if not isinstance(rid, str):
        raise invalid_arg("Unable to parse 'id': expected a string")
    req = InferRequest(model, version, rid)
    choice = OutputChoice()
    params = header.get("parameters")
    if params:
        _request_params(params, req, choice)
    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        raise invalid_arg("Unable to parse 'inputs': expected an array")
    pos, end = 0, len(binary)
    for t in inputs:
        if not isinstance(t, dict):
            raise invalid_arg("Unable to parse 'inputs': each input must be an object")
        name, datatype = t.get("name"), t.get("datatype")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise invalid_arg("Unable to parse 'inputs': every input needs a string 'name' and 'datatype'")
        shape = _shape(t.get("shape"), name, datatype)
        tparams = t.get("parameters") or {}
        if not isinstance(tparams, dict):
            raise invalid_arg(f"Unable to parse 'parameters' of input '{name}': expected an object")
        shm = _shm_ref(tparams, name) if tparams else None
        size = tparams.get("binary_data_size")
        has_data = "data" in t
        if (shm is not None) + (size is not None) + has_data != 1:
            raise invalid_arg(f"{_ONE_OF} But input '{name}' sets {_which(has_data, size, shm)}")
        if shm is not None:
            req.inputs.append(InputTensor(name, datatype, shape, None, shm))
        elif size is not None:
            size = _uint(size, "binary_data_size")
            if not has_header:
                raise invalid_arg(
                    "must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' when "
                    "passing inputs in binary data format"
                )
            if pos + size > end:
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {size - (end - pos)} additional bytes for model "
                    f"'{model}'"
                )
            req.inputs.append(InputTensor(name, datatype, shape, binary[pos : pos + size]))
            pos += size
        else:
            req.inputs.append(InputTensor(name, datatype, shape, json_data_to_bytes(name, datatype, shape, t["data"])))
    if pos != end:
        raise invalid_arg(f"unexpected additional input data for model '{model}'")
    outputs = header.get("outputs")
    if outputs is not None:
        _decode_outputs(outputs, req, choice)
    return req, choice


def _which(has_data: bool, size: Any, shm: Any) -> str:
    named = [
        n
        for n, on in (
            ("'data'", has_data),
            ("'binary_data_size'", size is not None),
            ("'shared_memory_region'", shm is not None),
        )
        if on
    ]
    return " and ".join(named) if named else "none of them"


def _decode_outputs(outputs: Any, req: InferRequest, choice: OutputChoice) -> None:
    if not isinstance(outputs, list):
        raise invalid_arg("Unable to parse 'outputs': expected an array")
    for o in outputs:
        name = o.get("name") if isinstance(o, dict) else None
        if not isinstance(name, str):
            raise invalid_arg("Unable to parse 'outputs': every output needs a string 'name'")
        out = RequestedOutput(name)
        params = o.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid_arg(f"Unable to parse 'parameters' of output '{name}': expected an object")
        out.shm = _shm_ref(params, name) if params else None
        binary = params.get("binary_data")
        cls = params.get("classification")
        if out.shm is not None and (binary or cls):
            raise invalid_arg(
                f"Output '{name}' can't set both 'shared_memory_region' and 'binary_data' or 'classification'"
            )
        if cls is not None:
            out.classification = _uint(cls, "classification")
        if binary is not None:
            choice.binary[name] = _bool(binary, "binary_data")
        req.outputs.append(out)


def decode_raw(
    body: memoryview, model: str, version: str, inputs: list[TensorMetadata], max_batch: bool
) -> tuple[InferRequest, OutputChoice]:
    """A raw binary request (header length 0): the body is the data of the model's only input, batch 1."""
    if len(inputs) != 1:
        raise invalid_arg(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} inputs in "
            f"'{model}' model configuration"
        )
    meta = inputs[0]
    dims = list(meta.shape[1:] if max_batch else meta.shape)
    size = ELEMENT_SIZE.get(meta.datatype)
    if meta.datatype == "BYTES":
        if -1 in dims or element_count(dims) != 1:
            raise invalid_arg(f"For BYTE datatype raw input '{meta.name}', the model must have input shape [1]")
        data: bytes | memoryview = serialize_bytes([bytes(body)])
    else:
        if size is None:
            raise invalid_arg(f"invalid datatype '{meta.datatype}' of input '{meta.name}'")
        variable = [i for i, d in enumerate(dims) if d == -1]
        if len(variable) > 1:
            raise invalid_arg(
                f"The shape of the raw input '{meta.name}' can not be deduced because there are more than one "
                "variable-sized dimension"
            )
        fixed = element_count([d for d in dims if d != -1]) * size
        if variable:
            if fixed == 0 or len(body) % fixed:
                raise invalid_arg(f"Raw request data of {len(body)} bytes does not fit input '{meta.name}'")
            dims[variable[0]] = len(body) // fixed
        data = body
    shape = [1, *dims] if max_batch else dims
    return InferRequest(model, version, inputs=[InputTensor(meta.name, meta.datatype, shape, data)]), OutputChoice(True)


# ---- responses -----------------------------------------------------------------------------------------------
def encode_response(resp: InferResponse, choice: OutputChoice) -> tuple[bytes, int]:
    """InferResponse -> (body, JSON header length); the header length is -1 when the body is all JSON."""
    out: dict[str, Any] = {}
    if resp.id:
        out["id"] = resp.id
    out["model_name"] = resp.model_name
    out["model_version"] = resp.model_version
    if resp.parameters:
        out["parameters"] = resp.parameters
    blobs: list[bytes | memoryview] = []
    outputs = []
    binary = choice.binary
    default = choice.default
    for o in resp.outputs:
        entry: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": o.shape}
        data = o.data
        if data is None:
            pass  # written into the client's shared-memory region
        elif binary.get(o.name, default):
            entry["parameters"] = {"binary_data_size": len(data)}
            if len(data):
                blobs.append(data)
        else:
            if len(data) > MAX_JSON_OUTPUT_BYTES:
                raise invalid_arg(
                    f"output '{o.name}' holds {len(data)} bytes, more than the {MAX_JSON_OUTPUT_BYTES} that can be "
                    "returned as JSON; request it as binary data (output parameter 'binary_data': true)"
                )
            entry["data"] = json_output_data(o.name, o.datatype, data, element_count(o.shape))
        outputs.append(entry)
    out["outputs"] = outputs
    try:
        header = orjson.dumps(out, option=_NUMPY_OPTS)
    except TypeError:  # e.g. a numpy array orjson cannot take as is (unaligned): go through lists
        for entry in outputs:
            if isinstance(entry.get("data"), np.ndarray):
                entry["data"] = entry["data"].tolist()
        header = orjson.dumps(out)
    if not blobs:
        return header, -1
    return b"".join([header, *blobs]), len(header)
