"""Internal request/response types shared by frontends, core and workers (no gRPC or HTTP types here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.errors import ServiceError

# Request flags, as TRITONSERVER_REQUEST_FLAG_*.
FLAG_SEQUENCE_START = 1
FLAG_SEQUENCE_END = 2

ParamValue = bool | int | float | str


@dataclass(slots=True, frozen=True)
class ShmRef:
    """A tensor's place in a registered client shared-memory region, resolved to what a worker needs."""

    region: str  # registered region name
    kind: str  # "system" or "cuda"
    key: str  # POSIX key of the system segment ("" for cuda)
    offset: int  # absolute offset inside the segment (registration offset + tensor offset)
    byte_size: int
    device_id: int = 0
    raw_handle: bytes = b""
    path: str = ""  # system: opens the registered object even if its key was unlinked (ResolvedRegion.path)


# the front ends' unresolved references, made once per (region, offset, byte size): clients name the same tensors
# request after request, and a frozen ShmRef costs ~1 µs to build against ~0.1 µs for this lookup
_UNRESOLVED: dict[tuple[str, int, int], ShmRef] = {}
_UNRESOLVED_MAX = 4096  # distinct references kept; past it the cache starts over


def unresolved_shm_ref(region: str, offset: int, byte_size: int) -> ShmRef:
    """A client's reference to `byte_size` bytes at `offset` of registered region `region`, before the core
    resolves it (kind and key still empty)."""
    key = (region, offset, byte_size)
    ref = _UNRESOLVED.get(key)
    if ref is None:
        if len(_UNRESOLVED) >= _UNRESOLVED_MAX:
            _UNRESOLVED.clear()
        ref = _UNRESOLVED[key] = ShmRef(region, "", "", offset, byte_size)
    return ref


@dataclass(slots=True)
class InputTensor:
    """One request input: raw wire bytes (`data`) or a shared-memory reference (`shm`)."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | None = None
    shm: ShmRef | None = None

    def byte_size(self) -> int:
        """Number of payload bytes, wherever they live."""
        if self.shm is not None:
            return self.shm.byte_size
        return len(self.data) if self.data is not None else 0


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; `shm` set when it must be written into a client region."""

    name: str
    shm: ShmRef | None = None
    classification: int = 0


@dataclass(slots=True)
class OutputTensor:
    """One response output; `data` is None when the bytes were written into the client's shm region."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | None = None


@dataclass(slots=True)
class InferResponse:
    """One response to a request (a decoupled model may send many; `final` marks the last)."""

    model_name: str
    model_version: str
    id: str
    outputs: list[OutputTensor] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    error: ServiceError | None = None
    final: bool = True
    null: bool = False  # a bare final flag from a decoupled model: no outputs to send
    # `error` is a response the model itself returned: the request still succeeded for statistics and metrics
    # (Triton counts only an exception from execute as a failure)
    model_error: bool = False


ResponseCallback = Callable[[InferResponse], None]


@dataclass(slots=True, eq=False)
class InferRequest:
    """A validated inference request as the core and schedulers see it.

    `on_response` is called on the event loop for every response (exactly once with final=True, except a
    decoupled model's request may end with a final flag and no response: then `on_complete` alone is called).
    """

    model_name: str
    model_version: str
    id: str = ""
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    sequence_id: int | str = 0
    flags: int = 0
    priority: int = 0
    timeout_us: int = 0
    enable_empty_final: bool = False
    # must be answered exactly once (ModelInfer, non-decoupled BLS): an ensemble with a decoupled step then
    # answers with its single set of outputs instead of streaming
    single_response: bool = False
    # filled by the core
    batch_size: int = 1
    arrival_ns: int = 0
    on_response: ResponseCallback | None = None
    context: Any = None  # per-request bookkeeping owned by the scheduler/pool
    cancelled: bool = False
    stamps: list[tuple[str, int]] | None = None  # stage timestamps, only when TRIREME_STAGE_TRACE is set
    trace: Any = None  # service.core.observability.tracer.Trace when this request is traced (--trace-config)
    # set by a scheduler that takes requests back (iterative sequences): called instead of a final response when
    # the model released the request for rescheduling
    on_reschedule: Callable[[InferRequest], None] | None = None


# ---- what the engine answers about models (metadata, repository index) ---------------------------------------
@dataclass(slots=True)
class TensorMetadata:
    """name, datatype and shape (with -1 batch dim when batching)."""

    name: str
    datatype: str
    shape: list[int]


@dataclass(slots=True)
class ModelMetadata:
    """What ModelMetadata returns."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


@dataclass(slots=True)
class IndexEntry:
    """One RepositoryIndex row (version/state/reason empty when unknown)."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""
