"""PyTriton's @batch: the function gets each input as one array stacked over the batch's requests (as keyword
arguments) and returns outputs for the whole batch, which are split back per request by their batch sizes."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trireme.bind.request import Request, batch_size


def _split(outputs: Any, sizes: list[int]) -> list[Any]:
    """Per-request slices of a batch's outputs (a dict by name, or a list/tuple in the declared order)."""
    total = sum(sizes)
    if isinstance(outputs, dict):
        items = list(outputs.items())
    elif isinstance(outputs, (list, tuple)):
        items = list(enumerate(outputs))
    else:
        raise TypeError(
            f"a @batch function must return a dict or a list of output arrays, not {type(outputs).__name__}"
        )
    arrays = [(key, np.asarray(value)) for key, value in items]
    wrong = {key: a.shape for key, a in arrays if a.ndim == 0 or a.shape[0] != total}
    if wrong:
        shown = ", ".join(f"{k}: {s}" for k, s in wrong.items())
        raise ValueError(f"Received output tensors with different batch sizes: {shown}. Expected batch size: {total}.")
    out: list[Any] = []
    start = 0
    for size in sizes:
        piece = [(key, a[start : start + size]) for key, a in arrays]
        out.append(dict(piece) if isinstance(outputs, dict) else [a for _, a in piece])
        start += size
    return out


def batch(fn: Callable[..., Any]) -> Callable[[Sequence[Request]], Any]:
    """Turn `fn(**stacked_inputs) -> outputs` into a function of a list of requests (PyTriton's @batch): plain,
    async, generator (decoupled: each yield is one response per request) and async generator functions."""

    def stacked(requests: Sequence[Request]) -> tuple[dict[str, np.ndarray], list[int]]:
        names = list(requests[0].keys())
        for r in requests[1:]:
            if list(r.keys()) != names and set(r.keys()) != set(names):
                raise ValueError("Cannot batch requests with different set of inputs keys")
        inputs = {n: np.concatenate([r[n] for r in requests]) for n in names}
        return inputs, [batch_size(r) for r in requests]

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen(requests: Sequence[Request], *args: Any, **kwargs: Any) -> Any:
            inputs, sizes = stacked(requests)
            async for outputs in fn(*args, **kwargs, **inputs):
                yield _split(outputs, sizes)

        return agen

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coro(requests: Sequence[Request], *args: Any, **kwargs: Any) -> Any:
            inputs, sizes = stacked(requests)
            return _split(await fn(*args, **kwargs, **inputs), sizes)

        return coro

    @functools.wraps(fn)
    def plain(requests: Sequence[Request], *args: Any, **kwargs: Any) -> Any:
        inputs, sizes = stacked(requests)
        outputs = fn(*args, **kwargs, **inputs)
        if inspect.isgenerator(outputs):
            return (_split(o, sizes) for o in outputs)
        return _split(outputs, sizes)

    return plain
