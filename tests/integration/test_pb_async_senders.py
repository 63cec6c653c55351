"""Python-backend behaviours as Triton users rely on them: decoupled `async def execute` runs requests of one
instance concurrently; response senders are used before, during and after execute returns (decoupled and
default mode), with Triton's misuse messages."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.models import python_config

ASYNC_CONFIG = python_config(
    "async_sleep",
    [("MS", "TYPE_INT32", [1])],
    [("OUT", "TYPE_INT32", [1])],
    extra="model_transaction_policy { decoupled: true }\ninstance_group [ { count: 1 kind: KIND_CPU } ]",
)

# Sleeps MS milliseconds without blocking the instance's event loop, then answers; a negative MS raises.
ASYNC_PY = """
    import asyncio

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            for request in requests:
                ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
                if ms[0] < 0:
                    raise ValueError(f"async failure {ms[0]}")
                await asyncio.sleep(ms[0] / 1000.0)
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            return None
"""

SLEEPER_CONFIG = python_config(
    "sleeper",
    [("MS", "TYPE_INT32", [1])],
    [("OUT", "TYPE_INT32", [1])],
    extra="instance_group [ { count: 3 kind: KIND_CPU } ]",
)

# A blocking model with three instances: sleeps MS milliseconds and echoes MS.
SLEEPER_PY = """
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
                time.sleep(ms[0] / 1000.0)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
            return out
"""

ASYNC_BLS_CONFIG = ASYNC_CONFIG.replace('"async_sleep"', '"async_bls"')

# Awaits a BLS call to `sleeper` (async_exec) and forwards its answer: one instance, calls overlap.
ASYNC_BLS_PY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        async def execute(self, requests):
            for request in requests:
                call = pb_utils.InferenceRequest(
                    model_name="sleeper",
                    inputs=[pb_utils.get_input_tensor_by_name(request, "MS")],
                    requested_output_names=["OUT"],
                )
                reply = await call.async_exec()
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(reply.output_tensors(), error=reply.error()),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            return None
"""

SENDER_CONFIG = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    model_transaction_policy {{ decoupled: {decoupled} }}
    input [
      {{ name: "BEFORE" data_type: TYPE_UINT8 dims: [ 1 ] }},
      {{ name: "FINAL_BEFORE" data_type: TYPE_BOOL dims: [ 1 ] }},
      {{ name: "RETURN" data_type: TYPE_BOOL dims: [ 1 ] }},
      {{ name: "AFTER" data_type: TYPE_UINT8 dims: [ 1 ] }},
      {{ name: "FINAL_AFTER" data_type: TYPE_BOOL dims: [ 1 ] }}
    ]
    output [ {{ name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

# Sends BEFORE responses (index 1000+i) during execute, optionally the final flag, optionally returns a
# response (index 0), then AFTER responses (2000+i) and the final flag from a thread 100 ms after returning.
# Exceptions raised by later sends are logged with their text.
SENDER_PY = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    def response(index):
        return pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], np.int32))])


    class TritonPythonModel:
        def initialize(self, args):
            self.threads = []

        def execute(self, requests):
            returned = []
            for request in requests:
                def value(name):
                    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0]

                sender = request.get_response_sender()
                for i in range(value("BEFORE")):
                    sender.send(response(1000 + i))
                if value("FINAL_BEFORE"):
                    sender.send(flags=FINAL)
                returned.append(response(0) if value("RETURN") else None)
                t = threading.Thread(
                    target=self.later, args=(sender, int(value("AFTER")), bool(value("FINAL_AFTER")))
                )
                t.start()
                self.threads.append(t)
            return returned if any(r is not None for r in returned) else None

        def later(self, sender, count, final):
            time.sleep(0.1)
            try:
                for i in range(count):
                    sender.send(response(2000 + i))
                if final:
                    sender.send(flags=FINAL)
            except Exception as e:
                pb_utils.Logger.log_error(f"send after return failed: {e}")

        def finalize(self):
            for t in self.threads:
                t.join(5)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "async_sleep", ASYNC_CONFIG, ASYNC_PY)
    write_model(repo, "sleeper", SLEEPER_CONFIG, SLEEPER_PY)
    write_model(repo, "async_bls", ASYNC_BLS_CONFIG, ASYNC_BLS_PY)
    write_model(repo, "sender_decoupled", SENDER_CONFIG.format(name="sender_decoupled", decoupled="true"), SENDER_PY)
    write_model(repo, "sender_default", SENDER_CONFIG.format(name="sender_default", decoupled="false"), SENDER_PY)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def int_input(name: str, value: int, datatype: str = "INT32") -> grpcclient.InferInput:
    dtype = {"INT32": np.int32, "UINT8": np.uint8}[datatype]
    t = grpcclient.InferInput(name, [1], datatype)
    t.set_data_from_numpy(np.array([value], dtype))
    return t


def bool_input(name: str, value: bool) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, [1], "BOOL")
    t.set_data_from_numpy(np.array([value], bool))
    return t


def sender_inputs(
    before: int = 0, final_before: bool = False, returned: bool = False, after: int = 0, final_after: bool = False
) -> list[grpcclient.InferInput]:
    return [
        int_input("BEFORE", before, "UINT8"),
        bool_input("FINAL_BEFORE", final_before),
        bool_input("RETURN", returned),
        int_input("AFTER", after, "UINT8"),
        bool_input("FINAL_AFTER", final_after),
    ]


class Stream:
    """One ModelStreamInfer call; every callback lands in a queue with its arrival time."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.events: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        self.t0 = time.monotonic()
        self.client.start_stream(callback=lambda result, error: self.events.put((time.monotonic(), result, error)))

    def send(self, model: str, inputs: list[grpcclient.InferInput], request_id: str) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)

    def collect_finals(self, count: int, timeout_s: float = 20.0) -> list[tuple[float, Any, Any]]:
        """Every event until `count` requests are complete (final flag or error)."""
        out: list[tuple[float, Any, Any]] = []
        finals = 0
        deadline = time.monotonic() + timeout_s
        while finals < count:
            t, result, error = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            out.append((t - self.t0, result, error))
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                finals += 1
        return out

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[Stream]:
    s = Stream(server.url)
    yield s
    s.close()


def test_async_decoupled_executions_overlap_on_one_instance(stream: Stream) -> None:
    # four requests that each await 1 s, then a short one: serially this takes over 4 s
    for i in range(4):
        stream.send("async_sleep", [int_input("MS", 1000)], f"long{i}")
    stream.send("async_sleep", [int_input("MS", 50)], "short")
    events = stream.collect_finals(5)
    assert all(error is None for _, _, error in events)
    order = [result.get_response().id for _, result, _ in events]
    assert order[0] == "short", order  # the short request did not wait for the long ones
    assert sorted(order[1:]) == ["long0", "long1", "long2", "long3"]
    assert events[-1][0] < 3.0, events  # all four long sleeps overlapped (serial: > 4 s)


def test_async_decoupled_executions_overlap_while_awaiting_bls(stream: Stream) -> None:
    # three requests that each await a 1 s BLS call: the one async_bls instance runs them at once
    for i in range(3):
        stream.send("async_bls", [int_input("MS", 1000)], f"r{i}")
    events = stream.collect_finals(3)
    assert all(error is None for _, _, error in events)
    assert [r.as_numpy("OUT").tolist() for _, r, _ in events] == [[1000]] * 3
    assert events[-1][0] < 2.5, events  # serially over 3 s


def test_async_decoupled_error_is_logged_and_answered(server: ServerProcess, stream: Stream) -> None:
    stream.send("async_sleep", [int_input("MS", -7)], "bad")
    stream.send("async_sleep", [int_input("MS", 10)], "good")
    events = stream.collect_finals(2)
    errors = [str(error) for _, _, error in events if error is not None]
    assert len(errors) == 1 and "ValueError: async failure -7" in errors[0]
    good = [r for _, r, e in events if e is None]
    assert good[0].as_numpy("OUT").tolist() == [10]
    deadline = time.monotonic() + 10
    while "async failure -7" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.log()
    assert "Traceback" in log and "ValueError: async failure -7" in log


def indexes(events: list[tuple[float, Any, Any]]) -> list[int]:
    """INDEX of every non-empty response, in arrival order (empty finals are skipped)."""
    out = []
    for _, result, error in events:
        assert error is None, error
        if result.get_response().outputs:
            out.append(int(result.as_numpy("INDEX")[0]))
    return out


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (dict(final_before=True), []),
        (dict(final_after=True), []),
        (dict(before=1, final_before=True), [1000]),
        (dict(after=1, final_after=True), [2000]),
        (dict(before=2, final_before=True), [1000, 1001]),
        (dict(after=2, final_after=True), [2000, 2001]),
        (dict(before=1, after=3, final_after=True), [1000, 2000, 2001, 2002]),
    ],
)
def test_decoupled_sender_before_and_after_return(stream: Stream, case: dict[str, Any], expected: list[int]) -> None:
    stream.send("sender_decoupled", sender_inputs(**case), "r")
    assert indexes(stream.collect_finals(1)) == expected


def test_decoupled_senders_of_several_requests_in_flight(stream: Stream) -> None:
    cases = [
        dict(final_before=True),
        dict(final_after=True),
        dict(before=1, final_before=True),
        dict(after=2, final_after=True),
        dict(before=1, after=3, final_after=True),
    ]
    for i, case in enumerate(cases):
        stream.send("sender_decoupled", sender_inputs(**case), str(i))
    events = stream.collect_finals(len(cases))
    by_request: dict[str, list[int]] = {}
    for _, result, error in events:
        assert error is None
        response = result.get_response()
        by_request.setdefault(response.id, [])
        if response.outputs:
            by_request[response.id].append(int(result.as_numpy("INDEX")[0]))
    assert by_request == {"0": [], "1": [], "2": [1000], "3": [2000, 2001], "4": [1000, 2000, 2001, 2002]}


def test_decoupled_model_must_not_return_responses(server: ServerProcess, stream: Stream) -> None:
    stream.send("sender_decoupled", sender_inputs(returned=True, after=1, final_after=True), "r")
    events = stream.collect_finals(1)
    assert len(events) == 1
    assert "using the decoupled mode and the execute function must return None" in str(events[0][2])
    time.sleep(0.5)  # the thread's later send is refused, and logged
    assert stream.events.empty()
    assert "send after return failed: Unable to send response. Response sender has been closed." in server.log()


def test_decoupled_send_after_the_final_flag_is_refused(server: ServerProcess, stream: Stream) -> None:
    text = "send after return failed: Unable to send response. Response sender has been closed."
    before = server.log().count(text)
    stream.send("sender_decoupled", sender_inputs(before=1, final_before=True, after=1), "r")
    assert indexes(stream.collect_finals(1)) == [1000]
    deadline = time.monotonic() + 10
    while server.log().count(text) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.log().count(text) == before + 1
    time.sleep(0.3)
    assert stream.events.empty()  # nothing after the final flag reached the client


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (dict(returned=True), 0),
        (dict(before=1, final_before=True), 1000),
        (dict(after=1, final_after=True), 2000),
        (dict(before=2, final_before=True), 1000),  # the second send raises; the first response stands
    ],
)
def test_default_mode_model_may_answer_through_its_sender(
    server: ServerProcess, case: dict[str, Any], expected: int
) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        result = client.infer("sender_default", sender_inputs(**case), client_timeout=20)
        assert int(result.as_numpy("INDEX")[0]) == expected
    finally:
        client.close()


def test_default_mode_sender_misuse_messages(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer("sender_default", sender_inputs(final_before=True), client_timeout=20)
        assert "Non-decoupled model cannot send complete final before sending a response" in str(e.value)
        # answered through the sender and returned as well: the client gets the sender's response
        result = client.infer("sender_default", sender_inputs(before=1, final_before=True, returned=True))
        assert int(result.as_numpy("INDEX")[0]) == 1000
        # a second response after return is refused with Triton's message
        result = client.infer("sender_default", sender_inputs(before=1, after=1, final_after=True))
        assert int(result.as_numpy("INDEX")[0]) == 1000
    finally:
        client.close()
    deadline = time.monotonic() + 10
    text = "send after return failed: Unable to send response. Non-decoupled model cannot send more than one response."
    while text not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.log()
    assert text in log
    assert "message: Unable to send response. Non-decoupled model cannot send more than one response." in log


def test_default_mode_senders_from_threads_with_requests_in_flight(server: ServerProcess) -> None:
    # several clients at once, each answered exactly once, from threads after execute returned
    client = grpcclient.InferenceServerClient(server.url)
    results: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        r = client.infer("sender_default", sender_inputs(after=1, final_after=True), client_timeout=20)
        with lock:
            results.append(int(r.as_numpy("INDEX")[0]))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    client.close()
    assert results == [2000] * 6
