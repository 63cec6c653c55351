"""In-process instances (TRIREME_INSTANCE_MODE=in_process): the same models answer as with worker processes."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.test_bls import (
    ASYNC_CALLER_PY,
    CALLER_PY,
    DECOUPLED_CALLER_PY,
    IDENTITY_CONFIG,
    IDENTITY_PY,
    REPEAT_CONFIG,
    REPEAT_PY,
)

IN_PROCESS = '\nparameters { key: "TRIREME_INSTANCE_MODE" value: { string_value: "in_process" } }\n'
INLINE = '\nparameters { key: "TRIREME_INSTANCE_MODE" value: { string_value: "in_process_inline" } }\n'
INLINE_MODELS = ("bls_identity", "bls_repeat", "bls_caller", "raiser")  # also written as "<name>_il"

RAISE_PY = """
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("no luck")
"""

SLOW_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            for _ in range(1000):  # 10 s unless cancelled
                if r.is_cancelled():
                    break
                time.sleep(0.01)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([float(r.is_cancelled())], np.float32))]))
        return out
"""

MODELS = {  # name -> (config template, model.py); each is written twice: "<name>" and "<name>_ip"
    "bls_identity": (IDENTITY_CONFIG, IDENTITY_PY),
    "bls_identity_b": (IDENTITY_CONFIG, IDENTITY_PY),
    "bls_caller": (IDENTITY_CONFIG, CALLER_PY),
    "bls_async": (IDENTITY_CONFIG, ASYNC_CALLER_PY),
    "bls_repeat": (REPEAT_CONFIG, REPEAT_PY),
    "bls_decoupled_caller": (IDENTITY_CONFIG, DECOUPLED_CALLER_PY),
    "raiser": (IDENTITY_CONFIG, RAISE_PY),
    "slow": (IDENTITY_CONFIG, SLOW_PY),
}


def _repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    for name, (config, source) in MODELS.items():
        variants = [("", ""), ("_ip", IN_PROCESS)] + ([("_il", INLINE)] if name in INLINE_MODELS else [])
        for suffix, extra in variants:
            text = config.format(name=name + suffix, count=1) if "{name}" in config else config
            text = text.replace('name: "bls_repeat"', f'name: "bls_repeat{suffix}"')
            write_model(repo, name + suffix, text + extra, source)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("inproc")
    with running_server([_repo(tmp)], tmp / "server.log") as s:
        yield s


def _infer(client: Any, model: str, x: np.ndarray, **params: Any) -> Any:
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], parameters=params or None)


def test_in_process_models_have_no_worker_process(server: ServerProcess) -> None:
    # one worker per process-mode model, none for the "_ip" and "_il" twins
    assert len(server.worker_pids()) == len(MODELS)


@pytest.mark.parametrize("size", [4, 300_000])  # inline-sized and arena-sized tensors
def test_identity_answers_the_same(client: Any, size: int) -> None:
    x = np.random.default_rng(0).random(size, dtype=np.float32)
    for model in ("bls_identity", "bls_identity_ip", "bls_identity_il"):
        np.testing.assert_array_equal(_infer(client, model, x).as_numpy("OUTPUT0"), x)


def test_inline_instances_refuse_bls_clearly(client: Any) -> None:
    with pytest.raises(grpcclient.InferenceServerException) as e:
        _infer(client, "bls_caller_il", np.ones(2, np.float32), target="bls_identity")
    assert "in_process_inline" in e.value.message() and "BLS" in e.value.message()
    # the server's loop was not blocked: everything still answers
    np.testing.assert_array_equal(_infer(client, "bls_identity_il", np.ones(2, np.float32)).as_numpy("OUTPUT0"), 1)


@pytest.mark.parametrize(
    ("model", "params"),
    [
        ("bls_caller", {"target": "bls_identity"}),  # sync BLS, to a worker-process model
        ("bls_caller", {"target": "bls_identity_ip"}),  # sync BLS, to an in-process model
        ("bls_async", {}),  # async execute with asyncio.gather of two BLS calls
        ("bls_decoupled_caller", {"target": "bls_repeat"}),  # BLS to a decoupled model
        ("bls_decoupled_caller", {"target": "bls_repeat_ip", "async": True}),
    ],
)
def test_bls_and_async_execute_answer_the_same(client: Any, model: str, params: dict[str, Any]) -> None:
    x = np.array([3, 1, 2], dtype=np.float32)
    a = _infer(client, model, x, **params).as_numpy("OUTPUT0")
    b = _infer(client, model + "_ip", x, **params).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(a, b)
    assert a.size > 0


def test_decoupled_stream_answers_the_same(server: ServerProcess) -> None:
    results: dict[str, list[list[float]]] = {}
    for model in ("bls_repeat", "bls_repeat_ip", "bls_repeat_il"):
        got: queue.Queue[Any] = queue.Queue()
        c = grpcclient.InferenceServerClient(server.url)
        c.start_stream(callback=lambda result, error, got=got: got.put((result, error)))
        inp = grpcclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(np.array([3, 7], np.float32))
        c.async_stream_infer(model, [inp])
        results[model] = []
        for _ in range(3):
            result, error = got.get(timeout=20)
            assert error is None
            results[model].append(result.as_numpy("OUTPUT0").tolist())
        c.stop_stream()
        c.close()
    assert results["bls_repeat"] == results["bls_repeat_ip"] == results["bls_repeat_il"] == [[3, 7], [4, 8], [5, 9]]


def test_model_errors_are_the_same(client: Any) -> None:
    messages = []
    for model in ("raiser", "raiser_ip", "raiser_il"):
        with pytest.raises(grpcclient.InferenceServerException) as e:
            _infer(client, model, np.ones(2, np.float32))
        messages.append(e.value.message().replace(model, "<m>"))
    assert messages[0] == messages[1] == messages[2]
    assert "ValueError: no luck" in messages[0]
    np.testing.assert_array_equal(_infer(client, "bls_identity_ip", np.ones(2, np.float32)).as_numpy("OUTPUT0"), 1)


def test_cancelled_request_is_flagged_while_it_runs(client: Any) -> None:
    done: queue.Queue[Any] = queue.Queue()
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    call = client.async_infer("slow_ip", [inp], callback=lambda result, error: done.put(error))
    time.sleep(0.5)
    call.cancel()
    cancelled_at = time.monotonic()
    assert done.get(timeout=10) is not None  # the client sees CANCELLED
    # the running execute() saw is_cancelled() and returned long before its 10 s
    while client.get_inference_statistics("slow_ip").model_stats[0].execution_count < 1:
        assert time.monotonic() - cancelled_at < 5
        time.sleep(0.05)


def test_unknown_mode_fails_the_load(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "bad"
    config = IDENTITY_CONFIG.format(name="bad_mode", count=1)
    config += '\nparameters { key: "TRIREME_INSTANCE_MODE" value: { string_value: "sideways" } }\n'
    write_model(repo, "bad_mode", config, IDENTITY_PY)
    server = start_server([repo], ["--exit-on-error=false"])
    c = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m for m in c.get_model_repository_index().models}
    c.close()
    assert index["bad_mode"].state == "UNAVAILABLE"
    assert "TRIREME_INSTANCE_MODE" in index["bad_mode"].reason and "sideways" in index["bad_mode"].reason
