"""BLS through a real server: Python models calling Python models (sync, async, decoupled, errors, cycles)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration import models
from tests.integration.models import python_config

IDENTITY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
"""

IDENTITY_PY = models.IDENTITY_PY

# forwards INPUT0 to the model named by the request parameter "target" (default bls_identity), asking that
# model to forward to "then" in turn (when it is a caller too)
CALLER_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name=params.get("target", "bls_identity"),
                inputs=[pb_utils.Tensor(params.get("input_name", "INPUT0"), x)],
                requested_output_names=["OUTPUT0"],
                timeout=params.get("timeout", 0),
                parameters={"target": params.get("then", "bls_identity"), "then": params.get("then", "bls_identity")},
            )
            reply = call.exec()
            if reply.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("BLS failed: " + reply.error().message())))
                continue
            y = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array(y) * 2)]))
        return responses
"""

# an async execute that runs two BLS calls concurrently with asyncio.gather
ASYNC_CALLER_PY = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name, inputs=[pb_utils.Tensor("INPUT0", x)], requested_output_names=["OUTPUT0"]
                ).async_exec()
                for name in ("bls_identity", "bls_identity_b")
            ]
            a, b = await asyncio.gather(*calls)
            ya = pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy()
            yb = pb_utils.get_output_tensor_by_name(b, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", ya + yb)]))
        return responses
"""

REPEAT_CONFIG = python_config("bls_repeat", extra="model_transaction_policy { decoupled: true }")

# decoupled: sends int(INPUT0[0]) responses, the k-th being INPUT0 + k, then the final flag alone
REPEAT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for k in range(int(x[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + k)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# collects every response of a decoupled BLS call (sync or async iteration) into one output
DECOUPLED_CALLER_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name=params.get("target", "bls_repeat"),
                inputs=[pb_utils.Tensor("INPUT0", x)],
                requested_output_names=["OUTPUT0"],
            )
            parts = []
            errors = []
            if params.get("async"):
                async for reply in await call.async_exec(decoupled=True):
                    if not reply.output_tensors():  # the final, flags-only response (Triton yields it too)
                        continue
                    parts.append(pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy().copy())
            else:
                for reply in call.exec(decoupled=True):
                    if reply.has_error():
                        errors.append(reply.error().message())
                        continue
                    if not reply.output_tensors():
                        continue
                    parts.append(pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy().copy())
            if errors:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("; ".join(errors))))
                continue
            out = np.concatenate(parts) if parts else np.zeros([0], np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
"""


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for name, count in (("bls_identity", 1), ("bls_identity_b", 1)):
        write_model(repo, name, IDENTITY_CONFIG.format(name=name, count=count), IDENTITY_PY)
    write_model(repo, "bls_caller", IDENTITY_CONFIG.format(name="bls_caller", count=1), CALLER_PY)
    write_model(repo, "bls_caller2", IDENTITY_CONFIG.format(name="bls_caller2", count=2), CALLER_PY)
    write_model(repo, "bls_async", IDENTITY_CONFIG.format(name="bls_async", count=1), ASYNC_CALLER_PY)
    write_model(repo, "bls_repeat", REPEAT_CONFIG, REPEAT_PY)
    write_model(
        repo, "bls_decoupled_caller", IDENTITY_CONFIG.format(name="bls_decoupled_caller", count=1), DECOUPLED_CALLER_PY
    )
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with the BLS test models."""
    tmp = tmp_path_factory.mktemp("bls")
    with running_server([_repo(tmp)], tmp / "server.log") as server:
        yield server


def _infer(client, model: str, x: np.ndarray, **params):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], parameters=params or None)


def _stats(client, model: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    s = client.get_inference_statistics(model).model_stats[0].inference_stats
    return s.success.count, s.fail.count


def test_sync_bls_to_python_model(client) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(8, dtype=np.float32)
    before = _stats(client, "bls_identity")[0]
    result = _infer(client, "bls_caller", x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
    # the nested request went through the target's scheduler and statistics
    assert _stats(client, "bls_identity")[0] == before + 1


def test_sync_bls_large_tensor_goes_through_arenas(client) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(0).random(300_000).astype(np.float32)  # 1.2 MB each way
    for _ in range(3):  # arena blocks are given back: repeated calls keep working
        result = _infer(client, "bls_caller", x)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_async_bls_gather(client) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(5, dtype=np.float32)
    result = _infer(client, "bls_async", x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_bls_to_decoupled_model_sync_and_async(client) -> None:  # type: ignore[no-untyped-def]
    x = np.array([3, 10], dtype=np.float32)
    expected = np.concatenate([x, x + 1, x + 2])
    for use_async in (False, True):
        result = _infer(client, "bls_decoupled_caller", x, **({"async": True} if use_async else {}))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    # zero responses: the iterator ends at the bare final flag
    result = _infer(client, "bls_decoupled_caller", np.array([0, 1], dtype=np.float32))
    assert result.as_numpy("OUTPUT0").shape == (0,)


def test_bls_decoupled_iteration_of_non_decoupled_model(client) -> None:  # type: ignore[no-untyped-def]
    x = np.array([4, 5], dtype=np.float32)
    result = _infer(client, "bls_decoupled_caller", x, target="bls_identity")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"target": "no_such_model"}, "Request for unknown model: 'no_such_model' is not found"),
        ({"input_name": "WRONG"}, "unexpected inference input 'WRONG' for model 'bls_identity'"),
        ({"target": "bls_repeat"}, "uses the decoupled transaction policy"),
    ],
)
def test_bls_errors_reach_the_model_as_error_responses(client, params, message) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as exc:
        _infer(client, "bls_caller", np.ones(2, dtype=np.float32), **params)
    assert "BLS failed: " in str(exc.value) and message in str(exc.value)
    # the stub survived: the next request works
    np.testing.assert_array_equal(_infer(client, "bls_caller", np.ones(2, np.float32)).as_numpy("OUTPUT0"), [2, 2])


def test_bls_self_call_fails_instead_of_deadlocking(client) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    # one instance calling itself: no instance can ever take the nested request
    with pytest.raises(InferenceServerException) as exc:
        _infer(client, "bls_caller", np.ones(2, np.float32), target="bls_caller")
    assert "would deadlock" in str(exc.value) and "'bls_caller'" in str(exc.value)
    # two instances: the first call runs on the second instance, whose own self-call is then refused
    with pytest.raises(InferenceServerException) as exc:
        _infer(client, "bls_caller2", np.ones(2, np.float32), target="bls_caller2", then="bls_caller2")
    assert str(exc.value).count("BLS failed: ") == 2 and "all 2 instance(s) of 'bls_caller2'" in str(exc.value)
    np.testing.assert_array_equal(_infer(client, "bls_caller2", np.ones(2, np.float32)).as_numpy("OUTPUT0"), [2, 2])


def test_bls_cycle_between_models_fails_instead_of_deadlocking(client) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    # bls_caller -> bls_caller2 -> bls_caller: bls_caller's only instance waits on the chain
    with pytest.raises(InferenceServerException) as exc:
        _infer(client, "bls_caller", np.ones(2, np.float32), target="bls_caller2", then="bls_caller")
    text = str(exc.value)
    assert "BLS failed: BLS failed: " in text and "would deadlock" in text and "'bls_caller'" in text


def test_bls_over_stream(server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url)
    try:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        x = np.arange(3, dtype=np.float32)
        inp = grpcclient.InferInput("INPUT0", [3], "FP32")
        inp.set_data_from_numpy(x)
        c.async_stream_infer("bls_caller", [inp])
        result, error = results.get(timeout=30)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
    finally:
        c.stop_stream()
        c.close()
