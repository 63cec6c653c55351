"""Opt-in batching helper for Python models: inputs stacked along dim 0, outputs split back per request.

Triton hands `execute` the list of requests of a batch and leaves stacking to the model. With this helper a
vectorised model writes one function over whole-batch arrays:

    class TritonPythonModel:
        @pb_utils.batched
        def execute(self, inputs):              # {"INPUT0": array[total_batch, ...], ...}
            return {"OUTPUT0": inputs["INPUT0"] * 2}

Requests whose inputs differ in names, datatypes or non-batch shapes are run in separate calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from service.worker.pb_utils.errors import TritonError
from service.worker.pb_utils.responses import InferenceResponse
from service.worker.pb_utils.tensor import Tensor, _tensor_from_input

Arrays = Mapping[str, np.ndarray]
BatchFn = Callable[[dict[str, np.ndarray]], Any]


def _outputs_as_arrays(result: Any) -> dict[str, np.ndarray]:
    """Accept {name: array}, {name: Tensor} or [Tensor, ...] from the model function."""
    if isinstance(result, Mapping):
        items = list(result.items())
    elif isinstance(result, list | tuple):
        items = [(t.name(), t) for t in result]
    else:
        raise TypeError(f"a batched execute must return a dict of output arrays, got {type(result).__name__}")
    out = {}
    for name, value in items:
        array = value.as_numpy() if isinstance(value, Tensor) else np.asarray(value)
        if array.dtype.kind in ("S", "U"):
            array = array.astype(np.object_)
        elif not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        out[name] = array
    return out


def _group_key(request: Any, batch_dim: bool) -> tuple[Any, ...]:
    skip = 1 if batch_dim else 0
    return tuple((t.name(), t.as_numpy().dtype.str, tuple(t.as_numpy().shape[skip:])) for t in request.inputs())


def _error_responses(count: int, e: BaseException) -> list[Any]:
    text = str(e)
    message = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return [InferenceResponse(error=TritonError(message)) for _ in range(count)]


def _run_group(requests: list[Any], fn: BatchFn, batch_dim: bool) -> list[Any]:
    """Stack one shape-compatible group, call fn once, split its outputs back per request."""
    names = [t.name() for t in requests[0].inputs()]
    per_request = [[t.as_numpy() for t in r.inputs()] for r in requests]
    if len(requests) == 1:
        stacked = dict(zip(names, per_request[0] if batch_dim else [a[None] for a in per_request[0]], strict=True))
    else:
        join = np.concatenate if batch_dim else np.stack
        stacked = {name: join([arrays[i] for arrays in per_request]) for i, name in enumerate(names)}
    sizes = [arrays[0].shape[0] if batch_dim and arrays else 1 for arrays in per_request]
    total = sum(sizes)
    try:
        outputs = _outputs_as_arrays(fn(stacked))
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise ValueError(
                    f"output '{name}' has shape {list(array.shape)}: its first dimension must be the batch size {total}"
                )
    except Exception as e:
        return _error_responses(len(requests), e)
    responses = []
    start = 0
    for size in sizes:
        end = start + size
        if batch_dim:
            tensors = [_tensor_from_input(name, array[start:end]) for name, array in outputs.items()]
        else:
            tensors = [_tensor_from_input(name, array[start]) for name, array in outputs.items()]
        responses.append(InferenceResponse(output_tensors=tensors))
        start = end
    return responses


def execute_batched(requests: list[Any], fn: BatchFn, batch_dim: bool = True) -> list[Any]:
    """Run `fn` over the batch's inputs stacked along dim 0; one InferenceResponse per request, in order.

    `fn` receives {input name: array} and returns {output name: array} whose first dimension is the total
    batch size. `batch_dim=False` is for models with max_batch_size 0: each request's inputs are stacked
    along a new leading axis and output row i goes to request i. An exception in `fn` becomes an error
    response for every request of that call.
    """
    if len(requests) < 2:
        return _run_group(requests, fn, batch_dim) if requests else []
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(_group_key(request, batch_dim), []).append(index)
    if len(groups) == 1:
        return _run_group(requests, fn, batch_dim)
    responses: list[Any] = [None] * len(requests)
    for indexes in groups.values():
        for index, response in zip(indexes, _run_group([requests[i] for i in indexes], fn, batch_dim), strict=True):
            responses[index] = response
    return responses


def batched(method: Callable[..., Any] | None = None, *, batch_dim: bool = True) -> Any:
    """Decorate `execute(self, inputs) -> outputs` so Triton calls it as `execute(self, requests)`.

    Use as `@pb_utils.batched` or `@pb_utils.batched(batch_dim=False)` (models with max_batch_size 0).
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def execute(self: Any, requests: list[Any]) -> list[Any]:
            return execute_batched(requests, lambda inputs: fn(self, inputs), batch_dim)

        return execute

    return wrap(method) if method is not None else wrap
