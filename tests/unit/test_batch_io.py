"""Batch inputs and the scattered batch output of ragged batching, against the values Triton's model_config.proto
documents (its own examples), without a server (tests/integration/test_ragged_batching.py runs them for real)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from service.worker.backends.batch_io import batch_input_value, scatter


def req(**inputs: tuple[int, ...]) -> Any:
    return SimpleNamespace(inputs={name: np.zeros(shape, np.float32) for name, shape in inputs.items()})


def spec(kind: str, dtype: str = "TYPE_INT32") -> dict[str, Any]:
    return {"kind": kind, "target_name": ["T"], "data_type": dtype, "source_input": ["X"]}


# the proto's example: a batch-2 request of item shape [3, 1] and a batch-1 request of item shape [2, 2]
PROTO_EXAMPLE = [req(X=(2, 3, 1)), req(X=(1, 2, 2))]


def test_element_counts_include_the_batch_dimension() -> None:
    reqs = [req(X=(1, 3)), req(X=(1, 4)), req(X=(2, 5))]
    count = batch_input_value(spec("BATCH_ELEMENT_COUNT", "TYPE_FP32"), reqs)
    assert count.dtype == np.float32 and count.tolist() == [3, 4, 10]
    assert batch_input_value(spec("BATCH_ACCUMULATED_ELEMENT_COUNT"), reqs).tolist() == [3, 7, 17]
    with_zero = batch_input_value(spec("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"), reqs)
    assert with_zero.dtype == np.int32 and with_zero.tolist() == [0, 3, 7, 17]
    assert batch_input_value(spec("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"), reqs).shape == (10,)


def test_item_shapes_as_the_proto_documents() -> None:
    item = batch_input_value(spec("BATCH_ITEM_SHAPE"), PROTO_EXAMPLE)
    assert item.shape == (3, 2) and item.tolist() == [[3, 1], [3, 1], [2, 2]]
    flat = batch_input_value(spec("BATCH_ITEM_SHAPE_FLATTEN"), PROTO_EXAMPLE)
    assert flat.shape == (6,) and flat.tolist() == [3, 1, 3, 1, 2, 2]


def test_scatter_takes_each_requests_input_shape() -> None:
    reqs = [req(X=(1, 3)), req(X=(1, 2))]
    pieces = scatter(np.arange(5, dtype=np.float32), [-1], "X", reqs, batching=True)
    assert [p.shape for p in pieces] == [(1, 3), (1, 2)]
    assert pieces[0].tolist() == [[0, 1, 2]] and pieces[1].tolist() == [[3, 4]]
    fixed = scatter(np.arange(12), [-1, 2], "X", reqs, batching=True)  # fixed dims stay as the config says
    assert [p.shape for p in fixed] == [(1, 3, 2), (1, 2, 2)]
    with pytest.raises(ValueError, match="too few to scatter"):
        scatter(np.arange(4), [-1], "X", reqs, batching=True)
