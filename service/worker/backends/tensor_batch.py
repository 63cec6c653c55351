"""Batch helpers for framework backends: group requests by input shape, concatenate along dim 0, split outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np


class HasInputs(Protocol):
    """Anything with named numpy inputs (a WorkerRequest)."""

    inputs: dict[str, np.ndarray]


R = TypeVar("R", bound=HasInputs)


def shape_key(
    inputs: dict[str, np.ndarray], ragged: frozenset[str] = frozenset()
) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """What must be equal for two requests to share one forward call: names, dtypes, dims after the batch dim
    (not for `ragged` inputs, which are concatenated whatever their shapes)."""
    return tuple(
        sorted(
            (name, array.dtype.str, tuple(array.shape[1:]) if name not in ragged else ())
            for name, array in inputs.items()
        )
    )


def group_compatible(requests: Sequence[R], ragged: frozenset[str] = frozenset()) -> list[list[R]]:
    """Requests grouped by shape_key; groups in order of first appearance, requests in order within a group."""
    groups: dict[tuple[tuple[str, str, tuple[int, ...]], ...], list[R]] = {}
    for req in requests:
        groups.setdefault(shape_key(req.inputs, ragged), []).append(req)
    return list(groups.values())


def concat_rows(parts: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Concatenate arrays along dim 0 with one write per part into `out` (allocated when None)."""
    total = sum(int(p.shape[0]) for p in parts)
    first = parts[0]
    if out is None:
        out = np.empty((total, *first.shape[1:]), dtype=first.dtype)
    elif out.shape[0] != total or out.shape[1:] != first.shape[1:]:
        raise ValueError(f"destination shape {list(out.shape)} does not hold {total} rows of {list(first.shape[1:])}")
    pos = 0
    for part in parts:
        n = int(part.shape[0])
        out[pos : pos + n] = part
        pos += n
    return out


def split_rows(array: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """Views of consecutive row ranges of `array` with the given row counts (no copy)."""
    if sum(sizes) != array.shape[0]:
        raise ValueError(f"cannot split {array.shape[0]} rows into {list(sizes)}")
    pieces = []
    pos = 0
    for n in sizes:
        pieces.append(array[pos : pos + n])
        pos += n
    return pieces
