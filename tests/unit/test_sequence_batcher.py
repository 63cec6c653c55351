"""Unit tests of the sequence batcher's slot logic, control tensors and implicit state, with a fake instance."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from service.core.observability.stats import ModelStats
from service.core.scheduling.implicit_state import SequenceState, build_states
from service.core.scheduling.sequence_batcher import SequenceBatcher
from service.core.scheduling.sequence_controls import build_controls
from service.errors import ServiceError
from service.ipc import frames as ipc
from service.types import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, InferRequest, InferResponse, InputTensor, OutputTensor

CONFIG = """
name: "m"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] },
    { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }] },
    { name: "END" control [{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }] },
    { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 }] }
  ]
  state [{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 2 ] }]
}
input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }]
"""


def config(text: str = CONFIG) -> mc.ModelConfig:
    """Parse a config.pbtxt text."""
    return text_format.Parse(text, mc.ModelConfig())


class FakeSpec:
    """What the scheduler reads of an instance spec."""

    def __init__(self, name: str) -> None:
        self.instance_name = name


class FakeWorker:
    """A model instance that records the batches it is given and finishes them on demand."""

    def __init__(self, name: str) -> None:
        self.spec = FakeSpec(name)
        self.alive = True
        self.uses_bls = False
        self.batches: list[list[InferRequest]] = []
        self.on_done: Any = None

    def execute(self, batch: list[InferRequest], on_done: Any) -> None:
        self.batches.append(batch)
        self.on_done = on_done

    def finish(self) -> None:
        """Answer every request of the last batch (Y = X) and report the execution done."""
        for req in self.batches[-1]:
            if req.on_response is not None:
                x = next(t for t in req.inputs if t.name == "X")
                req.on_response(
                    InferResponse(req.model_name, "1", req.id, [OutputTensor("Y", "INT32", [1, 1], x.data)])
                )
        self.on_done(self, ipc.ExecDone(len(self.batches)))


class FakePool:
    """The pool attributes the scheduler uses."""

    def __init__(self, workers: list[FakeWorker]) -> None:
        self.workers = workers
        self.on_available: Any = None
        self.on_lost: Any = None
        self.ready = True


def request(sid: int | str, x: int, flags: int = 0) -> InferRequest:
    """A request of sequence sid with X = [x]."""
    req = InferRequest("m", "1", f"r{x}", [InputTensor("X", "INT32", [1, 1], np.array([[x]], np.int32).tobytes())])
    req.sequence_id, req.flags = sid, flags
    req.on_response = lambda response: None
    return req


def value(req: InferRequest, name: str) -> Any:
    """The scalar a control/state input carries."""
    t = next(t for t in req.inputs if t.name == name)
    dtype = {"INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32}[t.datatype]
    return np.frombuffer(t.data, dtype).tolist()  # type: ignore[arg-type]


def test_control_tensors_and_corrid_truncation() -> None:
    controls = build_controls(config())
    tensors = {t.name: t for t in controls.tensors(True, False, True, 2**32 + 9)}
    assert {n: (t.datatype, t.shape) for n, t in tensors.items()} == {
        "START": ("INT32", [1, 1]),
        "END": ("FP32", [1, 1]),
        "READY": ("BOOL", [1, 1]),
        "CORRID": ("INT32", [1, 1]),
    }
    assert np.frombuffer(tensors["CORRID"].data, np.int32).tolist() == [9]  # type: ignore[arg-type]
    assert np.frombuffer(tensors["END"].data, np.float32).tolist() == [0.0]  # type: ignore[arg-type]


def test_malformed_control_is_rejected() -> None:
    bad = CONFIG.replace("int32_false_true: [ 0, 1 ]", "int32_false_true: [ 0 ]")
    with pytest.raises(ServiceError):
        build_controls(config(bad))


def test_state_starts_at_zero_and_follows_outputs() -> None:
    state = SequenceState(build_states(config(), "/nonexistent"), batched=True)
    (first,) = state.inputs()
    assert (first.name, first.shape, first.data) == ("S_IN", [1, 2], bytes(8))
    kept = state.capture(
        [OutputTensor("Y", "INT32", [1, 1], b"1234"), OutputTensor("S_OUT", "INT32", [1, 2], b"abcdefgh")]
    )
    assert [o.name for o in kept] == ["Y"]
    (nxt,) = state.inputs()
    assert (nxt.shape, nxt.data) == ([1, 2], b"abcdefgh")
    state.reset()
    assert state.inputs()[0].data == bytes(8)


async def _direct_scenario() -> None:
    worker = FakeWorker("m_0")
    batcher = SequenceBatcher(FakePool([worker]), ModelStats(), config(), "/nonexistent")  # type: ignore[arg-type]
    with pytest.raises(ServiceError, match="must specify the START flag"):
        batcher.enqueue(request(7, 1))
    with pytest.raises(ServiceError, match="non-zero or non-empty correlation ID"):
        batcher.enqueue(request(0, 1, FLAG_SEQUENCE_START))
    batcher.enqueue(request(1, 10, FLAG_SEQUENCE_START))  # runs at once in slot 0
    assert len(worker.batches) == 1
    for sid in (2, 3, 4, 5):  # slots 1-3, then 5 waits in the backlog
        batcher.enqueue(request(sid, 10 * sid, FLAG_SEQUENCE_START))
    assert list(batcher.backlog) == [5]
    worker.finish()
    batch = worker.batches[-1]
    # slot 0 (sequence 1) has nothing queued: it is padded with a not-READY null request
    assert [value(r, "CORRID") for r in batch] == [[0], [2], [3], [4]]
    assert [value(r, "READY") for r in batch] == [[False], [True], [True], [True]]
    assert [value(r, "START") for r in batch] == [[0], [1], [1], [1]]
    worker.finish()
    batcher.enqueue(request(3, 31, FLAG_SEQUENCE_END))  # slot 2 only: slots 0 and 1 are padded
    batch = worker.batches[-1]
    assert [value(r, "READY") for r in batch] == [[False], [False], [True]]
    assert [value(r, "END") for r in batch] == [[0.0], [0.0], [1.0]]
    assert [r.batch_size for r in batch] == [0, 0, 1]
    assert batch[2].outputs[-1].name == "S_OUT" and [o.name for o in batch[2].outputs] == ["Y", "S_OUT"]
    assert list(batcher.backlog) == []  # the END freed slot 2 for sequence 5
    worker.finish()
    await batcher.stop()


def test_direct_slots_backlog_and_padding() -> None:
    asyncio.run(_direct_scenario())


async def _cancel_scenario() -> None:
    worker = FakeWorker("m_0")
    stats = ModelStats()
    batcher = SequenceBatcher(FakePool([worker]), stats, config(), "/nonexistent")  # type: ignore[arg-type]
    got: list[InferResponse] = []
    batcher.enqueue(request(1, 1, FLAG_SEQUENCE_START))
    queued = request(1, 2)
    queued.on_response = got.append
    batcher.enqueue(queued)
    batcher.cancel(queued)
    assert got and got[0].error is not None and got[0].error.code.name == "CANCELLED"
    worker.finish()
    assert len(worker.batches) == 1 and stats.cancelled == 1
    await batcher.stop()


def test_cancel_removes_queued_request() -> None:
    asyncio.run(_cancel_scenario())
