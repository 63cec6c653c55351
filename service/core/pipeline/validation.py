"""Request validation against a model's config: inputs, datatypes, shapes, byte sizes, requested outputs."""

from __future__ import annotations

from service.core.repository.signature import ModelSignature
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest
from shm.tensor import ELEMENT_SIZE, element_count
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
    """Check a request; sets request.batch_size. Raises ServiceError(INVALID_ARG) with Triton's wording."""
    model = sig.model_name
    seen: set[str] = set()
    batch_size = 0
    for t in request.inputs:
        spec = sig.inputs.get(t.name)
        if spec is None or t.name in sig.internal_inputs:
            raise _fail(request, f"unexpected inference input '{t.name}' for model '{model}'")
        if t.name in seen:
            raise _fail(request, f"input '{t.name}' already exists in request")
        seen.add(t.name)
        if t.datatype != spec.datatype:
            raise _fail(
                request,
                f"inference input '{t.name}' data-type is '{t.datatype}', but model '{model}' expects "
                f"'{spec.datatype}'",
            )
        shape = t.shape
        if shape and min(shape) < 0:
            raise _fail(
                request,
                f"input '{t.name}' for model '{model}' has a negative dimension in {_shape_str(shape)}",
            )
        if sig.max_batch_size > 0:
            if not shape:
                raise _fail(request, f"input '{t.name}' for model '{model}' must have a batch dimension")
            this_batch = shape[0]
            if not 0 < this_batch <= sig.max_batch_size:
                if this_batch == 0:
                    raise _fail(request, f"inference request batch-size must be >= 1 for '{model}'")
                raise _fail(request, f"inference request batch-size must be <= {sig.max_batch_size} for '{model}'")
            if batch_size and this_batch != batch_size:
                raise _fail(
                    request,
                    f"input '{t.name}' batch size {this_batch} does not match other inputs' batch size "
                    f"{batch_size} for model '{model}'",
                )
            batch_size = this_batch
            body = shape[1:]
        else:
            body = shape
        if not _dims_match(spec.dims, body):
            expected = [-1, *spec.dims] if sig.max_batch_size > 0 else list(spec.dims)
            raise _fail(
                request,
                f"unexpected shape for input '{t.name}' for model '{model}'. Expected {_shape_str(expected)}, "
                f"got {_shape_str(shape)}",
            )
        _check_byte_size(request, t.name, t.datatype, shape, t.byte_size(), t.data, model)
    if len(seen) < len(sig.required_inputs) or not seen.issuperset(sig.required_inputs):
        missing = [n for n in sig.required_inputs if n not in seen]
        required = len(sig.required_inputs)
        allowed = sum(1 for n in sig.inputs if n not in sig.internal_inputs)
        wanted = f"{required} inputs" if allowed == required else f"number of inputs between {required} and {allowed}"
        raise _fail(
            request,
            f"expected {wanted} but got {len(seen)} inputs for model '{model}'. Got input(s) "
            f"{_names([t.name for t in request.inputs])}, but missing required input(s) {_names(missing)}. "
            "Please provide all required input(s).",
        )
    requested: set[str] = set()
    for o in request.outputs:
        if o.name not in sig.outputs:
            raise _fail(request, f"unexpected inference output '{o.name}' for model '{model}'")
        if o.name in requested:
            raise _fail(request, f"output '{o.name}' already exists in request")
        requested.add(o.name)
    request.batch_size = batch_size if sig.max_batch_size > 0 else 1


def _dims_match(dims: tuple[int, ...], shape: list[int]) -> bool:
    """Whether a request's shape (without the batch dim) fits the config's dims (-1: any size)."""
    if len(dims) != len(shape):
        return False
    for d, s in zip(dims, shape, strict=True):  # noqa: SIM110 - a loop: no generator per request
        if d != s and d != -1:
            return False
    return True


def _check_byte_size(
    request: InferRequest,
    name: str,
    datatype: str,
    shape: list[int],
    actual: int,
    data: bytes | memoryview | None,
    model: str,
) -> None:
    count = element_count(shape)
    if datatype == "BYTES":
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
        return
    expected = ELEMENT_SIZE[datatype] * count
    if actual != expected:
        raise _fail(
            request,
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {actual}",
        )
