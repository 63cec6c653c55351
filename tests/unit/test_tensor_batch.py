"""Batch helpers and BatchingBackend.execute: grouping by shape, one run per group, rows split back per request."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.errors import ErrorCode
from service.worker.backends.base import BackendContext, BackendError, BatchingBackend, WorkerRequest, check_tensor
from service.worker.backends.tensor_batch import concat_rows, group_compatible, split_rows


def test_concat_and_split_round_trip() -> None:
    parts = [np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 100 * n for n in (1, 2, 4)]
    joined = concat_rows(parts)
    assert joined.shape == (7, 3) and joined.flags.c_contiguous
    np.testing.assert_array_equal(joined, np.concatenate(parts))
    pieces = split_rows(joined, [1, 2, 4])
    for piece, part in zip(pieces, parts, strict=True):
        np.testing.assert_array_equal(piece, part)
        assert np.shares_memory(piece, joined)  # views, no copy
    out = np.empty((7, 3), np.float32)
    assert concat_rows(parts, out) is out
    with pytest.raises(ValueError, match="does not hold 7 rows"):
        concat_rows(parts, np.empty((6, 3), np.float32))
    with pytest.raises(ValueError, match="cannot split"):
        split_rows(joined, [1, 2])


class _Req:
    def __init__(self, **inputs: np.ndarray) -> None:
        self.inputs = inputs


def test_group_compatible_by_dims_after_batch() -> None:
    a, b, c, d = (
        _Req(x=np.zeros((1, 3))),
        _Req(x=np.zeros((2, 4))),
        _Req(x=np.zeros((5, 3))),
        _Req(x=np.zeros((1, 3), np.float32)),
    )
    assert group_compatible([a, b, c, d]) == [[a, c], [b], [d]]


def _context(max_batch_size: int) -> BackendContext:
    config = {
        "name": "m",
        "max_batch_size": max_batch_size,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    return BackendContext("m", "1", "/nonexistent", "/nonexistent/1", config, "{}", "m_0", "CPU", 0)


class _Doubler(BatchingBackend):
    """Y = 2 X plus ROWS = rows seen by the call, so each request can tell how big its forward call was."""

    def __init__(self, context: BackendContext, bad_rows: bool = False) -> None:
        super().__init__(context)
        self.calls: list[int] = []
        self.bad_rows = bad_rows

    def initialize(self) -> None:
        pass

    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        self.calls.append(rows)
        x = inputs["X"]
        n = x.shape[0] - 1 if self.bad_rows else x.shape[0]
        return {"Y": (x * 2)[:n], "ROWS": np.full((n, 1), rows, np.int64)}


def _requests(*arrays: np.ndarray, wanted: list[str] | None = None) -> tuple[list[WorkerRequest], dict[int, Any]]:
    answers: dict[int, Any] = {}

    def responder(req: WorkerRequest, outputs: Any, error: Any, final: bool, params: Any) -> None:
        answers[req.rid] = error if error is not None else outputs
        req.closed = final

    reqs = [
        WorkerRequest(i, f"r{i}", {"X": a}, list(wanted or []), {}, 0, 0, 0, responder) for i, a in enumerate(arrays)
    ]
    return reqs, answers


def test_batching_backend_one_call_per_shape_group() -> None:
    backend = _Doubler(_context(8))
    xs = [np.full((1, 3), 1, np.float32), np.full((2, 3), 2, np.float32), np.full((2, 5), 3, np.float32)]
    xs.append(np.full((3, 3), 4, np.float32))
    reqs, answers = _requests(*xs)
    backend.execute(reqs)
    assert backend.calls == [6, 2]  # rows 1+2+3 with dims [3] in one call, the [5] request alone
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(answers[i]["Y"], x * 2)
        assert answers[i]["ROWS"].shape == (x.shape[0], 1)
    assert [int(answers[i]["ROWS"][0, 0]) for i in range(4)] == [6, 6, 2, 6]


def test_batching_backend_requested_outputs_and_no_batching() -> None:
    backend = _Doubler(_context(0))
    reqs, answers = _requests(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), wanted=["ROWS"])
    backend.execute(reqs)
    assert backend.calls == [1, 1]  # max_batch_size 0: never concatenated
    assert set(answers[0]) == {"ROWS"}


def test_batching_backend_fails_the_group_when_outputs_cannot_be_split() -> None:
    backend = _Doubler(_context(8), bad_rows=True)
    reqs, answers = _requests(np.ones((1, 3), np.float32), np.ones((2, 3), np.float32))
    backend.execute(reqs)
    for i in (0, 1):
        code, message = answers[i]
        assert code == int(ErrorCode.INTERNAL)
        assert "output 'Y' of model 'm' has shape [2, 3]" in message
        assert "must be the batch size 3" in message


def test_check_tensor_messages() -> None:
    check_tensor("m", "input", "X", "TYPE_FP32", [16], "TYPE_FP32", [-1, 16], 8)
    check_tensor("m", "input", "X", "TYPE_FP32", [2, 7, 4], "TYPE_FP32", [2, -1, 4], 0)
    with pytest.raises(BackendError, match="configuration expects datatype TYPE_FP32 for input 'X', model provides"):
        check_tensor("m", "input", "X", "TYPE_FP32", [16], "TYPE_INT32", [-1, 16], 8)
    with pytest.raises(BackendError, match=r"tensor 'X': the model expects 2 dimensions \(shape \[-1,16\]\)"):
        check_tensor("m", "input", "X", "TYPE_FP32", [4], "TYPE_FP32", [-1, 16], 8)
    with pytest.raises(BackendError, match="does not support batching"):
        check_tensor("m", "output", "Y", "TYPE_FP32", [16], "TYPE_FP32", [1, 16], 8)
