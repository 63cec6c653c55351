"""Ensembles through a real server: a 3-step pipeline with a parallel branch, streaming, shm edges, errors."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.models import python_config
from tests.integration.test_bls import REPEAT_PY  # decoupled: int(INPUT0[0]) responses, then FINAL

# y = x * SCALE + OFFSET; with RENDEZVOUS set, first waits (up to 20 s) until its peer step has started too,
# which only happens if the ensemble runs both steps at the same time
AFFINE_PY = """
import json
import os
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        get = lambda k, d: params.get(k, {}).get("string_value", d)
        self.scale, self.offset = float(get("SCALE", "1")), float(get("OFFSET", "0"))
        self.rendezvous, self.me, self.peer = get("RENDEZVOUS", ""), get("ME", ""), get("PEER", "")
        self.fail = get("FAIL", "") == "yes"

    def execute(self, requests):
        if self.rendezvous:
            open(os.path.join(self.rendezvous, self.me), "w").close()
            deadline = time.monotonic() + 20
            while not os.path.exists(os.path.join(self.rendezvous, self.peer)):
                if time.monotonic() > deadline:
                    raise RuntimeError(self.me + " never met " + self.peer + ": steps did not run in parallel")
                time.sleep(0.01)
            os.remove(os.path.join(self.rendezvous, self.peer))
        if self.fail:
            raise ValueError("step failed on purpose")
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            y = (x * self.scale + self.offset).astype(x.dtype)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
"""

AFFINE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters [ {params} ]
"""

REPEAT_CONFIG = python_config("ens_repeat", extra="model_transaction_policy { decoupled: true }")


def _param(key: str, value: str) -> str:
    return f'{{ key: "{key}" value: {{ string_value: "{value}" }} }}'


def _step(model: str, inp: str, out: str, in_key: str = "INPUT0", out_key: str = "OUTPUT0") -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{in_key}" value: "{inp}" }} '
        f'output_map {{ key: "{out_key}" value: "{out}" }} }}'
    )


def ensemble_config(name: str, steps: list[str], outputs: list[str], decoupled: bool = False) -> str:
    """An FP32[-1] ensemble with input IN and the given outputs."""
    outs = ", ".join(f'{{ name: "{o}" data_type: TYPE_FP32 dims: [ -1 ] }}' for o in outputs)
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {outs} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
{policy}
"""


def build_repo(repo: Path, rendezvous: Path) -> Path:
    """pre (x+1) -> mid (x*3) -> post (x*2) = OUT, and branch (x*10) = BRANCH in parallel with mid."""
    models = {
        "ens_pre": [_param("OFFSET", "1")],
        "ens_mid": [
            _param("SCALE", "3"),
            _param("RENDEZVOUS", str(rendezvous)),
            _param("ME", "mid"),
            _param("PEER", "branch"),
        ],
        "ens_post": [_param("SCALE", "2")],
        "ens_branch": [
            _param("SCALE", "10"),
            _param("RENDEZVOUS", str(rendezvous)),
            _param("ME", "branch"),
            _param("PEER", "mid"),
        ],
        "ens_fail": [_param("FAIL", "yes")],
        "ens_plain": [_param("SCALE", "5")],
    }
    for name, params in models.items():
        write_model(repo, name, AFFINE_CONFIG.format(name=name, params=", ".join(params)), AFFINE_PY)
    write_model(repo, "ens_repeat", REPEAT_CONFIG, REPEAT_PY)
    pipeline = [
        _step("ens_pre", "IN", "pre_out"),
        _step("ens_mid", "pre_out", "mid_out"),
        _step("ens_post", "mid_out", "OUT"),
        _step("ens_branch", "IN", "BRANCH"),
    ]
    write_model(repo, "ens_pipeline", ensemble_config("ens_pipeline", pipeline, ["OUT", "BRANCH"]))
    simple = [_step("ens_pre", "IN", "pre_out"), _step("ens_plain", "pre_out", "OUT")]
    write_model(repo, "ens_simple", ensemble_config("ens_simple", simple, ["OUT"]))
    failing = [_step("ens_pre", "IN", "pre_out"), _step("ens_fail", "pre_out", "OUT")]
    write_model(repo, "ens_failing", ensemble_config("ens_failing", failing, ["OUT"]))
    streaming = [_step("ens_repeat", "IN", "rep"), _step("ens_plain", "rep", "OUT")]
    write_model(repo, "ens_stream", ensemble_config("ens_stream", streaming, ["OUT"], decoupled=True))
    write_model(repo, "ens_stream_nd", ensemble_config("ens_stream_nd", streaming, ["OUT"]))
    # an ensemble whose first step is another ensemble (it loads after the inner one)
    nested = [_step("ens_simple", "IN", "inner", "IN", "OUT"), _step("ens_post", "inner", "OUT")]
    write_model(repo, "ens_nested", ensemble_config("ens_nested", nested, ["OUT"]))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ens")
    rendezvous = tmp / "rendezvous"
    rendezvous.mkdir()
    with running_server([build_repo(tmp / "repo", rendezvous)], tmp / "server.log") as server:
        yield server


def _input(x: np.ndarray):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def _success(client, model: str) -> int:  # type: ignore[no-untyped-def]
    return int(client.get_inference_statistics(model).model_stats[0].inference_stats.success.count)


def test_pipeline_with_parallel_branch(client) -> None:  # type: ignore[no-untyped-def]
    before = {m: _success(client, m) for m in ("ens_pipeline", "ens_pre", "ens_mid", "ens_post", "ens_branch")}
    x = np.array([0, 1, 2.5], dtype=np.float32)
    # ens_mid and ens_branch each wait until the other has started: this only completes if they run in parallel
    result = client.infer("ens_pipeline", [_input(x)])
    np.testing.assert_allclose(result.as_numpy("OUT"), (x + 1) * 3 * 2)
    np.testing.assert_allclose(result.as_numpy("BRANCH"), x * 10)
    assert result.get_response().model_name == "ens_pipeline"
    # statistics of the ensemble and of every composing model
    for model, count in before.items():
        assert _success(client, model) == count + 1, model
    stats = client.get_inference_statistics("ens_pipeline").model_stats[0]
    assert stats.inference_count >= 1 and stats.execution_count >= 1


def test_requested_output_subset(client) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    x = np.array([1.0], dtype=np.float32)
    result = client.infer("ens_simple", [_input(x)], outputs=[grpcclient.InferRequestedOutput("OUT")])
    np.testing.assert_allclose(result.as_numpy("OUT"), (x + 1) * 5)


def test_nested_ensemble(client) -> None:  # type: ignore[no-untyped-def]
    x = np.array([1.0, 2.0], dtype=np.float32)
    np.testing.assert_allclose(client.infer("ens_nested", [_input(x)]).as_numpy("OUT"), (x + 1) * 5 * 2)


def test_large_tensors_between_steps(client) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(1).random(500_000).astype(np.float32)  # 2 MB: arenas on every hop
    result = client.infer("ens_simple", [_input(x)])
    np.testing.assert_allclose(result.as_numpy("OUT"), (x + 1) * 5, rtol=1e-6)


def test_step_error_names_the_step(client) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    before = client.get_inference_statistics("ens_failing").model_stats[0].inference_stats.fail.count
    with pytest.raises(InferenceServerException) as exc:
        client.infer("ens_failing", [_input(np.ones(2, np.float32))])
    text = str(exc.value)
    assert "in ensemble 'ens_failing', step 1 (model 'ens_fail')" in text and "step failed on purpose" in text
    assert client.get_inference_statistics("ens_failing").model_stats[0].inference_stats.fail.count == before + 1


def test_bad_request_rejected_before_steps(client) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inp = grpcclient.InferInput("IN", [2], "INT32")
    inp.set_data_from_numpy(np.ones(2, np.int32))
    with pytest.raises(InferenceServerException, match="data-type is 'INT32', but model 'ens_simple' expects 'FP32'"):
        client.infer("ens_simple", [inp])


def _stream(url: str, model: str, x: np.ndarray, count: int) -> list:  # type: ignore[type-arg]
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    try:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer(model, [_input(x)], enable_empty_final_response=True)
        got = []
        while True:
            result, error = results.get(timeout=30)
            got.append((result, error))
            if error is not None:
                break
            params = result.get_response().parameters
            if params["triton_final_response"].bool_param:
                break
        assert len(got) == count
        return got
    finally:
        c.stop_stream()
        c.close()


def test_pipeline_over_stream(server: ServerProcess) -> None:
    x = np.array([3.0], dtype=np.float32)
    [(result, error)] = _stream(server.url, "ens_simple", x, 1)
    assert error is None
    np.testing.assert_allclose(result.as_numpy("OUT"), (x + 1) * 5)


def test_decoupled_step_streams_through_ensemble(server: ServerProcess) -> None:
    x = np.array([3, 7], dtype=np.float32)
    got = _stream(server.url, "ens_stream", x, 4)  # 3 responses, then the empty final
    outs = sorted(tuple(r.as_numpy("OUT")) for r, e in got[:3])
    assert outs == sorted(tuple((x + k) * 5) for k in range(3))
    assert all(e is None for _, e in got)
    assert got[3][0].as_numpy("OUT") is None


def test_decoupled_step_in_non_decoupled_ensemble_is_an_error(client) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="3 complete sets of outputs"):
        client.infer("ens_stream_nd", [_input(np.array([3, 7], np.float32))])
    result = client.infer("ens_stream_nd", [_input(np.array([1, 7], np.float32))])
    np.testing.assert_allclose(result.as_numpy("OUT"), np.array([1, 7]) * 5)


def test_decoupled_ensemble_refused_on_model_infer(client) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        client.infer("ens_stream", [_input(np.ones(1, np.float32))])


def test_shared_memory_at_the_edges(client) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as shm

    x = np.arange(16, dtype=np.float32)
    key = f"/trireme_test_ens_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("ens_region", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("ens_region", key, 2 * x.nbytes)
        inp = grpcclient.InferInput("IN", [16], "FP32")
        inp.set_shared_memory("ens_region", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUT")
        out.set_shared_memory("ens_region", x.nbytes, offset=x.nbytes)
        result = client.infer("ens_simple", [inp], outputs=[out])
        meta = result.get_output("OUT")
        assert list(meta.shape) == [16]
        got = shm.get_contents_as_numpy(handle, np.float32, [16], offset=x.nbytes)
        np.testing.assert_allclose(got, (x + 1) * 5)
    finally:
        client.unregister_system_shared_memory("ens_region")
        shm.destroy_shared_memory_region(handle)
