"""Triton's in-process API on Trireme (trireme.tritonserver / trireme.tritonfrontend): a server started from
Python, its models in real worker processes, real tritonclient clients against front ends started from Python,
and nothing left behind by Server.stop()."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import trireme.tritonfrontend as tritonfrontend
import trireme.tritonserver as tritonserver
from service.ipc.arena import SEGMENT_PREFIX
from tests.conftest import EXAMPLE_REPO, ROOT, worker_children

pytestmark = pytest.mark.timeout(180)

ONES = np.ones(4, np.float32)


def our_segments() -> list[str]:
    """/dev/shm segments of this process's workers' arenas (their names carry the server's pid)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"{SEGMENT_PREFIX}{os.getpid()}_")]


@pytest.fixture(scope="module")
def server() -> Iterator[tritonserver.Server]:
    s = tritonserver.Server(model_repository=str(EXAMPLE_REPO), metrics=True)
    s.start(wait_until_ready=True, timeout=120)
    yield s
    s.stop()


def test_infer_metadata_and_errors(server: tritonserver.Server) -> None:
    model = server.model("add_sub")
    responses = list(model.infer(inputs={"INPUT0": ONES, "INPUT1": ONES * 3}))
    assert len(responses) == 1 and responses[0].final
    out = responses[0].outputs
    assert np.from_dlpack(out["OUTPUT0"]).tolist() == [4.0] * 4
    assert np.from_dlpack(out["OUTPUT1"]).tolist() == [-2.0] * 4
    assert server.live() and server.ready() and model.ready()
    assert server.metadata()["name"] == "triton"
    meta = model.metadata()
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [4]}
    assert model.config()["name"] == "add_sub"
    assert model.batch_properties() == tritonserver.ModelBatchFlag.UNKNOWN
    assert server.model("add_sub_int32").batch_properties() == tritonserver.ModelBatchFlag.FIRST_DIM
    assert server.model("mock_llm").transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED
    assert model.statistics()["model_stats"][0]["inference_count"] >= 1
    assert ("add_sub", 1) in server.models() and server.models()["add_sub"].name == "add_sub"
    assert "nv_inference_request_success" in server.metrics()
    # a request the model cannot take: Triton's error class, and the server goes on serving
    with pytest.raises(tritonserver.InvalidArgumentError, match="INPUT0"):
        list(model.infer(inputs={"INPUT0": np.ones(3, np.float32), "INPUT1": ONES}))
    with pytest.raises(tritonserver.NotFoundError):
        list(server.model("no_such_model").infer(inputs={"INPUT0": ONES}))
    # a model that raises answers with an error response (raise_on_error=False hands it over)
    failed = list(
        server.model("raise_error").infer(inputs={"INPUT0": -np.ones((1, 2), np.float32)}, raise_on_error=False)
    )
    assert failed[-1].error is not None
    again = list(model.infer(inputs={"INPUT0": ONES, "INPUT1": ONES}))
    assert np.from_dlpack(again[0].outputs["OUTPUT0"]).tolist() == [2.0] * 4
    with pytest.raises(tritonserver.InvalidArgumentError, match="already started"):
        server.start()


def test_bytes_tensors_and_request_object(server: tritonserver.Server) -> None:
    model = server.model("identity_bytes")
    request = model.create_request(inputs={"INPUT0": tritonserver.Tensor.from_string_array([["a", "bc"]])})
    (response,) = list(model.infer(request))
    assert response.outputs["OUTPUT0"].to_string_array().tolist() == [["a", "bc"]]
    assert response.outputs["OUTPUT0"].to_bytes_array().tolist() == [[b"a", b"bc"]]


def test_async_iterator_streams_a_decoupled_model(server: tritonserver.Server) -> None:
    async def run() -> list[str]:
        words = []
        prompt = np.array([[b"one two three"]], np.object_)
        async for response in server.model("mock_llm").async_infer(inputs={"text_input": prompt}):
            if "text_output" in response.outputs:
                words.append(response.outputs["text_output"].to_bytes_array().reshape(-1)[0].decode())
        return words

    words = asyncio.run(run())
    assert "".join(words).split() == ["one", "two", "three"]


def test_cancel_ends_a_stream_early(server: tritonserver.Server) -> None:
    prompt = np.array([[(" w" * 300).encode()]], np.object_)
    responses = server.model("mock_llm").infer(inputs={"text_input": prompt, "stream": np.array([[True]])})
    first = next(responses)
    assert not first.final
    responses.cancel()
    rest = list(responses)  # what was on its way, then the final flag: not the 300 words
    assert rest and rest[-1].final and len(rest) < 250


def test_frontends_serve_real_clients(server: tritonserver.Server) -> None:
    http_opts = tritonfrontend.KServeHttp.Options(address="127.0.0.1", port=0)
    grpc_opts = tritonfrontend.KServeGrpc.Options(address="127.0.0.1", port=0)
    with tritonfrontend.KServeHttp(server, http_opts) as http, tritonfrontend.KServeGrpc(server, grpc_opts) as grpc:
        metrics = tritonfrontend.Metrics(server, tritonfrontend.Metrics.Options(address="127.0.0.1", port=0))
        metrics.start()
        hc = httpclient.InferenceServerClient(f"127.0.0.1:{http.port}")
        a = httpclient.InferInput("INPUT0", [4], "FP32")
        a.set_data_from_numpy(ONES)
        b = httpclient.InferInput("INPUT1", [4], "FP32")
        b.set_data_from_numpy(ONES)
        assert hc.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [2.0] * 4
        # client system shared memory through the HTTP front end
        key = f"/trireme_pyapi_{os.getpid()}"
        region = shm.create_shared_memory_region("pyapi_in", key, 32)
        try:
            shm.set_shared_memory_region(region, [ONES * 5, ONES])
            hc.register_system_shared_memory("pyapi_in", key, 32)
            a.set_shared_memory("pyapi_in", 16)
            b.set_shared_memory("pyapi_in", 16, offset=16)
            assert hc.infer("add_sub", [a, b]).as_numpy("OUTPUT1").tolist() == [4.0] * 4
            hc.unregister_system_shared_memory("pyapi_in")
        finally:
            shm.destroy_shared_memory_region(region)
        hc.close()
        gc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc.port}")
        ga = grpcclient.InferInput("INPUT0", [4], "FP32")
        ga.set_data_from_numpy(ONES)
        gb = grpcclient.InferInput("INPUT1", [4], "FP32")
        gb.set_data_from_numpy(ONES * 2)
        assert gc.infer("add_sub", [ga, gb]).as_numpy("OUTPUT1").tolist() == [-1.0] * 4
        assert gc.is_model_ready("add_sub")
        gc.close()
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as r:
            assert b"nv_inference_count" in r.read()
        metrics.stop()
        port = http.port
    with pytest.raises((InferenceServerException, OSError)):  # the HTTP front end stopped with its `with` block
        httpclient.InferenceServerClient(f"127.0.0.1:{port}").is_server_live()
    with pytest.raises(tritonserver.InvalidArgumentError, match=r"KServeHttp\.Options"):
        tritonfrontend.KServeHttp(server, tritonfrontend.KServeGrpc.Options())  # type: ignore[arg-type]
    with pytest.raises(tritonserver.InvalidArgumentError, match="port"):
        tritonfrontend.KServeHttp.Options(port=70000)
    with socket.socket() as taken:  # a port in use: Triton's UnavailableError, and the server goes on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = tritonfrontend.KServeGrpc.Options(address="127.0.0.1", port=taken.getsockname()[1])
        with pytest.raises(tritonserver.UnavailableError, match="failed to start GRPC service"):
            tritonfrontend.KServeGrpc(server, busy).start()
    assert server.ready()


def test_stop_leaves_no_process_or_segment_and_servers_coexist() -> None:
    before = set(worker_children(os.getpid()))
    first = tritonserver.Server(
        model_repository=str(EXAMPLE_REPO),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=["add_sub"],
        metrics=False,
    ).start(wait_until_ready=True)
    second = tritonserver.Server(
        model_repository=str(EXAMPLE_REPO), model_control_mode=tritonserver.ModelControlMode.EXPLICIT, metrics=False
    ).start()
    try:
        assert [k for k in first.models(exclude_not_ready=True)] == [("add_sub", 1)]
        assert not second.models(exclude_not_ready=True)
        second.load("identity_fp32")
        (r,) = list(second.model("identity_fp32").infer(inputs={"INPUT0": np.ones((1, 16), np.float32)}))
        assert np.from_dlpack(r.outputs["OUTPUT0"]).shape == (1, 16)
        (r,) = list(first.model("add_sub").infer(inputs={"INPUT0": ONES, "INPUT1": ONES}))
        assert r.final
        assert len(set(worker_children(os.getpid())) - before) == 2
        second.unload("identity_fp32", wait_until_unloaded=True, timeout=60)
        assert not second.models(exclude_not_ready=True)
        # a model sent as files with the load request, as Triton's load(parameters={"config", "file:..."})
        config = '{"name": "sent", "backend": "python", "input": [{"name": "X", "data_type": "TYPE_FP32", '
        config += '"dims": [-1]}], "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]}'
        model_py = textwrap.dedent(
            """
            import triton_python_backend_utils as pb_utils

            class TritonPythonModel:
                def execute(self, requests):
                    return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
            """
        )
        second.load("sent", parameters={"config": config, "file:1/model.py": model_py.encode()})
        (r,) = list(second.model("sent").infer(inputs={"X": ONES}))
        assert np.from_dlpack(r.outputs["Y"]).tolist() == [2, 2, 2, 2]
        with pytest.raises(tritonserver.InvalidArgumentError, match="'config' must be specified"):
            second.load("sent", parameters={"file:1/model.py": model_py.encode()})
        second.unload("sent", wait_until_unloaded=True, timeout=60)
    finally:
        first.stop()
        second.stop()
    assert set(worker_children(os.getpid())) - before == set()
    assert our_segments() == []
    with pytest.raises(tritonserver.InvalidArgumentError, match="stopped"):
        first.start()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        first.model("add_sub")


def test_options_errors() -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="Model repository must be specified"):
        tritonserver.Server().start()
    with pytest.raises(tritonserver.InternalError, match="failed to load"):
        tritonserver.Server(model_repository="/nonexistent/repository").start()


def test_code_written_for_triton_runs_unchanged(tmp_path) -> None:
    """A script that imports `tritonserver` and `tritonfrontend` by Triton's names, after the one-line alias."""
    script = tmp_path / "triton_app.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import trireme; trireme.alias_triton_modules()
            import numpy as np
            import tritonserver
            from tritonfrontend import KServeHttp
            import tritonclient.http as httpclient

            server = tritonserver.Server(tritonserver.Options(model_repository={str(EXAMPLE_REPO)!r}))
            server.start(wait_until_ready=True)
            with KServeHttp(server, KServeHttp.Options(port=0)) as http:
                client = httpclient.InferenceServerClient(f"127.0.0.1:{{http.port}}")
                inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
                inp.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
                print("http", client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").sum())
            for response in server.model("add_sub").infer(inputs={{"INPUT0": np.ones(4, np.float32),
                                                                    "INPUT1": np.ones(4, np.float32)}}):
                print("inproc", np.from_dlpack(response.outputs["OUTPUT0"]).sum())
            server.stop()
            print("stopped", type(tritonserver.InvalidArgumentError("x")).__module__)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "http 120.0" in done.stdout and "inproc 8.0" in done.stdout and "stopped tritonserver" in done.stdout
