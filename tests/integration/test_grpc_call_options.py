"""--grpc-header-forward-pattern / --http-header-forward-pattern (headers a Python model reads in
request.parameters()), --grpc-infer-response-compression-level (bytes on the wire through a counting proxy), and
--reuse-grpc-port / --reuse-http-port (two servers on one port), through real servers and tritonclient."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess
from tests.integration.models import write_python_model

PARAMS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            params = np.array([request.parameters().encode()], dtype=np.object_)
            outputs = [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PARAMS", params)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_python_model(
        repo,
        "params",
        PARAMS_PY,
        outputs=(("OUTPUT0", "TYPE_FP32", (-1,)), ("PARAMS", "TYPE_STRING", (1,))),
    )
    return repo


def _grpc_inputs(values: np.ndarray) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    inp.set_data_from_numpy(values)
    return [inp]


def _params(result: object) -> dict:
    return json.loads(result.as_numpy("PARAMS")[0])  # type: ignore[attr-defined]


class CountingProxy:
    """A TCP relay to `target` that counts the bytes flowing from the server to the client."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.to_client = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if count:
                    with self._lock:
                        self.to_client += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], CountingProxy]]:
    made: list[CountingProxy] = []

    def make(port: int) -> CountingProxy:
        made.append(CountingProxy(port))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_headers_forwarded_and_compressed(
    repo: Path, start_server: Callable[..., ServerProcess], proxy_factory: Callable[[int], CountingProxy]
) -> None:
    server = start_server(
        [repo],
        [
            "--grpc-header-forward-pattern=^x-fwd-|sequence_id",
            "--http-header-forward-pattern=^x-fwd-",
            "--grpc-infer-response-compression-level=high",
        ],
    )
    client = grpcclient.InferenceServerClient(server.url)
    x = np.arange(4, dtype=np.float32)
    result = client.infer("params", _grpc_inputs(x), headers={"x-fwd-tenant": "acme", "other": "no"})
    assert _params(result) == {"x-fwd-tenant": "acme"}
    assert np.array_equal(result.as_numpy("OUTPUT0"), x)
    # a forwarded header may not set a reserved parameter: Triton's INVALID_ARGUMENT
    with pytest.raises(InferenceServerException, match="Header 'sequence_id' is reserved for Triton usage") as e:
        client.infer("params", _grpc_inputs(x), headers={"sequence_id": "7"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"

    # the stream forwards its call's headers to every request
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers={"x-fwd-s": "on"})
    client.async_stream_infer("params", _grpc_inputs(x))
    result, error = answers.get(timeout=30)
    client.stop_stream()
    assert error is None and _params(result) == {"x-fwd-s": "on"}

    # HTTP (its own flag)
    http = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(x)
    result = http.infer("params", [inp], headers={"X-Fwd-Http": "yes", "x-other": "no"})
    assert {k.lower(): v for k, v in _params(result).items()} == {"x-fwd-http": "yes"}

    # compression: a 4 MB response of zeros crosses the wire in far fewer bytes
    proxy = proxy_factory(server.port)
    via_proxy = grpcclient.InferenceServerClient(f"127.0.0.1:{proxy.port}")
    zeros = np.zeros(1 << 20, dtype=np.float32)
    result = via_proxy.infer("params", _grpc_inputs(zeros))
    assert np.array_equal(result.as_numpy("OUTPUT0"), zeros)
    assert proxy.to_client < 200_000, proxy.to_client
    via_proxy.close()
    client.close()


def test_defaults_forward_nothing_and_do_not_compress(
    repo: Path, start_server: Callable[..., ServerProcess], proxy_factory: Callable[[int], CountingProxy]
) -> None:
    server = start_server([repo])
    proxy = proxy_factory(server.port)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{proxy.port}")
    zeros = np.zeros(1 << 20, dtype=np.float32)
    result = client.infer("params", _grpc_inputs(zeros), headers={"x-fwd-tenant": "acme"})
    assert _params(result) == {}
    assert proxy.to_client > 4 << 20
    client.close()


def test_bad_compression_level(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(args=["--grpc-infer-response-compression-level=extreme"], wait=False)
    server.proc.wait(60)
    assert server.proc.returncode != 0
    assert "invalid argument for --grpc_infer_response_compression_level" in server.log()


def test_reuse_ports(repo: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    first = start_server([repo], ["--reuse-grpc-port=true", "--reuse-http-port=true"])
    shared = ["--grpc-port", str(first.port), "--http-port", str(first.http_port)]
    second = start_server(
        [repo], [*shared, "--reuse-grpc-port=true", "--reuse-http-port=true", "--allow-metrics=false"]
    )
    assert second.proc.poll() is None
    for _ in range(4):  # whichever server the kernel picks answers
        assert grpcclient.InferenceServerClient(first.url).is_server_ready()
        assert httpclient.InferenceServerClient(first.http_url).is_server_ready()
    # without the flag the port is taken
    third = start_server([repo], shared, wait=False)
    third.proc.wait(60)
    assert third.proc.returncode != 0
    assert f"unable to bind the gRPC server to 127.0.0.1:{first.port}" in third.log()
