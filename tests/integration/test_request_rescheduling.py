"""Request rescheduling and iterative sequences (python_backend README "Request Rescheduling"): a model releases a
request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and gets it back in a later batch; models with
`sequence_batching { iterative_sequence: true }` take requests without a correlation ID. Over gRPC, decoupled
and not, as Triton's."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server, write_model

# IN = number of executions wanted; OUT = JSON [[correlation_id, flags] per execution] once they are done
ITERATIVE_PY = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.seen = {}
            self.mode = json.loads(args["model_config"])["parameters"]["MODE"]["string_value"]

        def execute(self, requests):
            responses = []
            for request in requests:
                wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                key = (request.correlation_id(), request.request_id())
                runs = self.seen.setdefault(key, [])
                runs.append([request.correlation_id(), request.flags()])
                if len(runs) < wanted:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    responses.append(None if self.mode != "answer_anyway" else self.answer(runs))
                    continue
                del self.seen[key]
                responses.append(self.answer(runs))
            return responses

        def answer(self, runs):
            out = np.array([json.dumps(runs)], dtype=np.object_)
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)])
"""

# the README's decoupled example: IN responses counting down to 0, one per execution
DECOUPLED_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.remaining = {}

        def execute(self, requests):
            for request in requests:
                key = request.correlation_id()
                if key not in self.remaining:
                    self.remaining[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
                self.remaining[key] -= 1
                sender = request.get_response_sender()
                out = pb_utils.Tensor("OUT", np.array([self.remaining[key]], np.int32))
                if self.remaining[key] <= 0:
                    del self.remaining[key]
                    sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    sender.send(pb_utils.InferenceResponse([out]))
            return None
"""


def _config(name: str, out_type: str, iterative: bool = True, decoupled: bool = False, mode: str = "") -> str:
    seq = "sequence_batching { iterative_sequence: true }" if iterative else ""
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: {out_type} dims: [ 1 ] }} ]
        {seq}
        {policy}
        parameters {{ key: "MODE" value: {{ string_value: "{mode}" }} }}
    """


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("resched")
    repo = tmp / "repo"
    write_model(repo, "iterative", _config("iterative", "TYPE_STRING"), ITERATIVE_PY)
    write_model(repo, "not_iterative", _config("not_iterative", "TYPE_STRING", iterative=False), ITERATIVE_PY)
    write_model(repo, "answers_anyway", _config("answers_anyway", "TYPE_STRING", mode="answer_anyway"), ITERATIVE_PY)
    write_model(repo, "countdown", _config("countdown", "TYPE_INT32", decoupled=True), DECOUPLED_PY)
    with running_server([repo], tmp / "server.log") as srv:
        yield srv


def _in(n: int) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("IN", [1], "INT32")
    x.set_data_from_numpy(np.array([n], np.int32))
    return [x]


def _runs(result: Any) -> list[list[int]]:
    return list(json.loads(result.as_numpy("OUT")[0]))


def test_a_rescheduled_request_runs_again_in_its_own_sequence(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        runs = _runs(client.infer("iterative", _in(4), request_id="a"))  # no correlation ID: accepted
        assert len(runs) == 4
        assert len({cid for cid, _ in runs}) == 1 and runs[0][0] != 0  # one sequence of its own
        assert [flags for _, flags in runs] == [1, 0, 0, 0]  # START, then neither START nor END (as Triton)
        # a client's correlation ID is kept; another request gets a sequence of its own
        runs = _runs(client.infer("iterative", _in(3), request_id="b", sequence_id=77, sequence_start=True))
        assert runs == [[77, 1], [77, 0], [77, 0]]
        assert _runs(client.infer("iterative", _in(1), request_id="c")) != runs


def test_concurrent_iterative_requests_stay_apart(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        results: queue.Queue[Any] = queue.Queue()
        for n in (5, 2, 3):
            client.async_infer(
                "iterative", _in(n), lambda result, error: results.put((result, error)), request_id=f"n{n}"
            )
        got = sorted(len(_runs(r)) for r, e in (results.get(timeout=60) for _ in range(3)) if e is None)
    assert got == [2, 3, 5]


def test_decoupled_rescheduling_streams_every_response(server: ServerProcess) -> None:
    responses: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer("countdown", _in(4), enable_empty_final_response=True)
        values = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            if result.as_numpy("OUT") is not None:
                values.append(int(result.as_numpy("OUT")[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    assert values == [3, 2, 1, 0]


def test_a_model_that_is_no_iterative_sequence_cannot_reschedule(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("not_iterative", _in(2))
        assert info.value.message() == (
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured "
            "to handle such a flag."
        )
        assert len(_runs(client.infer("not_iterative", _in(1), request_id="next"))) == 1  # it keeps serving


def test_a_rescheduled_request_must_get_none(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("answers_anyway", _in(2))
        assert "Expected a None object in the execute function return list for reschduled request" in str(
            info.value.message()
        )
        assert len(_runs(client.infer("answers_anyway", _in(1), request_id="next"))) == 1


def test_the_server_log_has_no_traceback(server: ServerProcess) -> None:
    assert "Traceback" not in Path(server.log_path).read_text(errors="replace")
