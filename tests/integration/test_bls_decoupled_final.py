"""A decoupled BLS response iterator yields the final, flags-only response as an empty response, as Triton's does
(n data responses + 1). Models written for Triton count on it (L0_backend_python/decoupled's
decoupled_bls_stream expects n + 1), so a model that counted n would fail in its own error path."""

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
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

# IN = n: n responses OUT = n, then the final flag alone
SQUARE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            sender = r.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Forwards square's data responses from a thread and counts every response it iterates, as Triton's
# decoupled_bls_stream does: it expects n + 1 (the last one empty) and says so when it sees otherwise.
# ASYNC iterates with `async for` over async_exec.
STREAM_PY = """
import asyncio
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

ASYNC = {async_}

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            threading.Thread(target=self.run, args=(r.get_response_sender(), x), daemon=True).start()
        return None

    def run(self, sender, x):
        call = pb_utils.InferenceRequest(
            model_name="square", requested_output_names=["OUT"], inputs=[pb_utils.Tensor("IN", x)])
        if ASYNC:
            async def collect():
                return [resp async for resp in await call.async_exec(decoupled=True)]
            replies = asyncio.run(collect())
        else:
            replies = call.exec(decoupled=True)
        count = 0
        empty = 0
        for reply in replies:
            if reply.output_tensors():
                sender.send(pb_utils.InferenceResponse(reply.output_tensors()))
            else:
                empty += 1
            count += 1
        if count != int(x[0]) + 1 or empty != 1:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"expected {{int(x[0]) + 1}} responses (one empty), got {{count}} ({{empty}} empty)")),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


# execute raises after sending one response, with the request's sender still open (sync, async, or while a
# thread holds the sender and sends later): the request gets the error as its last response, as in Triton
# (where the async variant leaves the stream open forever), and the thread's later send is refused.
RAISE_PY = """
import asyncio
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
            threading.Thread(target=self.later, args=(sender,), daemon=True).start()
        raise ValueError("raised with the sender open")

    def later(self, sender):
        time.sleep(0.3)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            pb_utils.Logger.log_info(f"later send: {e}")
"""
RAISE_ASYNC_PY = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        for r in requests:
            r.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        await asyncio.sleep(0.05)
        raise ValueError("raised with the sender open")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "square", CONFIG.format(name="square"), SQUARE_PY)
    write_model(repo, "bls_stream", CONFIG.format(name="bls_stream"), STREAM_PY.format(async_=False))
    write_model(repo, "bls_stream_async", CONFIG.format(name="bls_stream_async"), STREAM_PY.format(async_=True))
    write_model(repo, "raise_open", CONFIG.format(name="raise_open"), RAISE_PY)
    write_model(repo, "raise_open_async", CONFIG.format(name="raise_open_async"), RAISE_ASYNC_PY)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def stream(url: str, model: str, n: int, timeout_s: float = 20) -> list[Any]:
    """OUT values, then 'final' (or the error text) for one request on a stream."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([n], np.int32))
    client.async_stream_infer(model, [inp], enable_empty_final_response=True)
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            result, error = events.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                got.append(error.message())
                break
            response = result.get_response()
            if response.outputs:
                got.append(int(result.as_numpy("OUT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                got.append("final")
                break
    finally:
        client.stop_stream()
        client.close()
    return got


@pytest.mark.parametrize("model", ["bls_stream", "bls_stream_async"])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_decoupled_bls_iterator_yields_the_final_empty_response(server: ServerProcess, model: str, n: int) -> None:
    assert stream(server.url, model, n) == [n] * n + ["final"]


@pytest.mark.parametrize("model", ["raise_open", "raise_open_async"])
def test_execute_raising_with_an_open_sender_ends_the_request_with_its_error(server: ServerProcess, model: str) -> None:
    got = stream(server.url, model, 1)
    assert got == [1, f"Failed to process the request(s) for model '{model}_0', message: ValueError: raised with the "
                   "sender open"]  # fmt: skip
    assert stream(server.url, "bls_stream", 2) == [2, 2, "final"]  # the server serves on
    if model == "raise_open":
        deadline = time.monotonic() + 5
        while "later send: Unable to send response. Response sender has been closed." not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
