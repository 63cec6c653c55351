"""Control messages between the server and a worker process: small msgpack frames, tensors by reference.

A frame is a 4-byte little-endian length followed by one msgpack-encoded message. Tensor payloads travel
inline only when small (INLINE_LIMIT); larger ones live in a shared-memory arena or in the client's own
registered region, and the frame carries (offset, nbytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgspec

HEADER = struct.Struct("<I")
INLINE_LIMIT = 64 * 1024  # below this, copying through the socket beats allocating arena space

# where a tensor's bytes are
WHERE_INLINE = 0
WHERE_ARENA = 1  # the sender's arena (input arena parent->worker, output arena worker->parent)
WHERE_SYSTEM_SHM = 2  # a client's POSIX segment: key + offset
WHERE_CUDA_SHM = 3  # a client's CUDA IPC region: raw handle + device + offset


# The per-request messages (TensorMsg, OutputSpec, RequestMsg, Execute, Respond, ExecDone) are gc=False: they hold
# only scalars, bytes and containers of each other, never a reference back, so they can be in no reference cycle;
# untracked, each costs the collector nothing when it is made, decoded and freed (twice per request per side).


class TensorMsg(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A tensor reference: name, datatype, shape and where its bytes are."""

    name: str
    datatype: str
    shape: list[int]
    where: int = WHERE_INLINE
    data: bytes = b""  # inline payload
    offset: int = 0
    nbytes: int = 0
    key: str = ""  # client segment key (system) or "" (cuda)
    handle: bytes = b""  # cudaIpcMemHandle_t for cuda regions
    device: int = 0
    path: str = ""  # system: where to open the registered segment (the key may be unlinked); "" = /dev/shm/key


class OutputSpec(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A requested output; `shm` set when the worker must write it into a client region."""

    name: str
    shm: TensorMsg | None = None


class RequestMsg(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One inference request of a batch as the worker sees it."""

    rid: int
    id: str
    inputs: list[TensorMsg]
    outputs: list[OutputSpec]
    parameters: dict[str, Any] = {}
    flags: int = 0
    correlation_id: int | str = 0
    timeout_us: int = 0
    trace_id: int = 0  # the server's trace of this request (0: not traced); BLS calls may name it as parent


class Init(msgspec.Struct, tag="init", array_like=True):
    """First message to a worker: what to load and where its arenas are."""

    backend: str
    model_name: str
    model_version: str
    model_dir: str  # the model directory (Triton's args['model_repository'])
    version_dir: str
    config_json: str
    instance_name: str
    instance_kind: str
    device_id: int
    in_arena: str
    out_arena: str
    out_arena_size: int
    log_verbose: int = 0
    arena_growth_bytes: int = 64 << 20  # the step either side grows an arena by when a tensor does not fit
    backend_dir: str = ""  # a Python-based backend's folder (DIR/<name> of --backend-directory); "" = built-in


class AutoComplete(msgspec.Struct, tag="autocomplete", array_like=True):
    """Ask a short-lived worker to run the model's auto_complete_config and return the JSON config."""

    backend: str
    model_dir: str
    version_dir: str
    config_json: str
    backend_dir: str = ""  # as in Init


class Execute(msgspec.Struct, tag="exec", array_like=True, gc=False):
    """Run one batch."""

    batch_id: int
    requests: list[RequestMsg]


class Release(msgspec.Struct, tag="release", array_like=True):
    """The parent is done with these output-arena offsets."""

    offsets: list[int]


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    """The client cancelled these requests."""

    rids: list[int]


class Unmap(msgspec.Struct, tag="unmap", array_like=True):
    """Client shm segments (keys) that were unregistered and are no longer used: drop cached mappings."""

    keys: list[str]


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    """Finalize the model and exit."""


class Ready(msgspec.Struct, tag="ready", array_like=True):
    """Worker loaded the model (or finished auto-complete, with the config in `config_json`).

    `ready_fn`: the model defines its own readiness check (a Python model's is_model_ready())."""

    config_json: str = ""
    ready_fn: bool = False


class ReadyCheck(msgspec.Struct, tag="readycheck", array_like=True):
    """Server -> worker (on the side socket): run the model's own readiness check; answered by ReadyReply."""

    check_id: int


class ReadyReply(msgspec.Struct, tag="readyreply", array_like=True):
    """Worker -> server: the result of ReadyCheck `check_id`."""

    check_id: int
    ready: bool


class Failed(msgspec.Struct, tag="failed", array_like=True):
    """Worker could not load the model."""

    message: str


class Respond(msgspec.Struct, tag="resp", array_like=True, omit_defaults=True, gc=False):
    """One response (or a bare final flag when `null`) for request `rid`."""

    rid: int
    outputs: list[TensorMsg] = []
    parameters: dict[str, Any] = {}
    error_code: int = -1  # -1: no error
    error: str = ""
    final: bool = True
    null: bool = False
    # the error is a response the model returned (not an exception from execute): a success for statistics
    model_error: bool = False
    # the batch's ExecDone riding in its last response (one frame less per batch; see with_done)
    done: ExecDone | None = None
    # the model released the request for rescheduling (a final with nothing in it): it runs again later
    reschedule: bool = False


class ExecDone(msgspec.Struct, tag="done", array_like=True, omit_defaults=True, gc=False):
    """The model's execute returned; times in ns for statistics."""

    batch_id: int
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    stamps: list[tuple[str, int]] = []  # worker stage timestamps (monotonic ns), only when stage tracing
    executed: bool = True  # False: every request was cancelled before the batch started, nothing ran


class BlsRequest(msgspec.Struct, tag="bls", array_like=True, omit_defaults=True):
    """A model asks the server to run a request on another model (BLS); replies are BlsResponse(reply_to=id).

    Large inputs live in the worker's output arena (WHERE_ARENA); the server sends Release for them after
    the final reply. `release` returns input-arena blocks of earlier BlsResponse outputs the model dropped.
    """

    id: int
    model_name: str
    model_version: str = ""
    inputs: list[TensorMsg] = []
    outputs: list[str] = []
    request_id: str = ""
    parameters: dict[str, Any] = {}
    flags: int = 0
    correlation_id: int | str = 0
    timeout_us: int = 0
    decoupled: bool = False
    release: list[int] = []
    trace_id: int = 0  # parent trace (the model passed trace=request.trace()); 0: none


class BlsResponse(msgspec.Struct, tag="blsresp", array_like=True, omit_defaults=True):
    """One response to BlsRequest `reply_to`; large outputs are in the worker's input arena (WHERE_ARENA)."""

    reply_to: int
    outputs: list[TensorMsg] = []
    parameters: dict[str, Any] = {}
    error_code: int = -1
    error: str = ""
    final: bool = True
    null: bool = False


class BlsCancel(msgspec.Struct, tag="blscancel", array_like=True):
    """The model cancelled BLS request `id` (ResponseIterator.cancel())."""

    id: int


class BlsRelease(msgspec.Struct, tag="blsrelease", array_like=True):
    """The model no longer uses these input-arena blocks (outputs of BLS responses)."""

    offsets: list[int]


class MetricCall(msgspec.Struct, tag="mcall", array_like=True, omit_defaults=True):
    """A model's custom-metric request that needs an answer (pb_utils.MetricFamily / Metric / value()).

    op: "family" (name, description, kind), "metric" (handle = family handle, labels, buckets) or "value"
    (handle = metric handle). `ops` are the model's batched updates (MetricUpdate.ops), applied first.
    """

    id: int
    op: str
    handle: int = 0
    name: str = ""
    description: str = ""
    kind: int = 0
    labels: dict[str, str] = {}
    buckets: list[float] | None = None
    ops: list[tuple[int, int, float]] = []


class MetricReply(msgspec.Struct, tag="mreply", array_like=True, omit_defaults=True):
    """Answer to MetricCall `reply_to`: a handle, a value, or an error message."""

    reply_to: int
    handle: int = 0
    value: float = 0.0
    error: str = ""


class MetricUpdate(msgspec.Struct, tag="mupd", array_like=True):
    """Custom-metric updates batched by a model: (op, metric or family handle, value) triples."""

    ops: list[tuple[int, int, float]]


class ModelLog(msgspec.Struct, tag="log", array_like=True):
    """A line a model logged through pb_utils.Logger: the server logs it under its own log settings (level
    flags, format, file), as Triton's stub sends every such line to the server. `level` is the Logger level
    (0 INFO, 1 WARNING, 2 ERROR, 3 VERBOSE); file and line are the model's call site."""

    level: int
    message: str
    file: str
    line: int


class ModelControl(msgspec.Struct, tag="mctl", array_like=True, omit_defaults=True):
    """Model control from a model (pb_utils.load_model / unload_model / is_model_ready); answered by a
    ModelControlReply. `op` is "load", "unload" or "ready"; `files` as a load request's file:<v>/<name>."""

    id: int
    op: str
    model_name: str
    config: str = ""
    files: dict[str, bytes] = {}
    unload_dependents: bool = False
    model_version: str = ""


class ModelControlReply(msgspec.Struct, tag="mctlreply", array_like=True, omit_defaults=True):
    """The answer to a ModelControl: an error message ("" when it went well) and, for "ready", the readiness."""

    reply_to: int
    error: str = ""
    ready: bool = False


# MetricUpdate / MetricCall op codes
METRIC_INCREMENT, METRIC_SET, METRIC_OBSERVE, METRIC_DELETE, METRIC_FAMILY_DELETE = 0, 1, 2, 3, 4

Message = (
    Init
    | AutoComplete
    | Execute
    | Release
    | Cancel
    | Unmap
    | Shutdown
    | Ready
    | ReadyCheck
    | ReadyReply
    | Failed
    | Respond
    | ExecDone
    | BlsRequest
    | BlsResponse
    | BlsCancel
    | BlsRelease
    | MetricCall
    | MetricReply
    | MetricUpdate
    | ModelLog
    | ModelControl
    | ModelControlReply
)


def with_done(held: list[Any], done: Any) -> list[Any]:
    """A batch's held messages followed by its ExecDone: when the last one is a response, the ExecDone rides in
    it (Respond.done; the receiver handles it right after that response, as if it came next)."""
    if held and type(held[-1]) is Respond and held[-1].done is None:
        held[-1].done = done
    else:
        held.append(done)
    return held


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Message)


def encode(message: Any) -> bytes:
    """Frame a message: length prefix + msgpack."""
    payload = _encoder.encode(message)
    return HEADER.pack(len(payload)) + payload


# decode(payload): one frame's payload (without the length prefix) -> message; the decoder's own method, so a
# frame costs no Python-level call around it (this runs once per frame on both sides)
decode: Callable[[bytes | memoryview], Any] = _decoder.decode
