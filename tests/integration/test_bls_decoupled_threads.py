"""A decoupled model that calls a decoupled model through BLS from one thread per request and streams each BLS
response back through its own response sender, with several requests in flight on one gRPC stream. The
cancellation cases run first (the model cancelling its BLS iterator and walking away from it, or iterating on
to the end; the client cancelling its stream mid-way), then every response of the requests after them must
still arrive: state a cancelled call leaves behind must not stall later calls."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, running_server, write_model

CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: true }}
    input [
      {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "CANCEL_AT" data_type: TYPE_INT32 dims: [ 1 ] }}
    ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

# N responses OUT = 0..N-1, DELAY_MS apart, from a thread; stops early (final flag alone) once cancelled.
INNER_PY = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]) / 1000
                threading.Thread(target=self.run, args=(request.get_response_sender(), n, delay), daemon=True).start()
            return None

        def run(self, sender, n, delay):
            for k in range(n):
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))]))
                time.sleep(delay)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# One thread per request: call `inner` (decoupled BLS) and send each of its responses on. CANCEL_AT >= 0:
# cancel the BLS call after that many responses; CANCEL_AT <= -2: also walk away from the iterator at once
# (CANCEL_AT = -2 - k cancels after k responses and breaks out), otherwise iterate on until its final flag.
OUTER_PY = """
    import threading

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.run, args=(request,), daemon=True).start()
            return None

        def run(self, request):
            sender = request.get_response_sender()
            cancel_at = int(pb_utils.get_input_tensor_by_name(request, "CANCEL_AT").as_numpy()[0])
            walk_away = cancel_at <= -2
            if walk_away:
                cancel_at = -2 - cancel_at
            call = pb_utils.InferenceRequest(
                model_name="inner",
                inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in ("N", "DELAY_MS", "CANCEL_AT")],
                requested_output_names=["OUT"],
            )
            responses = call.exec(decoupled=True)
            count = 0
            for response in responses:
                if response.has_error():
                    sender.send(response)
                    continue
                if not response.output_tensors():
                    continue
                sender.send(pb_utils.InferenceResponse(response.output_tensors()))
                count += 1
                if count == cancel_at:
                    responses.cancel()
                    if walk_away:
                        break
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "inner", CONFIG.format(name="inner"), INNER_PY)
    write_model(repo, "outer", CONFIG.format(name="outer"), OUTER_PY)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def inputs(n: int, delay_ms: int, cancel_at: int = -1) -> list[grpcclient.InferInput]:
    out = []
    for name, v in (("N", n), ("DELAY_MS", delay_ms), ("CANCEL_AT", cancel_at)):
        t = grpcclient.InferInput(name, [1], "INT32")
        t.set_data_from_numpy(np.array([v], np.int32))
        out.append(t)
    return out


def stream_all(url: str, requests: list[tuple[str, list[grpcclient.InferInput]]], timeout_s: float = 30) -> dict:
    """Send every request on one stream; OUT values per request id once each has its final flag."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    for rid, inp in requests:
        client.async_stream_infer("outer", inp, request_id=rid, enable_empty_final_response=True)
    got: dict[str, list[int]] = {}
    done = 0
    deadline = time.monotonic() + timeout_s
    try:
        while done < len(requests):
            result, error = events.get(timeout=max(0.1, deadline - time.monotonic()))
            assert error is None, str(error)
            response = result.get_response()
            got.setdefault(response.id, [])
            if response.outputs:
                got[response.id].append(int(result.as_numpy("OUT")[0]))
            done += response.parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()
        client.close()
    return got


def test_1_model_cancels_its_bls_stream(server: ServerProcess) -> None:
    got = stream_all(
        server.url,
        [
            ("iterate_on", inputs(20, 50, cancel_at=2)),  # cancel after 2, keep iterating to the final flag
            ("walk_away", inputs(20, 50, cancel_at=-2 - 2)),  # cancel after 2 and stop iterating at once
            ("walk_away_0", inputs(20, 50, cancel_at=-2 - 1)),
        ],
    )
    assert got["walk_away"] == [0, 1]
    assert got["walk_away_0"] == [0]
    assert got["iterate_on"][:2] == [0, 1] and len(got["iterate_on"]) < 20  # stopped early


def test_2_client_cancels_stream_mid_way(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    events: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    for i in range(4):
        client.async_stream_infer("outer", inputs(50, 40), request_id=f"c{i}")
    events.get(timeout=20)  # responses are flowing
    client.stop_stream(cancel_requests=True)
    client.close()


def test_3_every_response_arrives_after_cancellations(server: ServerProcess) -> None:
    for _ in range(3):
        requests = [(f"r{i}", inputs(5 + i, 5)) for i in range(8)]
        got = stream_all(server.url, requests, timeout_s=30)
        assert got == {f"r{i}": list(range(5 + i)) for i in range(8)}
