"""Under concurrent load with a worker killed mid-way, every request gets exactly one answer and serving goes on."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.conftest import write_model
from tests.integration.models import python_config

CONFIG = python_config(
    "slowish",
    [("IN", "TYPE_FP32", [1])],
    [("OUT", "TYPE_FP32", [1])],
    max_batch_size=8,
    extra="instance_group [ { count: 2 kind: KIND_CPU } ]\ndynamic_batching { max_queue_delay_microseconds: 1000 }",
)
MODEL = """
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.01)
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
            return out
"""


def test_each_request_answered_once_while_a_worker_is_killed(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    write_model(tmp_path, "slowish", CONFIG, MODEL)
    server = start_server([tmp_path])
    client = grpcclient.InferenceServerClient(server.url)
    total = 300
    answers: dict[int, list[str]] = {i: [] for i in range(total)}
    lock = threading.Lock()
    done = threading.Event()

    def callback(i: int, result: object, error: object) -> None:
        with lock:
            if error is not None:
                answers[i].append(f"error:{error.status()}")  # type: ignore[attr-defined]
            else:
                value = float(result.as_numpy("OUT")[0, 0])  # type: ignore[attr-defined]
                answers[i].append("ok" if value == i + 1 else f"wrong:{value}")
            if all(answers[k] for k in answers):
                done.set()

    for i in range(total):
        x = grpcclient.InferInput("IN", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[i]], np.float32))
        client.async_infer("slowish", [x], lambda result, error, i=i: callback(i, result, error), request_id=str(i))
        if i == total // 3:
            os.kill(server.worker_pids()[0], signal.SIGKILL)
    assert done.wait(60), [i for i, a in answers.items() if not a][:10]
    time.sleep(0.5)  # a late duplicate would arrive now
    assert all(len(a) == 1 for a in answers.values()), {i: a for i, a in answers.items() if len(a) != 1}
    outcomes = [a[0] for a in answers.values()]
    assert not [o for o in outcomes if o.startswith("wrong")]
    assert set(outcomes) <= {"ok", "error:StatusCode.UNAVAILABLE"}
    assert outcomes.count("ok") >= total // 2  # only the killed instance's batches failed
    assert "exited; restarting it" in server.log()  # the kill really happened under load
    # the server keeps serving once the instance is back
    deadline = time.monotonic() + 20
    while not client.is_model_ready("slowish") and time.monotonic() < deadline:
        time.sleep(0.05)
    x = grpcclient.InferInput("IN", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[41]], np.float32))
    assert client.infer("slowish", [x]).as_numpy("OUT")[0, 0] == 42
    stats = client.get_inference_statistics("slowish").model_stats[0].inference_stats
    assert stats.success.count + stats.fail.count == total + 1
    client.close()
