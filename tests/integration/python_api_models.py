"""Functions the Python-API tests bind as models (an importable module: worker processes import it by name)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from trireme import batch


@batch
def linear(**inputs: np.ndarray) -> list[np.ndarray]:
    """PyTriton's linear example shape: y = 2x + 1 over a batch, outputs as a list in declared order."""
    (x,) = inputs.values()
    return [x * 2.0 + 1.0]


@batch
def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """PyTriton's add/sub example: batched, outputs by name."""
    return {"add": a + b, "sub": a - b}


def whoami(requests: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    """Unbatched: each request's answer carries the pid of the process the function ran in."""
    return [{"pid": np.array([os.getpid()], np.int64), "echo": r["x"]} for r in requests]


def streamer(requests: Sequence[Any]) -> Iterator[list[dict[str, np.ndarray]]]:
    """Decoupled: request with count [n] gets n responses, the k-th carrying [k]."""
    counts = [int(r["count"].reshape(-1)[0]) for r in requests]
    for k in range(max(counts)):
        yield [{"index": np.array([min(k, n - 1)], np.int32)} for n in counts]


async def async_double(requests: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    """An async function (a coroutine per batch)."""
    await asyncio.sleep(0)
    return [{"y": r["x"] * 2} for r in requests]


def echo_llm(requests: Sequence[Any]) -> Iterator[list[dict[str, np.ndarray]]]:
    """Decoupled text model for the OpenAI front end: streams its prompt back word by word."""
    words = [r["text_input"].reshape(-1)[0].decode().split() for r in requests]
    for k in range(max(len(w) for w in words)):
        yield [{"text_output": np.array([(w[k] + " ").encode() if k < len(w) else b""], np.object_)} for w in words]


async def async_stream(requests: Sequence[Any]) -> AsyncIterator[list[dict[str, np.ndarray]]]:
    """Decoupled async generator: three responses per request."""
    for k in range(3):
        await asyncio.sleep(0)
        yield [{"index": np.array([k], np.int32)} for _ in requests]


def wrong_shape(requests: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    """Answers with one element more than declared."""
    return [{"y": np.zeros(r["x"].shape[0] + 1, np.float32)} for r in requests]


def wrong_type(requests: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    """Answers FP32 output with strings."""
    return [{"y": np.array(["a"] * r["x"].shape[0])} for r in requests]


def fails_on_negative(requests: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    """Raises for a negative input; answers the rest."""
    for r in requests:
        if (r["x"] < 0).any():
            raise ValueError("negative input")
    return [{"y": r["x"]} for r in requests]
