"""--grpc-transport: the same gRPC service on grpcio, on pygrpc-native and on Trireme's own h2 (docs/grpc.md), and
what the native transport refuses when the server starts. The whole gRPC suite also runs on native or h2 with
`TRIREME_GRPC_TRANSPORT=native pytest ...` (the server reads it as the flag's default)."""

from __future__ import annotations

import asyncio
import importlib.util
import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from protos import health_pb2, health_pb2_grpc
from tests.conftest import EXAMPLE_REPO, ServerProcess, running_server

HAVE_NATIVE = importlib.util.find_spec("pygrpc_native") is not None
NATIVE = pytest.param(
    "native", marks=pytest.mark.skipif(not HAVE_NATIVE, reason="pygrpc-native is not installed (trireme[grpc-native])")
)
HAVE_HPACK = importlib.util.find_spec("hpack") is not None
H2 = pytest.param("h2", marks=pytest.mark.skipif(not HAVE_HPACK, reason="hpack is not installed (trireme[grpc-h2])"))
HEADER = "triton-grpc-protocol-infer-key"


@pytest.fixture(scope="module", params=["grpcio", NATIVE, H2])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The example repository on one transport, the inference group restricted to a header."""
    log = tmp_path_factory.mktemp("srv") / "server.log"
    args = ["--grpc-transport", request.param, "--grpc-restricted-protocol", "inference:infer-key=secret"]
    args += ["--grpc-keepalive-time", "10000", "--grpc-keepalive-timeout", "5000"]
    with running_server([EXAMPLE_REPO], log, args) as s:
        s.transport = request.param  # type: ignore[attr-defined]
        yield s


def _inputs(n: int = 16) -> tuple[list[grpcclient.InferInput], np.ndarray]:
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    i = grpcclient.InferInput("INPUT0", [1, n], "FP32")
    i.set_data_from_numpy(x)
    return [i], x


AUTH = {HEADER: "secret"}


def test_infer_and_errors(client: grpcclient.InferenceServerClient) -> None:
    inputs, x = _inputs()
    assert np.array_equal(client.infer("identity_fp32", inputs, headers=AUTH).as_numpy("OUTPUT0"), x)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found") as e:
        client.infer("nope", inputs, headers=AUTH)
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match="This protocol is restricted, expecting header") as e:
        client.infer("identity_fp32", inputs)  # restricted group without its header
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert client.is_server_ready() and client.get_model_metadata("identity_fp32").name == "identity_fp32"


def test_large_message(client: grpcclient.InferenceServerClient) -> None:
    inputs, x = _inputs(16 << 20)  # 64 MiB each way
    assert np.array_equal(client.infer("identity_fp32_any", inputs, headers=AUTH).as_numpy("OUTPUT0"), x)


def test_unparsable_body(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            call(b"\xff\xff\xff", metadata=tuple(AUTH.items()))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Unable to parse request" in str(e.value.details())


def test_aio_client(server: ServerProcess) -> None:
    async def run() -> np.ndarray:
        c = aioclient.InferenceServerClient(server.url)
        try:
            inputs, _ = _inputs()
            results = await asyncio.gather(*(c.infer("identity_fp32", inputs, headers=AUTH) for _ in range(8)))
            return np.stack([r.as_numpy("OUTPUT0") for r in results])
        finally:
            await c.close()

    assert np.array_equal(asyncio.run(run()), np.tile(_inputs()[1], (8, 1, 1)))


def test_stream_in_order_with_in_band_errors(client: grpcclient.InferenceServerClient) -> None:
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers=AUTH)
    inputs, x = _inputs()
    for k in range(5):
        client.async_stream_infer("identity_fp32" if k != 2 else "nope", inputs, request_id=str(k))
    answers = [got.get(timeout=30) for _ in range(5)]
    client.stop_stream()
    assert [r.get_response().id for r, e in answers if r is not None] == ["0", "1", "3", "4"]
    assert "Request for unknown model" in str(answers[2][1])
    assert np.array_equal(answers[4][0].as_numpy("OUTPUT0"), x)


def test_health_service(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_request_compression(server: ServerProcess) -> None:
    """gzip works on all; deflate-compressed requests are refused by the native transport (UNIMPLEMENTED, in
    tonic's words) and served by grpcio and h2, as by Triton."""
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    with grpc.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(request, metadata=tuple(AUTH.items()), compression=grpc.Compression.Gzip)
        assert reply.raw_output_contents[0] == request.raw_input_contents[0]
        if server.transport != "native":  # type: ignore[attr-defined]
            reply = stub.ModelInfer(request, metadata=tuple(AUTH.items()), compression=grpc.Compression.Deflate)
            assert reply.raw_output_contents[0] == request.raw_input_contents[0]
        else:
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(request, metadata=tuple(AUTH.items()), compression=grpc.Compression.Deflate)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "deflate" in str(e.value.details())
        assert stub.ServerLive(pb.ServerLiveRequest()).live  # the server keeps serving


def test_native_runs_in_rust(server: ServerProcess) -> None:
    """The native transport's HTTP/2 runs on its own Rust I/O threads (named grpc-native-io) in the process that
    serves the port (the server, or its front-end processes with --frontend-processes); grpcio has none."""
    pids = [server.proc.pid]
    for pid in list(pids):
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    names = {p.read_text().strip() for pid in pids for p in Path(f"/proc/{pid}/task").glob("*/comm")}
    assert ("grpc-native-io" in names) == (server.transport == "native")  # type: ignore[attr-defined]


@pytest.mark.skipif(not HAVE_NATIVE, reason="pygrpc-native is not installed (trireme[grpc-native])")
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--grpc-use-ssl=true"], "--grpc-use-ssl"),
        (["--grpc-use-ssl-mutual=true"], "--grpc-use-ssl-mutual"),
        (["--grpc-max-connection-age", "5000"], "--grpc-max-connection-age"),
        (["--grpc-max-connection-age-grace", "5000"], "--grpc-max-connection-age-grace"),
        (["--grpc-http2-max-ping-strikes", "0"], "--grpc-http2-max-ping-strikes"),
        (["--grpc-infer-response-compression-level=high"], "--grpc-infer-response-compression-level"),
        (["--reuse-grpc-port=true"], "--reuse-grpc-port"),
    ],
)
def test_native_refuses_at_start(tmp_path: Path, flags: list[str], named: str) -> None:
    s = ServerProcess([EXAMPLE_REPO], ["--grpc-transport=native", *flags], tmp_path / "server.log")
    try:
        assert s.proc.wait(60) != 0
    finally:
        s.stop()
    log = s.log()
    assert "--grpc-transport=native cannot serve" in log and named in log and "--grpc-transport=grpcio" in log
    assert "Started GRPCInferenceService" not in log
