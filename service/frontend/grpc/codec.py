"""Pure translation between the gRPC protobuf messages and the core's types (no I/O, no scheduling)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from protos import grpc_service_pb2 as pb
from service.core.engine import IndexEntry, ModelMetadata
from service.core.observability.stats import DURATION_FIELDS, Duration, ModelStats
from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.grpc.large import SplitRequest
from service.frontend.grpc.params import set_param
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
from shm.tensor import DATATYPE_TO_NUMPY, serialize_bytes

ALLOWED_TRITON_KEYS = ("triton_enable_empty_final_response",)
# typed contents field per datatype (KServe v2 gRPC InferTensorContents)
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _request_params(msg: pb.ModelInferRequest, req: InferRequest) -> None:
    given = msg.parameters
    for key in given:  # keys then lookups: upb's map .items() iterates in Python (collections.abc), ~10x slower
        which, value = param_pair(given[key])
        apply_request_param(req, key, which, value)


def apply_request_param(req: InferRequest, key: str, which: str | None, value: Any) -> None:
    """One request-level InferParameter (`which`: its oneof field name, None when unset) applied to req; both
    ModelInfer decoders (protobuf's and wire.py's) call it."""
    if key == "sequence_id":
        if which != "int64_param" and which != "uint64_param" and which != "string_param":
            raise invalid_arg("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
        req.sequence_id = value
    elif key == "sequence_start" or key == "sequence_end":
        if which != "bool_param":
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
        if value:
            req.flags |= FLAG_SEQUENCE_START if key == "sequence_start" else FLAG_SEQUENCE_END
    elif key == "priority":
        if which == "int64_param":
            if value < 0:
                raise invalid_arg("invalid value for 'priority' parameter, expected a non-negative value.")
            req.priority = value
        elif which == "uint64_param":
            req.priority = value
        else:
            raise invalid_arg("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
    elif key == "timeout":
        if which != "int64_param":
            raise invalid_arg("invalid value type for 'timeout' parameter, expected int64_param.")
        req.timeout_us = value
    elif key.startswith("triton_"):
        if key not in ALLOWED_TRITON_KEYS:
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                f"starting with 'triton_' are allowed: {', '.join(ALLOWED_TRITON_KEYS)}"
            )
        if which != "bool_param":
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
        req.enable_empty_final = value
    else:
        if which == "uint64_param":
            raise invalid_arg(
                f"invalid value type for '{key}' parameter: uint64 is not supported for custom parameters."
            )
        if value is not None:
            req.parameters[key] = value


Param = tuple[str | None, Any]  # an InferParameter as (its oneof field name or None, its value)


def param_pair(p: pb.InferParameter) -> Param:
    """An InferParameter message as a Param."""
    which = p.WhichOneof("parameter_choice")
    return which, getattr(p, which) if which else None


def _given(params: Any, key: str) -> Param | None:
    p = params.get(key)
    return None if p is None else param_pair(p)


def _shm_params(params: Any, tensor: str) -> ShmRef | None:
    """A (not yet resolved) shared-memory reference from a tensor's protobuf parameters, or None."""
    if not params:
        return None
    return shm_ref(lambda key: _given(params, key), tensor)


def shm_ref(given: Callable[[str], Param | None], tensor: str) -> ShmRef | None:
    """A (not yet resolved) shared-memory reference from a tensor's shared_memory_* parameters (`given`: a
    parameter by key, None when not given), or None; both ModelInfer decoders (protobuf's and wire.py's) call it."""
    region = given("shared_memory_region")
    offset_p = given("shared_memory_offset")
    size_p = given("shared_memory_byte_size")
    if region is None:
        if offset_p is not None:
            raise invalid_arg(
                f"'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
                f"for tensor '{tensor}'"
            )
        if size_p is not None:
            raise invalid_arg(
                f"'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
                f"parameter for tensor '{tensor}'"
            )
        return None
    if region[0] != "string_param":
        raise invalid_arg(
            f"invalid value type for 'shared_memory_region' parameter for tensor '{tensor}', expected string_param."
        )
    if size_p is None:
        raise invalid_arg(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
            f"for tensor '{tensor}'"
        )
    which = size_p[0]
    if which != "int64_param" and which != "uint64_param":
        raise invalid_arg(
            f"invalid value type for 'shared_memory_byte_size' parameter for tensor '{tensor}', expected int64_param."
        )
    size: int = size_p[1]
    offset = 0
    if offset_p is not None:
        which = offset_p[0]
        if which != "int64_param" and which != "uint64_param":
            raise invalid_arg(
                f"invalid value type for 'shared_memory_offset' parameter for tensor '{tensor}', expected int64_param."
            )
        offset = offset_p[1]
    return unresolved_shm_ref(region[1], offset, size)


def classification(cls: Param | None, out: RequestedOutput) -> None:
    """An output's `classification` parameter (None: not given) applied to out, its shm reference set already."""
    if cls is None:
        return
    if out.shm is not None:
        raise invalid_arg("output can't set both 'shared_memory_region' and 'classification'")
    if cls[0] != "int64_param" and cls[0] != "uint64_param":
        raise invalid_arg(
            f"invalid value type for 'classification' parameter for output '{out.name}', expected int64_param."
        )
    out.classification = int(cls[1] or 0)


# the datatype each typed contents field carries (named in errors)
FIELD_DATATYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
# a request body that is not valid protobuf: the deserializer answers this instead of raising
UNPARSABLE: Any = object()


def _typed_contents(t: pb.ModelInferRequest.InferInputTensor, model: str) -> bytes:
    field = CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise invalid_arg(f"datatype '{t.datatype}' of input '{t.name}' cannot be sent as typed contents")
    present = [f.name for f, _ in t.contents.ListFields()]
    if present and present != [field]:
        if field in present:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{t.name}' for model '{model}', binary data "
                "was already supplied."
            )
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{t.name}' for model '{model}' of type "
            f"'{FIELD_DATATYPE[present[0]]}', expected datatype '{t.datatype}'"
        )
    values = getattr(t.contents, field)
    if t.datatype == "BYTES":
        return serialize_bytes(values)
    return np.asarray(values).astype(DATATYPE_TO_NUMPY[t.datatype], copy=False).tobytes()


def decode_infer_request(msg: pb.ModelInferRequest | SplitRequest | InferRequest) -> InferRequest:
    """ModelInferRequest -> InferRequest (request-level errors raise ServiceError INVALID_ARG).

    A large request arrives split (grpc_large.SplitRequest): its raw contents are views, never copied. A plain
    one arrives decoded already (wire.parse_small_request)."""
    raws: Any
    if isinstance(msg, InferRequest):
        return msg
    if isinstance(msg, SplitRequest):
        raws = msg.raws
        msg = msg.msg
    else:
        raws = msg.raw_input_contents
    req = InferRequest(msg.model_name, msg.model_version, msg.id)
    if msg.parameters:
        _request_params(msg, req)
    raw_count = len(raws)
    raw_index = 0
    inputs = req.inputs
    # indexing upb repeated fields and slicing `shape` avoid their Python-level iterators (per request, ~µs each)
    given = msg.inputs
    for i in range(len(given)):
        t = given[i]
        shape = t.shape[:]
        shm = _shm_params(t.parameters, t.name) if t.parameters else None
        has_contents = t.HasField("contents")
        if shm is not None:
            if has_contents:
                raise invalid_arg(
                    f"unexpected 'content' provided when using shared memory for input tensor '{t.name}' "
                    f"for model '{msg.model_name}'"
                )
            inputs.append(InputTensor(t.name, t.datatype, shape, None, shm))
            continue
        if has_contents:
            if raw_count:
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for '{t.name}' "
                    f"for model '{msg.model_name}'"
                )
            inputs.append(InputTensor(t.name, t.datatype, shape, _typed_contents(t, msg.model_name)))
            continue
        if raw_index >= raw_count:
            raise invalid_arg(
                f"unable to find data for input tensor '{t.name}' for model '{msg.model_name}' in request."
            )
        inputs.append(InputTensor(t.name, t.datatype, shape, raws[raw_index]))
        raw_index += 1
    if raw_index < raw_count:
        raise invalid_arg(
            f"raw_input_contents has {raw_count} entries but only {raw_index} inputs use raw data for "
            f"model '{msg.model_name}'"
        )
    wanted = msg.outputs
    for i in range(len(wanted)):
        o = wanted[i]
        out = RequestedOutput(o.name)
        if o.parameters:
            out.shm = _shm_params(o.parameters, o.name)
            classification(_given(o.parameters, "classification"), out)
        req.outputs.append(out)
    return req


def encode_infer_response(resp: InferResponse) -> pb.ModelInferResponse:
    """InferResponse -> ModelInferResponse: one raw_output_contents entry per output, empty for shm outputs."""
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    for name, value in resp.parameters.items():
        set_param(msg.parameters[name], value)
    outputs = msg.outputs
    raws = msg.raw_output_contents
    for o in resp.outputs:
        out = outputs.add(name=o.name, datatype=o.datatype, shape=o.shape)
        del out
        raws.append(bytes(o.data) if o.data is not None else b"")
    return msg


def encode_stream_response(resp: InferResponse, final_flag: bool = True) -> pb.ModelStreamInferResponse:
    """A streamed response with triton_final_response set; errors go in-band in error_message."""
    out = pb.ModelStreamInferResponse()
    if resp.error is not None:
        out.error_message = resp.error.message
        r = out.infer_response
        r.id, r.model_name, r.model_version = resp.id, resp.model_name, resp.model_version
    else:
        out.infer_response.CopyFrom(encode_infer_response(resp))
    if final_flag:
        out.infer_response.parameters["triton_final_response"].bool_param = resp.final
    return out


def metadata_response(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    """ModelMetadata -> ModelMetadataResponse."""
    msg = pb.ModelMetadataResponse(name=meta.name, versions=meta.versions, platform=meta.platform)
    for t in meta.inputs:
        msg.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    for t in meta.outputs:
        msg.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
    return msg


def _duration(target: pb.StatisticDuration, d: Duration) -> None:
    target.count, target.ns = d.count, d.ns


def statistics_response(rows: list[tuple[str, str, ModelStats]]) -> pb.ModelStatisticsResponse:
    """(name, version, stats) rows -> ModelStatisticsResponse with every field present."""
    msg = pb.ModelStatisticsResponse()
    for name, version, s in rows:
        m = msg.model_stats.add(
            name=name,
            version=version,
            last_inference=s.last_inference_ms,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
        )
        st = m.inference_stats
        for field in DURATION_FIELDS:
            _duration(getattr(st, field), getattr(s, field))
        for size, b in sorted(s.batch_stats.items()):
            bs = m.batch_stats.add(batch_size=size)
            _duration(bs.compute_input, b.compute_input)
            _duration(bs.compute_infer, b.compute_infer)
            _duration(bs.compute_output, b.compute_output)
    return msg


def index_response(rows: list[IndexEntry]) -> pb.RepositoryIndexResponse:
    """IndexEntry rows -> RepositoryIndexResponse."""
    msg = pb.RepositoryIndexResponse()
    for r in rows:
        msg.models.add(name=r.name, version=r.version, state=r.state, reason=r.reason)
    return msg


def error_to_service(e: Exception) -> ServiceError:
    """Any exception as a ServiceError (unexpected ones become INTERNAL)."""
    if isinstance(e, ServiceError):
        return e
    return ServiceError(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
