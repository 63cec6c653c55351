"""Ragged batching for the backends that concatenate a batch (docs/ragged-batching.md): the `batch_input`
tensors made from the requests of a batch, and `batch_output` tensors scattered back over them, as Triton's
backend utilities define them (element counts include the batch dimension; item shapes leave it out)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from service.worker.backends.tensor_batch import HasInputs


def _source_shapes(spec: dict[str, Any], requests: Sequence[HasInputs]) -> list[tuple[int, ...]]:
    source = spec["source_input"][0]
    shapes = []
    for r in requests:
        array = r.inputs.get(source)
        if array is None:
            raise ValueError(f"batch input '{spec['target_name'][0]}' needs input '{source}', which a request lacks")
        shapes.append(tuple(int(d) for d in array.shape))
    return shapes


def batch_input_value(spec: dict[str, Any], requests: Sequence[HasInputs]) -> np.ndarray:
    """The tensor a `batch_input` entry (config JSON) stands for over `requests`, in its data type."""
    kind = spec.get("kind", "BATCH_ELEMENT_COUNT")
    dtype = np.float32 if spec.get("data_type") == "TYPE_FP32" else np.int32
    shapes = _source_shapes(spec, requests)
    counts = [math.prod(s) for s in shapes]
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":  # only the shape carries information (Triton: uninitialized)
        return np.zeros(max(counts, default=0), dtype=dtype)
    if kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        # one row per batch item (a request of batch size b gives b rows): its shape without the batch dimension
        rank = max((len(s) - 1 for s in shapes), default=0)
        rows = [list(s[1:]) for s in shapes for _ in range(s[0] if s else 0)]
        table = np.array(rows, dtype=dtype).reshape(len(rows), rank)
        return table.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else table
    raise ValueError(f"unknown batch input kind '{kind}'")


def batch_inputs(specs: list[dict[str, Any]], requests: Sequence[HasInputs]) -> dict[str, np.ndarray]:
    """Every batch input of the config, by target name."""
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        value = batch_input_value(spec, requests)
        for target in spec.get("target_name", []):
            out[target] = value
    return out


def scatter(array: np.ndarray, dims: list[int], source: str, requests: Sequence[HasInputs], batching: bool) -> list:
    """BATCH_SCATTER_WITH_INPUT_SHAPE: consecutive pieces of `array`, each shaped as the output's config shape
    (with the batch dimension) whose -1 dimensions take the request's `source` input's same dimensions."""
    template = ([-1] if batching else []) + list(dims)
    flat = np.ascontiguousarray(array).reshape(-1)
    pieces = []
    offset = 0
    for r in requests:
        src = r.inputs[source].shape
        shape = [int(src[i]) if d == -1 and i < len(src) else d for i, d in enumerate(template)]
        n = math.prod(shape)
        if offset + n > flat.size:
            raise ValueError(
                f"batch output has {flat.size} elements, too few to scatter over the batch's requests "
                f"(shapes of '{source}': {[list(q.inputs[source].shape) for q in requests]})"
            )
        pieces.append(flat[offset : offset + n].reshape(shape))
        offset += n
    return pieces
