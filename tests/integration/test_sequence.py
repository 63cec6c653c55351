"""The sequence batcher through real tritonclient calls: control inputs, strategies, idle reaper, state."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, write_model
from tests.integration.test_stream_models import (
    ACCUMULATE_PY,
    STATEFUL_CONFIG,
    STATEFUL_PY,
    accumulate_config,
)

TIMEOUT_S = 30


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Repository and log file locations of the module's server."""
    base = tmp_path_factory.mktemp("seq")
    return {"repo": base / "repo", "base": base, "direct_log": base / "direct.log", "oldest_log": base / "oldest.log"}


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    """A server with accumulators (uint64 and string ids, direct and oldest) and the implicit-state model."""
    repo = paths["repo"]
    write_model(repo, "acc_u64", accumulate_config("acc_u64", 0), ACCUMULATE_PY)
    write_model(repo, "acc_str", accumulate_config("acc_str", 0, corrid_type="TYPE_STRING"), ACCUMULATE_PY)
    write_model(repo, "acc_direct", accumulate_config("acc_direct", 4, log=str(paths["direct_log"])), ACCUMULATE_PY)
    oldest = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 400000 }"
    write_model(
        repo,
        "acc_oldest",
        accumulate_config("acc_oldest", 4, strategy=oldest, log=str(paths["oldest_log"])),
        ACCUMULATE_PY,
    )
    write_model(repo, "acc_idle", accumulate_config("acc_idle", 0, idle_us=400_000), ACCUMULATE_PY)
    write_model(repo, "implicit_state", STATEFUL_CONFIG, STATEFUL_PY)
    srv = ServerProcess([repo], [], paths["base"] / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    """A client of the module's server."""
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def value_input(x: int, batched: bool = False) -> list[grpcclient.InferInput]:
    """INPUT = [x] (or [[x]] for batching models)."""
    array = np.array([[x]] if batched else [x], dtype=np.int32)
    i = grpcclient.InferInput("INPUT", list(array.shape), "INT32")
    i.set_data_from_numpy(array)
    return [i]


def infer(client: Any, model: str, x: int, sid: int | str, start: bool = False, end: bool = False) -> int:
    """One unary sequence request; returns OUTPUT."""
    batched = model in ("acc_direct", "acc_oldest")
    result = client.infer(model, value_input(x, batched), sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT").reshape(-1)[0])


class Stream:
    """A stream whose results are collected in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, model: str, x: int, sid: int | str, start: bool = False, end: bool = False, rid: str = "") -> None:
        """Send one request on the stream."""
        batched = model in ("acc_direct", "acc_oldest")
        self.client.async_stream_infer(
            model, value_input(x, batched), request_id=rid, sequence_id=sid, sequence_start=start, sequence_end=end
        )

    def get(self) -> tuple[str, int]:
        """(request id, OUTPUT) of the next response; fails on an error response."""
        result, error = self.results.get(timeout=TIMEOUT_S)
        assert error is None, error
        return result.get_response().id, int(result.as_numpy("OUTPUT").reshape(-1)[0])

    def close(self) -> None:
        """Half-close and wait."""
        self.client.stop_stream()
        self.client.close()


@pytest.mark.parametrize(("model", "ids"), [("acc_u64", (11, 2**40 + 7)), ("acc_str", ("seq-a", "seq-b"))])
def test_interleaved_sequences_over_one_stream(server: ServerProcess, model: str, ids: tuple[Any, Any]) -> None:
    a, b = ids
    s = Stream(server.url)
    try:
        # acc_u64 / acc_str have one slot each: b waits in the backlog until a ends, then continues
        plan = [(a, 1, True, False), (b, 100, True, False), (a, 2, False, False), (b, 200, False, False)]
        plan += [(a, 3, False, True), (b, 300, False, True)]
        for k, (sid, x, start, end) in enumerate(plan):
            s.send(model, x, sid, start, end, rid=str(k))
        got = dict(s.get() for _ in plan)
        assert got == {"0": 1, "2": 3, "4": 6, "1": 100, "3": 300, "5": 600}
    finally:
        s.close()


@pytest.mark.parametrize(("model", "ids"), [("acc_u64", (5, 6)), ("acc_str", ("x1", "x2"))])
def test_sequences_over_unary_calls(client: Any, model: str, ids: tuple[Any, Any]) -> None:
    a, b = ids
    assert infer(client, model, 10, a, start=True) == 10
    assert infer(client, model, 5, a) == 15
    assert infer(client, model, 1, a, end=True) == 16
    assert infer(client, model, 7, b, start=True) == 7
    assert infer(client, model, 7, b, start=True) == 7  # a second START restarts the sequence
    assert infer(client, model, 1, b, end=True) == 8


def test_sequence_errors(client: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_u64", value_input(1))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "inference request to model 'acc_u64' must specify a non-zero or non-empty correlation ID" in str(
        info.value.message()
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_u64", value_input(1), sequence_id=99999)
    assert (
        "inference request for sequence 99999 to model 'acc_u64' must specify the START flag on the first "
        "request of the sequence" in str(info.value.message())
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_str", value_input(1), sequence_id="nope")
    assert "inference request for sequence nope to model 'acc_str' must specify the START flag" in str(
        info.value.message()
    )
    bad = grpcclient.InferInput("INPUT", [2, 1], "INT32")
    bad.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_direct", [bad], sequence_id=3, sequence_start=True)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in str(info.value.message())
    start = grpcclient.InferInput("START", [1, 1], "FP32")
    start.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_direct", [*value_input(1, True), start], sequence_id=3, sequence_start=True)
    assert "unexpected inference input 'START' for model 'acc_direct'" in str(info.value.message())


def read_batches(log: Path) -> list[list[dict[str, str]]]:
    """The accumulator's log as executions: consecutive lines with the same 'batch' count."""
    lines = [dict(kv.split("=", 1) for kv in line.split()) for line in log.read_text().splitlines() if line]
    batches, k = [], 0
    while k < len(lines):
        n = int(lines[k]["batch"])
        batches.append(lines[k : k + n])
        k += n
    return batches


def test_direct_pads_idle_slots_with_not_ready_requests(client: Any, paths: dict[str, Path]) -> None:
    model = "acc_direct"
    for sid in (21, 22, 23):
        assert infer(client, model, sid, sid, start=True) == sid
    assert infer(client, model, 1, 21, end=True) == 22
    assert infer(client, model, 1, 22, end=True) == 23
    assert infer(client, model, 1, 23) == 24  # slot 2 alone: slots 0 and 1 are padding
    last = read_batches(paths["direct_log"])[-1]
    assert [(r["corrid"], r["ready"]) for r in last] == [("0", "0"), ("0", "0"), ("23", "1")]
    assert infer(client, model, 1, 23, end=True) == 25
    first = read_batches(paths["direct_log"])[0]
    assert first[0]["start"] == "1.0" and first[0]["end"] == "False" and first[0]["ready"] == "1"


def test_oldest_batches_across_sequences(server: ServerProcess, paths: dict[str, Path]) -> None:
    s = Stream(server.url)
    try:
        for sid in (31, 32, 33):
            s.send("acc_oldest", sid, sid, start=True, rid=f"s{sid}")
        assert dict(s.get() for _ in range(3)) == {"s31": 31, "s32": 32, "s33": 33}
        for sid in (31, 32, 33):
            s.send("acc_oldest", 1, sid, end=True, rid=f"e{sid}")
        assert dict(s.get() for _ in range(3)) == {"e31": 32, "e32": 33, "e33": 34}
    finally:
        s.close()
    batches = read_batches(paths["oldest_log"])
    assert [len(b) for b in batches] == [3, 3]  # the queue delay gathered each round into one execution
    assert all(r["ready"] == "1" for b in batches for r in b)
    assert sorted(r["corrid"] for r in batches[1]) == ["31", "32", "33"]
    assert all(r["end"] == "True" for r in batches[1])


def test_idle_sequence_is_reaped_and_backlog_proceeds(server: ServerProcess, client: Any) -> None:
    assert infer(client, "acc_idle", 1, 41, start=True) == 1
    s = Stream(server.url)
    try:
        s.send("acc_idle", 5, 42, start=True, rid="b")  # the only slot is held by 41: backlogged
        with pytest.raises(queue.Empty):
            s.results.get(timeout=0.15)
        assert s.get() == ("b", 5)  # 41 idled out, 42 got its slot
    finally:
        s.close()
    time.sleep(0.6)
    with pytest.raises(InferenceServerException) as info:
        infer(client, "acc_idle", 1, 41)
    assert "inference request for sequence 41 to model 'acc_idle' must specify the START flag" in str(
        info.value.message()
    )


def test_implicit_state_carried_across_requests(client: Any) -> None:
    def call(x: int, sid: int, start: bool = False, end: bool = False) -> list[int]:
        i = grpcclient.InferInput("INPUT", [1], "INT32")
        i.set_data_from_numpy(np.array([x], dtype=np.int32))
        result = client.infer(
            "implicit_state", [i], sequence_id=sid, sequence_start=start, sequence_end=end
        ).get_response()
        assert [o.name for o in result.outputs] == ["OUTPUT"]  # the state output stays on the server
        return np.frombuffer(result.raw_output_contents[0], dtype=np.int32).tolist()

    assert call(1, 51, start=True) == [1]
    assert call(2, 51) == [3]
    assert call(3, 51, end=True) == [6]
    assert call(10, 51, start=True) == [10]  # a new sequence with the same id starts from the initial state
    assert call(5, 51, end=True) == [15]
