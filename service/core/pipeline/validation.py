"""Request validation against a model's config: inputs, datatypes, shapes, byte sizes, requested outputs."""

from __future__ import annotations

from service.core.repository.signature import ModelSignature
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest
from shm.tensor import ELEMENT_SIZE
from shm.views import bytes_extent


def check_model_name(name: str, *, is_path: bool = True) -> None:
    """A model name from a load (is_path) or unload request, checked before any lookup (Triton 2.73's messages).

    A load turns the name into a folder of the repository, so '..' (also with blanks around it, as the file
    system may see it) and separators are refused; an unload only looks the name up among loaded models, so any
    non-empty name is answered as an unknown model would be."""
    if not name.strip():
        raise ServiceError(ErrorCode.INVALID_ARG, "Model name cannot be empty. Please enter a valid name to deploy.")
    if is_path and (name.strip() in (".", "..") or any(c in name for c in "/\\\0")):
        raise ServiceError(ErrorCode.INVALID_ARG, "model name must not contain path traversal characters")


def _prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _fail(request: InferRequest, message: str, code: ErrorCode = ErrorCode.INVALID_ARG) -> ServiceError:
    return ServiceError(code, _prefix(request) + message)


def _names(names: list[str]) -> str:
    """['A','B'] as Triton lists tensor names in messages (no space after the comma)."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _shape_str(shape: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def validate_request(request: InferRequest, sig: ModelSignature) -> None:
    """Check a request; sets request.batch_size. Raises ServiceError(INVALID_ARG) with Triton's wording.

    One function on the common path (the shape and byte-size checks are written out, not called per input):
    this runs once per request."""
    model = sig.model_name
    specs = sig.inputs
    internal = sig.internal_inputs
    max_batch = sig.max_batch_size
    seen: set[str] = set()
    batch_size = 0
    for t in request.inputs:
        name = t.name
        spec = specs.get(name)
        if spec is None or name in internal:
            raise _fail(request, f"unexpected inference input '{name}' for model '{model}'")
        if name in seen:
            raise _fail(request, f"input '{name}' already exists in request")
        seen.add(name)
        datatype = t.datatype
        if datatype != spec.datatype:
            raise _fail(
                request,
                f"inference input '{name}' data-type is '{datatype}', but model '{model}' expects '{spec.datatype}'",
            )
        shape = t.shape
        count = 1
        for d in shape:
            if d < 0:
                raise _fail(
                    request,
                    f"input '{name}' for model '{model}' has a negative dimension in {_shape_str(shape)}",
                )
            count *= d
        dims = spec.dims
        if max_batch > 0:
            if not shape:
                raise _fail(request, f"input '{name}' for model '{model}' must have a batch dimension")
            this_batch = shape[0]
            if not 0 < this_batch <= max_batch:
                if this_batch == 0:
                    raise _fail(request, f"inference request batch-size must be >= 1 for '{model}'")
                raise _fail(request, f"inference request batch-size must be <= {max_batch} for '{model}'")
            if batch_size and this_batch != batch_size:
                raise _fail(
                    request,
                    f"input '{name}' batch size {this_batch} does not match other inputs' batch size "
                    f"{batch_size} for model '{model}'",
                )
            batch_size = this_batch
            fits = len(dims) == len(shape) - 1
            if fits:
                for i, d in enumerate(dims, 1):
                    if d != shape[i] and d != -1:
                        fits = False
                        break
        else:
            fits = len(dims) == len(shape)
            if fits:
                for i, d in enumerate(dims):
                    if d != shape[i] and d != -1:
                        fits = False
                        break
        if not fits:
            expected = [-1, *dims] if max_batch > 0 else list(dims)
            raise _fail(
                request,
                f"unexpected shape for input '{name}' for model '{model}'. Expected {_shape_str(expected)}, "
                f"got {_shape_str(shape)}",
            )
        if datatype == "BYTES":
            _check_bytes(request, name, count, t.data, model)
        else:
            actual = t.shm.byte_size if t.shm is not None else len(t.data) if t.data is not None else 0
            expected_bytes = ELEMENT_SIZE[datatype] * count
            if actual != expected_bytes:
                raise _fail(
                    request,
                    f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected_bytes}, "
                    f"got {actual}",
                )
    required = sig.required_inputs
    if len(seen) < len(required) or not seen.issuperset(required):
        missing = [n for n in required if n not in seen]
        allowed = sum(1 for n in specs if n not in internal)
        wanted = (
            f"{len(required)} inputs"
            if allowed == len(required)
            else f"number of inputs between {len(required)} and {allowed}"
        )
        raise _fail(
            request,
            f"expected {wanted} but got {len(seen)} inputs for model '{model}'. Got input(s) "
            f"{_names([t.name for t in request.inputs])}, but missing required input(s) {_names(missing)}. "
            "Please provide all required input(s).",
        )
    outputs = sig.outputs
    requested: set[str] = set()
    for o in request.outputs:
        if o.name not in outputs:
            raise _fail(request, f"unexpected inference output '{o.name}' for model '{model}'")
        if o.name in requested:
            raise _fail(request, f"output '{o.name}' already exists in request")
        requested.add(o.name)
    request.batch_size = batch_size if max_batch > 0 else 1


def _check_bytes(request: InferRequest, name: str, count: int, data: bytes | memoryview | None, model: str) -> None:
    """A BYTES input sent in the request: its length prefixes must fit and the elements fill the bytes sent."""
    if data is None:
        return  # in shared memory: Engine checks it in place once the region is resolved
    try:
        extent = bytes_extent(data, count)  # walks the prefixes without copying the elements
    except ValueError as e:
        raise _fail(request, f"input '{name}' for model '{model}' has malformed BYTES data: {e}") from None
    if extent != len(data):
        raise _fail(
            request,
            f"input '{name}' for model '{model}' has malformed BYTES data: {count} elements use {extent} "
            f"of the {len(data)} bytes sent",
        )
