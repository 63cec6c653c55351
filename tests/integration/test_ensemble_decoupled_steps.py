"""Ensembles whose steps include a decoupled model, answered over ModelStreamInfer with as many responses as the
steps produce (zero, one, many, in order, each as soon as it is complete) while the ensemble itself is not marked
decoupled: fan-out (repeat -> square), a step that produces nothing, nested ensembles, and a sequence model
behind the decoupled step. ModelInfer still gets exactly one response, or an error saying why it cannot."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.models import elementwise_py

IO = """
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

# IN = n: n responses OUT = 1..n, DELAY_MS apart, sent from a thread after execute returned; then the final flag.
REPEAT_PY = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    DELAY_MS = 250


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                threading.Thread(target=self.send, args=(request.get_response_sender(), n), daemon=True).start()
            return None

        def send(self, sender, n):
            for k in range(1, n + 1):
                if k > 1:
                    time.sleep(DELAY_MS / 1000)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

SQUARE_PY = elementwise_py("x * x", inp="IN", out="OUT")

# A sequence model: OUT = running sum of IN over the sequence (reset by the START flag).
ACCUMULATE_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.sums = {}

        def execute(self, requests):
            out = []
            for request in requests:
                key = request.correlation_id()
                if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                    self.sums[key] = 0
                x = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                self.sums[key] = self.sums.get(key, 0) + x
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.sums[key]], np.int32))]))
                if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                    del self.sums[key]
            return out
"""


def step(model: str, inp: str, out: str) -> str:
    maps = f'input_map {{ key: "IN" value: "{inp}" }} output_map {{ key: "OUT" value: "{out}" }}'
    return f'{{ model_name: "{model}" model_version: -1 {maps} }}'


def ensemble(name: str, steps: list[str]) -> str:
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        + IO.format()
        + f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


def python_model(name: str, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n' + IO.format() + extra


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "repeat", python_model("repeat", "model_transaction_policy { decoupled: true }\n"), REPEAT_PY)
    write_model(repo, "square", python_model("square"), SQUARE_PY)
    seq = "sequence_batching { max_sequence_idle_microseconds: 10000000 }\n"
    write_model(repo, "accumulate", python_model("accumulate", seq), ACCUMULATE_PY)
    write_model(repo, "fan", ensemble("fan", [step("repeat", "IN", "r"), step("square", "r", "OUT")]))
    write_model(repo, "nested", ensemble("nested", [step("fan", "IN", "f"), step("square", "f", "OUT")]))
    write_model(repo, "seq_fan", ensemble("seq_fan", [step("repeat", "IN", "r"), step("accumulate", "r", "OUT")]))
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def value(n: int) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([n], np.int32))
    return [t]


class Stream:
    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.events: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.events.put((time.monotonic(), result, error)))

    def send(self, model: str, n: int, request_id: str, **kwargs: Any) -> None:
        self.client.async_stream_infer(
            model, value(n), request_id=request_id, enable_empty_final_response=True, **kwargs
        )

    def until_final(self, count: int) -> list[tuple[float, str, int | None]]:
        """(arrival time, request id, OUT or None for the empty final) until `count` finals arrived."""
        out = []
        while count:
            t, result, error = self.events.get(timeout=30)
            assert error is None, str(error)
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            out.append((t, response.id, int(result.as_numpy("OUT")[0]) if response.outputs else None))
            count -= final
        return out

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[Stream]:
    s = Stream(server.url)
    yield s
    s.close()


def test_fan_out_streams_every_response_in_order_as_produced(stream: Stream) -> None:
    stream.send("fan", 3, "three")
    events = stream.until_final(1)
    assert [(rid, v) for _, rid, v in events] == [("three", 1), ("three", 4), ("three", 9), ("three", None)]
    # each response left as soon as its iteration was done, not all at the end (repeat waits 250 ms between)
    assert events[2][0] - events[0][0] > 0.3


@pytest.mark.parametrize(("n", "expected"), [(0, []), (1, [1]), (4, [1, 4, 9, 16])])
def test_zero_one_or_many_responses(stream: Stream, n: int, expected: list[int]) -> None:
    stream.send("fan", n, "r")
    events = stream.until_final(1)
    assert [v for _, _, v in events] == [*expected, None]


def test_several_ensemble_requests_in_flight_on_one_stream(stream: Stream) -> None:
    for n in (2, 0, 3):
        stream.send("fan", n, f"n{n}")
    events = stream.until_final(3)
    by_id: dict[str, list[int | None]] = {}
    for _, rid, v in events:
        by_id.setdefault(rid, []).append(v)
    assert by_id == {"n2": [1, 4, None], "n0": [None], "n3": [1, 4, 9, None]}


def test_nested_ensemble_with_a_decoupled_step(stream: Stream) -> None:
    stream.send("nested", 3, "nested")
    assert [v for _, _, v in stream.until_final(1)] == [1, 16, 81, None]


def test_sequence_model_behind_a_decoupled_step(stream: Stream) -> None:
    # one sequence of three ensemble requests; the repeat step fans each out into n requests to the sequence
    # model. Every step request carries the client's sequence flags (as in Triton), so the requests that start
    # and end the sequence fan out once. Each request is sent once the previous one is complete: the fanned-out
    # responses of two requests in flight could interleave.
    stream.send("seq_fan", 1, "a", sequence_id=77, sequence_start=True)
    events = stream.until_final(1)
    stream.send("seq_fan", 3, "b", sequence_id=77)
    events += stream.until_final(1)
    stream.send("seq_fan", 1, "c", sequence_id=77, sequence_end=True)
    events += stream.until_final(1)
    assert [(rid, v) for _, rid, v in events if v is not None] == [
        ("a", 1),
        ("b", 2),
        ("b", 4),
        ("b", 7),
        ("c", 8),
    ]  # running sums of 1 | 1 2 3 | 1


def test_model_infer_gets_exactly_one_response(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        assert client.infer("fan", value(1)).as_numpy("OUT").tolist() == [1]
        with pytest.raises(InferenceServerException) as e:
            client.infer("fan", value(3))
        assert "the steps produced 3 complete sets of outputs" in str(e.value)
        assert "ModelStreamInfer" in str(e.value)
        assert client.infer("nested", value(1)).as_numpy("OUT").tolist() == [1]
        config = client.get_model_config("fan", as_json=True)["config"]
        assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    finally:
        client.close()
