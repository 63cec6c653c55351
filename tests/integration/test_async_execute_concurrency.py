"""Decoupled `async def execute` models that await a decoupled BLS call run concurrently, even on a busy machine
(the shape of Triton's L0_backend_python/async_execute test_concurrent_execute_multi_request_bls).

The caller iterates the BLS response iterator with a plain `for` inside its coroutine, as Triton's model does:
exec(decoupled=True) must return only once the first response is there (Triton's does), so that loop never
blocks the instance's event loop while other requests' coroutines wait to run."""

from __future__ import annotations

import queue
import subprocess
import sys
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
max_batch_size: 8
input [ {{ name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
model_transaction_policy {{ decoupled: true }}
"""

# sleeps WAIT_SECONDS without blocking its loop, then answers with the final flag on the data response
SLEEPER_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        senders = []
        waits = []
        for request in requests:
            secs = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
            waits += [asyncio.sleep(float(s[0])) for s in secs]
            senders.append((request.get_response_sender(), secs.shape[0]))
        await asyncio.gather(*waits)
        for sender, n in senders:
            out = pb_utils.Tensor("DUMMY_OUT", np.zeros([n, 1], np.float32))
            sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# awaits async_exec(decoupled=True), then iterates the responses with a plain for loop
CALLER_PY = """
import asyncio
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def one(self, request):
        secs = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
        call = pb_utils.InferenceRequest(model_name="sleeper", inputs=[pb_utils.Tensor("WAIT_SECONDS", secs)],
                                         requested_output_names=["DUMMY_OUT"])
        replies = await call.async_exec(decoupled=True)
        sender = request.get_response_sender()
        for reply in replies:
            out = pb_utils.get_output_tensor_by_name(reply, "DUMMY_OUT").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("DUMMY_OUT", out)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*[self.one(r) for r in requests])
        return None
"""

BUSY = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "sleeper", CONFIG.format(name="sleeper"), SLEEPER_PY)
    write_model(repo, "caller", CONFIG.format(name="caller"), CALLER_PY)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two busy processes (this machine's core count in CI is small) for the duration of a test."""
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_four_bls_awaiting_requests_run_concurrently_under_load(server: ServerProcess, cpu_load: None) -> None:
    wait_s, count = 2.0, 4
    client = grpcclient.InferenceServerClient(server.url)
    events: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error, time.monotonic())))
    inp = grpcclient.InferInput("WAIT_SECONDS", [1, 1], "FP32")
    inp.set_data_from_numpy(np.full([1, 1], wait_s, np.float32))
    start = time.monotonic()
    try:
        for _ in range(count):
            client.async_stream_infer("caller", [inp])
            time.sleep(0.3)  # spread out, as on a busy machine: each request's execute starts on its own
        got = []
        while len(got) < count:
            _result, error, at = events.get(timeout=30)
            assert error is None, error
            got.append(at - start)
    finally:
        client.stop_stream()
        client.close()
    # one after the other would take count * wait_s = 8 s; together about 0.9 + 2 s
    assert max(got) < wait_s + 0.3 * count + 2.0, got
