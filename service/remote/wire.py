"""What travels between a front-end process and the core process: length-prefixed pickle frames of plain tuples.

Both ends are processes of one server started from the same interpreter and code, over a private Unix socket, so
pickle is safe here, and it carries the admin results (protobuf ModelConfig, statistics, index rows, shm region
status) with no converter per type. msgspec-msgpack is faster per frame (a 16-float request tuple: pickle
dumps + loads 1.9 µs, msgspec 0.8 µs), about 4 µs per request over four frames, under 3 % of what the hop costs
(docs/benchmarks.md): a possible later step for the request and response frames only.
Requests and responses are flattened to tuples (no callbacks, no per-request bookkeeping). Tensor bytes go through
`place` on the way out and `resolve` on the way in: inline by default, large ones as references to a block of
the sender's arena with service/remote/tensors.py. Client shared-memory inputs and outputs travel as their region
references (resolved by the core's registry).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from typing import Any

from service.errors import ErrorCode, ServiceError
from service.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput
from shm.errors import ShmError

HEADER = struct.Struct("<I")
PROTOCOL = pickle.HIGHEST_PROTOCOL


def frame(message: Any) -> bytes:
    """One frame: 4-byte little-endian length, then the pickled message."""
    body = pickle.dumps(message, PROTOCOL)
    return HEADER.pack(len(body)) + body


def _bytes(data: Any) -> bytes | None:
    return None if data is None else bytes(data)


def _same(data: Any) -> Any:
    return data


def pack_request(r: InferRequest, trace: tuple | None = None, place: Callable[[Any], Any] = _bytes) -> tuple:
    """The fields of a request the core needs (not its callbacks or scheduler bookkeeping); `trace`: what the
    front end's tracing hands on (service/remote/tracing.py), read by the core with `forwarded_trace`; `place`:
    what the frame carries for each input's bytes."""
    return (
        r.model_name,
        r.model_version,
        r.id,
        [(i.name, i.datatype, i.shape, place(i.data), i.shm) for i in r.inputs],
        [(o.name, o.shm, o.classification) for o in r.outputs],
        r.parameters,
        r.sequence_id,
        r.flags,
        r.priority,
        r.timeout_us,
        r.enable_empty_final,
        r.stamps is not None,
        trace,
    )


def forwarded_trace(t: tuple) -> tuple | None:
    """The tracing part of a packed request (None: the front end's tracing was off)."""
    result: tuple | None = t[-1]
    return result


def unpack_request(t: tuple, resolve: Callable[[Any], Any] = _same) -> InferRequest:
    """pack_request's inverse (`resolve`: place's inverse)."""
    name, version, rid, inputs, outputs, params, seq, flags, prio, timeout, empty_final, stamped, _ = t
    return InferRequest(
        name,
        version,
        rid,
        [InputTensor(n, d, s, resolve(data), shm) for n, d, s, data, shm in inputs],
        [RequestedOutput(n, shm, c) for n, shm, c in outputs],
        params,
        seq,
        flags,
        prio,
        timeout,
        empty_final,
        stamps=[] if stamped else None,
    )


def pack_response(r: InferResponse, place: Callable[[Any], Any] = _bytes) -> tuple:
    """A response as a tuple; `place`: what the frame carries for each output's bytes (never a view of the
    worker's arena: that is not the front end's)."""
    err = None if r.error is None else pack_error(r.error)
    outputs = [(o.name, o.datatype, o.shape, place(o.data)) for o in r.outputs]
    return (r.model_name, r.model_version, r.id, outputs, r.parameters, err, r.final, r.null, r.model_error)


def unpack_response(t: tuple, resolve: Callable[[Any], Any] = _same) -> InferResponse:
    """pack_response's inverse (`resolve`: place's inverse)."""
    name, version, rid, outputs, params, err, final, null, model_error = t
    return InferResponse(
        name,
        version,
        rid,
        [OutputTensor(n, d, s, resolve(data)) for n, d, s, data in outputs],
        params,
        None if err is None else _service_error(err),
        final,
        null,
        model_error,
    )


def _service_error(t: tuple) -> ServiceError:
    e = unpack_error(t)
    return e if isinstance(e, ServiceError) else ServiceError(ErrorCode.INTERNAL, str(e))


def pack_error(e: BaseException) -> tuple:
    """An exception as (kind, code, message): the front end raises the same type with the same code and text."""
    if isinstance(e, ServiceError):
        return ("service", int(e.code), e.message)
    if isinstance(e, ShmError):
        return ("shm", e.code, e.message)
    if isinstance(e, ValueError):
        return ("value", 0, str(e))
    return ("service", int(ErrorCode.INTERNAL), str(e) or type(e).__name__)


def unpack_error(t: tuple) -> Exception:
    """pack_error's inverse."""
    kind, code, message = t
    if kind == "shm":
        return ShmError(code, message)
    if kind == "value":
        return ValueError(message)
    return ServiceError(ErrorCode(code), message)
