"""ModelStreamInfer and decoupled models through the real tritonclient.grpc streaming API."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_example
from tests.integration.test_stream_models import write_repeat, write_square

TIMEOUT_S = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One server with repeat_int32, square_int32, identity_fp32 and raise_error."""
    from tests.conftest import ServerProcess

    base = tmp_path_factory.mktemp("stream")
    repo = base / "repo"
    repo.mkdir()
    write_repeat(repo)
    write_square(repo)
    copy_example(repo, "identity_fp32", "raise_error")
    srv = ServerProcess([repo], [], base / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


class Stream:
    """A started stream whose callback results land in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def get(self) -> tuple[Any, Any]:
        """The next (result, error)."""
        return self.results.get(timeout=TIMEOUT_S)

    def close(self) -> None:
        """Half-close and wait for the server to finish the stream."""
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: Any) -> Iterator[Stream]:
    """A stream on the module's server."""
    s = Stream(server.url)
    yield s
    s.close()


def repeat_inputs(values: list[int], delay_ms: int = 0, wait_ms: int = 0) -> list[grpcclient.InferInput]:
    """Inputs of repeat_int32."""
    arrays = {
        "IN": np.array(values, dtype=np.int32),
        "DELAY": np.full(len(values), delay_ms, dtype=np.uint32),
        "WAIT": np.array([wait_ms], dtype=np.uint32),
    }
    inputs = []
    for name, array in arrays.items():
        i = grpcclient.InferInput(name, list(array.shape), "INT32" if array.dtype == np.int32 else "UINT32")
        i.set_data_from_numpy(array)
        inputs.append(i)
    return inputs


def final_flag(result: Any) -> bool:
    """triton_final_response of a streamed result."""
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def fp32_input(value: float) -> grpcclient.InferInput:
    """INPUT0 of identity_fp32 / raise_error: FP32 [1, 16] filled with value."""
    i = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    i.set_data_from_numpy(np.full((1, 16), value, dtype=np.float32))
    return i


def test_repeat_sends_n_responses_in_order_then_empty_final(stream: Stream) -> None:
    values = [4, 2, 0, 1, 7]
    stream.client.async_stream_infer(
        "repeat_int32", repeat_inputs(values, delay_ms=5), request_id="r1", enable_empty_final_response=True
    )
    for idx, value in enumerate(values):
        result, error = stream.get()
        assert error is None
        assert result.get_response().id == "r1"
        assert result.as_numpy("OUT").tolist() == [value]
        assert result.as_numpy("IDX").tolist() == [idx]
        assert final_flag(result) is False
    result, error = stream.get()
    assert error is None
    response = result.get_response()
    assert final_flag(result) is True
    assert len(response.outputs) == 0
    assert (response.id, response.model_name, response.model_version) == ("r1", "repeat_int32", "1")


def test_no_empty_final_unless_asked(stream: Stream) -> None:
    stream.client.async_stream_infer("repeat_int32", repeat_inputs([1, 2]), request_id="a")
    stream.client.async_stream_infer(
        "repeat_int32", repeat_inputs([3]), request_id="b", enable_empty_final_response=True
    )
    got = [stream.get() for _ in range(4)]
    assert all(e is None for _, e in got)
    by_id: dict[str, list[tuple[list[int], bool]]] = {}
    for r, _ in got:
        out = r.as_numpy("OUT")
        by_id.setdefault(r.get_response().id, []).append((out.tolist() if out is not None else [], final_flag(r)))
    assert by_id == {"a": [([1], False), ([2], False)], "b": [([3], False), ([], True)]}
    with pytest.raises(queue.Empty):
        stream.results.get(timeout=0.5)


def test_zero_responses_and_square_model(stream: Stream) -> None:
    stream.client.async_stream_infer(
        "repeat_int32", repeat_inputs([]), request_id="zero", enable_empty_final_response=True
    )
    result, error = stream.get()
    assert error is None and final_flag(result) and result.get_response().id == "zero"
    for n in (3, 1, 0, 2):
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([n], dtype=np.int32))
        stream.client.async_stream_infer("square_int32", [i], request_id=f"sq{n}")
    counts: dict[str, int] = {}
    for _ in range(3 + 1 + 0 + 2):
        result, error = stream.get()
        assert error is None
        rid = result.get_response().id
        assert result.as_numpy("OUT").tolist() == [int(rid[2:])]
        counts[rid] = counts.get(rid, 0) + 1
    assert counts == {"sq3": 3, "sq1": 1, "sq2": 2}


def test_non_decoupled_responses_follow_request_order(stream: Stream) -> None:
    for k in range(20):
        stream.client.async_stream_infer("identity_fp32", [fp32_input(float(k))], request_id=str(k))
    for k in range(20):
        result, error = stream.get()
        assert error is None
        assert result.get_response().id == str(k)
        assert final_flag(result) is True
        assert result.as_numpy("OUTPUT0")[0, 0] == k


def test_errors_are_in_band_and_stream_stays_open(stream: Stream) -> None:
    c = stream.client
    c.async_stream_infer("no_such_model", [fp32_input(1.0)], request_id="e1")
    c.async_stream_infer("raise_error", [fp32_input(-1.0)], request_id="e2")
    c.async_stream_infer("raise_error", [fp32_input(float("nan"))], request_id="e3")
    bad = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    c.async_stream_infer("identity_fp32", [bad], request_id="e4")
    c.async_stream_infer("repeat_int32", repeat_inputs([1, 2])[:1] + repeat_inputs([1])[1:], request_id="e5")
    c.async_stream_infer("identity_fp32", [fp32_input(5.0)], request_id="ok")
    errors = {}
    ok = None
    for _ in range(6):
        result, error = stream.get()
        if error is None:
            ok = result
        else:
            assert isinstance(error, InferenceServerException)
            errors[len(errors)] = error.message()
    assert ok is not None and ok.get_response().id == "ok"
    messages = list(errors.values())  # e5 (decoupled) may come at any place, the others in request order
    assert "IN and DELAY shape mismatch" in messages
    messages.remove("IN and DELAY shape mismatch")
    assert messages[0] == "Request for unknown model: 'no_such_model' is not found"
    assert messages[1].startswith("Failed to process the request(s) for model 'raise_error_0', message: ")
    assert "negative input is not allowed" in messages[1]
    assert messages[2] == "input contains NaN"
    assert "unexpected shape for input 'INPUT0' for model 'identity_fp32'" in messages[3]


def test_error_response_carries_request_id(server: Any) -> None:
    s = Stream(server.url)
    try:
        s.client.async_stream_infer("raise_error", [fp32_input(float("nan"))], request_id="nan-1")
        _, error = s.get()
        assert error is not None and error.message() == "input contains NaN"
    finally:
        s.close()


def test_model_infer_on_decoupled_model_is_unsupported(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("repeat_int32", repeat_inputs([1]))
        assert info.value.status() == "StatusCode.UNIMPLEMENTED"
        assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    finally:
        client.close()


def test_stream_stats_count_success(server: Any, tmp_path: Path) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        before = client.get_inference_statistics("square_int32").model_stats[0].inference_stats.success.count
        s = Stream(server.url)
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([2], dtype=np.int32))
        s.client.async_stream_infer("square_int32", [i], enable_empty_final_response=True)
        assert [final_flag(s.get()[0]) for _ in range(3)] == [False, False, True]
        s.close()
        after = client.get_inference_statistics("square_int32").model_stats[0].inference_stats.success.count
        assert after == before + 1
    finally:
        client.close()
