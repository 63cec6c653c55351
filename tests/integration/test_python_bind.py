"""Python functions served as models with trireme.Server.bind (PyTriton's bind and @batch): PyTriton's example
shapes (a linear model, a batched add/sub, a decoupled streamer) through real worker processes, the gRPC, HTTP,
shared-memory and OpenAI front ends, and bad use that gets a clear error while the server keeps serving."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import trireme
from tests.conftest import ROOT, free_port, worker_children
from tests.integration import python_api_models as fns
from trireme import DynamicBatcher, ModelConfig, Tensor
from trireme.tritonserver import AlreadyExistsError, InvalidArgumentError

pytestmark = pytest.mark.timeout(240)

F32 = np.float32
X = [Tensor(name="x", dtype=F32, shape=(-1,))]
Y = [Tensor(name="y", dtype=F32, shape=(-1,))]
UNBATCHED = ModelConfig(batching=False)


@pytest.fixture(scope="module")
def server() -> Iterator[trireme.Server]:
    with trireme.Server(http_port=0, grpc_port=0, metrics_port=0, openai_port=0, address="127.0.0.1") as s:
        s.bind(
            "linear",
            fns.linear,
            inputs=[Tensor(dtype=F32, shape=(-1,))],
            outputs=[Tensor(dtype=F32, shape=(-1,))],
            config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=200_000)),
        )
        s.bind(
            "add_sub",
            fns.add_sub,
            inputs=[Tensor(name="a", dtype=F32, shape=(4,)), Tensor(name="b", dtype=F32, shape=(4,))],
            outputs=[Tensor(name="add", dtype=F32, shape=(4,)), Tensor(name="sub", dtype=F32, shape=(4,))],
            config=ModelConfig(max_batch_size=8),
        )
        s.bind(
            "streamer",
            fns.streamer,
            inputs=[Tensor(name="count", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="index", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True),
        )
        yield s


def http_input(name: str, array: np.ndarray) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == F32 else "INT32")
    i.set_data_from_numpy(array)
    return i


def grpc_input(name: str, array: np.ndarray, datatype: str = "FP32") -> grpcclient.InferInput:
    i = grpcclient.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


def test_linear_batches_concurrent_requests_over_grpc(server: trireme.Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    results: queue.SimpleQueue = queue.SimpleQueue()
    for k in range(6):
        x = np.full((1, 3), k, F32)
        client.async_infer(
            "linear", [grpc_input("INPUT_1", x)], partial(lambda k, result, error: results.put((k, result, error)), k)
        )
    for _ in range(6):
        k, result, error = results.get(timeout=60)
        assert error is None, error
        assert result.as_numpy("OUTPUT_1").tolist() == [[2.0 * k + 1.0] * 3]
    stats = client.get_inference_statistics("linear", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == 6
    assert int(stats["execution_count"]) < 6  # the dynamic batcher put requests together for @batch
    config = client.get_model_config("linear", as_json=True)["config"]
    assert config["max_batch_size"] == 16 and config["dynamic_batching"]["max_queue_delay_microseconds"] == "200000"
    client.close()


def test_add_sub_over_http_and_client_shared_memory(server: trireme.Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    a, b = np.arange(8, dtype=F32).reshape(2, 4), np.ones((2, 4), F32)
    result = client.infer("add_sub", [http_input("a", a), http_input("b", b)])
    assert result.as_numpy("add").tolist() == (a + b).tolist()
    assert result.as_numpy("sub").tolist() == (a - b).tolist()
    key = f"/trireme_bind_{os.getpid()}"
    region = shm.create_shared_memory_region("bind_io", key, 96)
    try:
        shm.set_shared_memory_region(region, [a[:1], b[:1]])
        client.register_system_shared_memory("bind_io", key, 96)
        ia, ib = httpclient.InferInput("a", [1, 4], "FP32"), httpclient.InferInput("b", [1, 4], "FP32")
        ia.set_shared_memory("bind_io", 16)
        ib.set_shared_memory("bind_io", 16, offset=16)
        out = httpclient.InferRequestedOutput("add", binary_data=True)
        out.set_shared_memory("bind_io", 16, offset=32)
        client.infer("add_sub", [ia, ib], outputs=[out])
        written = shm.get_contents_as_numpy(region, F32, [1, 4], offset=32)
        assert written.tolist() == (a[:1] + b[:1]).tolist()
        client.unregister_system_shared_memory("bind_io")
    finally:
        shm.destroy_shared_memory_region(region)
    client.close()


def test_decoupled_streamer_over_grpc_stream_and_in_process(server: trireme.Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    got: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("streamer", [grpc_input("count", np.array([3], np.int32), "INT32")])
    indices = []
    for _ in range(3):
        result, error = got.get(timeout=60)
        assert error is None, error
        indices.append(int(result.as_numpy("index")[0]))
    client.stop_stream()
    client.close()
    assert indices == [0, 1, 2]
    responses = list(server.model("streamer").infer(inputs={"count": np.array([4], np.int32)}))
    values = [int(np.from_dlpack(r.outputs["index"])[0]) for r in responses if "index" in r.outputs]
    assert values == [0, 1, 2, 3] and responses[-1].final


def test_openai_front_end_serves_a_bound_generator(server: trireme.Server) -> None:
    server.bind(
        "echo_llm",
        fns.echo_llm,
        inputs=[Tensor(name="text_input", dtype=np.object_, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=np.object_, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    body = json.dumps({"model": "echo_llm", "prompt": "sail the wine dark sea", "max_tokens": 16}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.openai_port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        answer = json.loads(r.read())
    assert answer["choices"][0]["text"].split() == ["sail", "the", "wine", "dark", "sea"]


def test_functions_run_in_worker_processes_or_in_process(server: trireme.Server) -> None:
    outputs = [Tensor(name="pid", dtype=np.int64, shape=(1,)), Tensor(name="echo", dtype=F32, shape=(-1,))]
    server.bind(
        "who_worker", fns.whoami, inputs=X, outputs=outputs, config=ModelConfig(batching=False, instance_count=2)
    )
    server.bind("who_local", fns.whoami, inputs=X, outputs=outputs, config=UNBATCHED, in_process=True)
    x = {"x": np.ones(2, F32)}
    (worker,) = list(server.model("who_worker").infer(inputs=x))
    (local,) = list(server.model("who_local").infer(inputs=x))
    worker_pid = int(np.from_dlpack(worker.outputs["pid"])[0])
    assert worker_pid != os.getpid() and worker_pid in worker_children(os.getpid())
    assert int(np.from_dlpack(local.outputs["pid"])[0]) == os.getpid()
    config = server.model("who_worker").config()
    assert config["instance_group"][0]["count"] == 2


def test_async_functions_and_closures(server: trireme.Server) -> None:
    server.bind("double", fns.async_double, inputs=X, outputs=Y, config=ModelConfig(max_batch_size=4))
    offset = np.float32(10)  # a closure over a local: sent to the worker by value (cloudpickle)
    server.bind(
        "plus_offset",
        lambda requests: [{"y": r["x"] + offset} for r in requests],
        inputs=X,
        outputs=Y,
        config=UNBATCHED,
    )
    server.bind(
        "async_stream",
        fns.async_stream,
        inputs=X,
        outputs=[Tensor(name="index", dtype=np.int32, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    (r,) = list(server.model("double").infer(inputs={"x": np.ones((1, 3), F32)}))
    assert np.from_dlpack(r.outputs["y"]).tolist() == [[2.0] * 3]
    (r,) = list(server.model("plus_offset").infer(inputs={"x": np.ones(2, F32)}))
    assert np.from_dlpack(r.outputs["y"]).tolist() == [11.0, 11.0]
    stream = [r for r in server.model("async_stream").infer(inputs={"x": np.ones(1, F32)}) if r.outputs]
    assert [int(np.from_dlpack(r.outputs["index"])[0]) for r in stream] == [0, 1, 2]


def test_bad_answers_get_clear_errors_and_the_server_keeps_serving(server: trireme.Server) -> None:
    fixed = [Tensor(name="y", dtype=F32, shape=(2,))]
    server.bind("wrong_shape", fns.wrong_shape, inputs=X, outputs=fixed, config=UNBATCHED)
    server.bind("wrong_type", fns.wrong_type, inputs=X, outputs=Y, config=UNBATCHED)
    server.bind("fails", fns.fails_on_negative, inputs=X, outputs=Y, config=ModelConfig(max_batch_size=4))
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    with pytest.raises(InferenceServerException, match=r"output 'y' has shape \[3\], the model declares \[2\]"):
        client.infer("wrong_shape", [http_input("x", np.ones(2, F32))])
    with pytest.raises(InferenceServerException, match=r"output 'y' is <U1, the model declares FP32"):
        client.infer("wrong_type", [http_input("x", np.ones(2, F32))])
    with pytest.raises(InferenceServerException, match="model 'fails' raised ValueError: negative input") as e:
        client.infer("fails", [http_input("x", -np.ones((1, 2), F32))])
    assert e.value.status() == "500"
    ok = client.infer("fails", [http_input("x", np.ones((1, 2), F32))])
    assert ok.as_numpy("y").tolist() == [[1.0, 1.0]]
    assert client.infer("add_sub", [http_input("a", np.ones((1, 4), F32)), http_input("b", np.ones((1, 4), F32))])
    client.close()


def test_bad_bindings_raise_clear_exceptions(server: trireme.Server) -> None:
    with pytest.raises(AlreadyExistsError, match="'linear' is already served"):
        server.bind("linear", fns.linear, inputs=X, outputs=Y)
    lock = threading.Lock()
    with pytest.raises(InvalidArgumentError, match=r"cannot be pickled.*in_process=True"):
        server.bind("locked", lambda requests: [lock] * len(requests), inputs=X, outputs=Y)
    with pytest.raises(InvalidArgumentError, match="model name"):
        server.bind("bad name/", fns.linear, inputs=X, outputs=Y)
    with pytest.raises(InvalidArgumentError, match="has no Triton data type"):
        server.bind("bad_type", fns.linear, inputs=[Tensor(name="x", dtype=complex, shape=(1,))], outputs=Y)
    # in-process, nothing is pickled: the same function binds
    server.bind("locked_here", lambda requests: [lock] * len(requests), inputs=X, outputs=Y, in_process=True)
    assert server.model("locked_here").ready()
    # pickled by reference to a module the worker processes cannot import: the load fails and says why
    module = types.ModuleType("trireme_test_ephemeral")
    exec("def f(requests):\n    return [{'y': r['x']} for r in requests]\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(
            InvalidArgumentError, match=r"failed to load bound model 'ephemeral'.*cannot load the bound"
        ):
            server.bind("ephemeral", module.f, inputs=X, outputs=Y, config=UNBATCHED)
    finally:
        del sys.modules[module.__name__]
    assert "ephemeral" not in [name for name, _ in server.models()]
    server.bind("ephemeral", fns.fails_on_negative, inputs=X, outputs=Y, config=UNBATCHED)  # the name is free again


def test_lifecycle_errors_and_nothing_left_behind() -> None:
    before = set(worker_children(os.getpid()))
    s = trireme.Server(http_port=None, grpc_port=None, metrics_port=None)
    s.bind("linear", fns.linear, inputs=[Tensor(dtype=F32, shape=(-1,))], outputs=[Tensor(dtype=F32, shape=(-1,))])
    with s:
        (r,) = list(s.model("linear").infer(inputs={"INPUT_1": np.ones((1, 2), F32)}))
        assert np.from_dlpack(r.outputs["OUTPUT_1"]).tolist() == [[3.0, 3.0]]
        assert set(worker_children(os.getpid())) - before
    assert set(worker_children(os.getpid())) - before == set()
    assert not os.path.exists(s._root)  # the bound models' folders are gone too
    with pytest.raises(InvalidArgumentError, match="stopped"):
        s.start()
    with pytest.raises(InvalidArgumentError, match="stopped"):
        s.bind("later", fns.linear, inputs=X, outputs=Y)


def _notebook_cell(loop_result: dict[str, Any]) -> None:
    import asyncio

    async def cell() -> None:  # what a notebook runs: its event loop is running while the cell's code runs
        with trireme.Server(http_port=0, grpc_port=None, metrics_port=None, address="127.0.0.1") as s:
            s.bind("double", fns.async_double, inputs=X, outputs=Y, config=UNBATCHED)
            responses = [r async for r in s.model("double").async_infer(inputs={"x": np.ones(2, F32)})]
            loop_result["sync"] = np.from_dlpack(responses[0].outputs["y"]).tolist()
        async with trireme.Server(http_port=None, grpc_port=None, metrics_port=None) as s:
            s.bind("double", fns.async_double, inputs=X, outputs=Y, config=UNBATCHED)
            loop_result["async"] = [
                np.from_dlpack(r.outputs["y"]).tolist() for r in s.model("double").infer(inputs={"x": np.ones(1, F32)})
            ]

    asyncio.run(cell())


def test_with_server_inside_a_running_event_loop() -> None:
    before = set(worker_children(os.getpid()))
    result: dict[str, Any] = {}
    _notebook_cell(result)
    assert result == {"sync": [2.0, 2.0], "async": [[2.0]]}
    assert set(worker_children(os.getpid())) - before == set()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_serve_a_function_runs_as_written(tmp_path: Path) -> None:
    """The README's "Serve a Python function" example, as written (ports moved to free ones), then its curl."""
    text = (ROOT / "README.md").read_text().split("## Serve a Python function\n", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", text, re.S)
    (curl,) = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert len([line for line in snippet.splitlines() if line.strip()]) == 5
    http, grpc, metrics = free_port(), free_port(), free_port()
    assert "trireme.Server()" in snippet and "localhost:8000" in curl
    snippet = snippet.replace(
        "trireme.Server()", f"trireme.Server(http_port={http}, grpc_port={grpc}, metrics_port={metrics})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "out.log").open("wb")
    # Ctrl-C as in a terminal: SIGINT at its default although this test may run where it is ignored (a background
    # job of a script, as tools/test.sh's second pass; an ignored signal is inherited across exec)
    proc = subprocess.Popen(
        [sys.executable, "-c", snippet],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()
            try:
                if client.is_model_ready("double"):
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
        client.close()
        sh = subprocess.run(
            ["bash", "-c", curl.replace("localhost:8000", f"localhost:{http}")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert '"name":"y","datatype":"FP32","shape":[1,3],"data":[2.0,4.0,6.0]' in sh.stdout, sh.stdout + sh.stderr
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: serve() returns after stopping the server
        try:
            rc = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()  # not left running after the test
            proc.wait()
            raise
        finally:
            log.close()
    assert rc == 0, (tmp_path / "out.log").read_text()


def test_pytriton_code_with_only_the_import_line_changed() -> None:
    """PyTriton's quick-start shape: `from trireme import ...` instead of pytriton's three imports."""
    from trireme import ModelConfig, Tensor, TritonConfig, batch
    from trireme import Server as Triton

    @batch
    def infer_fn(**inputs: np.ndarray) -> list[np.ndarray]:
        (input1_batch,) = inputs.values()
        return [input1_batch * 2.0 + 1.0]

    port = free_port()
    with Triton(config=TritonConfig(http_port=port, grpc_port=free_port(), metrics_port=free_port())) as triton:
        triton.bind(
            model_name="Linear",
            infer_func=infer_fn,
            inputs=[Tensor(dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=128),
        )
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        result = client.infer("Linear", [http_input("INPUT_1", np.ones((2, 2), F32))])
        assert result.as_numpy("OUTPUT_1").tolist() == [[3.0, 3.0], [3.0, 3.0]]
        client.close()
