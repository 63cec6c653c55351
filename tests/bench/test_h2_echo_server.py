"""tests/bench/h2_echo_server.py, both HTTP/2 variants, driven by real tritonclient (grpc core) and raw frames: the
bench server must be a correct enough gRPC server for its measurements to mean something (docs/benchmarks.md,
"Issue 44 item 1"). Marked `benchmark`: a bench tool's check, not part of the CI suite; run with
`.venv/bin/python -m pytest -m benchmark tests/bench/test_h2_echo_server.py`."""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("h2", reason="the h2 variant needs python-hyper's h2 (pip install 'trireme[grpcbench]')")
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from load.transports.h2 import ACK, GOAWAY, PING, PREFACE, SETTINGS, frame
from tests.bench.servers import free_port

pytestmark = pytest.mark.benchmark
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["h2", "own", "own_coalesced", "own_mypyc"])
def echo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    if request.param == "own_mypyc" and not list((ROOT / "tests" / "bench" / "h2echo").glob("own.*.so")):
        pytest.skip("own_mypyc: the modules are not compiled (see tests/bench/h2_echo_server.py)")
    port, log = free_port(), tmp_path / "echo.log"
    cmd = [sys.executable, str(ROOT / "tests" / "bench" / "h2_echo_server.py"), "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, "--variant", request.param], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "Started" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield port, proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _infer(client: grpcclient.InferenceServerClient, x: np.ndarray) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer("identity", [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    return out.as_numpy("OUTPUT0")


def test_tritonclient_metadata_infer_and_errors(echo: tuple[int, subprocess.Popen[bytes], Path]) -> None:
    port, proc, log = echo
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("identity")
    assert client.get_model_metadata("identity", as_json=True)["inputs"][0]["name"] == "INPUT0"
    assert client.get_model_config("identity", as_json=True)["config"]["output"][0]["name"] == "OUTPUT0"
    small = np.arange(16, dtype=np.float32)
    assert np.array_equal(_infer(client, small), small)
    # 8 MiB each way: past the 1 MiB stream window we announce and grpc core's own windows, so the request needs
    # our WINDOW_UPDATEs and the response waits for the client's
    large = np.random.default_rng(0).random(1 << 21, dtype=np.float32)
    assert np.array_equal(_infer(client, large), large)
    with pytest.raises(InferenceServerException, match="UNIMPLEMENTED"):
        client.load_model("identity")
    assert np.array_equal(_infer(client, small), small)  # the connection still serves
    stats = client.get_inference_statistics("identity", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == 3

    async def concurrent() -> list[bool]:
        aio = aioclient.InferenceServerClient(f"127.0.0.1:{port}")

        async def one(k: int) -> bool:
            x = np.full(64, k, dtype=np.float32)
            inp = aioclient.InferInput("INPUT0", [64], "FP32")
            inp.set_data_from_numpy(x)
            return bool(np.array_equal((await aio.infer("identity", [inp])).as_numpy("OUTPUT0"), x))

        try:
            return await asyncio.gather(*(one(k) for k in range(40)))
        finally:
            await aio.close()

    assert all(asyncio.run(concurrent()))
    # SIGTERM with the client's connection open: GOAWAY, then a clean exit
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert "stopped: 43 ModelInfer calls" in log.read_text()
    client.close()


def _frames(sock: socket.socket, want: int, timeout_s: float = 10) -> tuple[int, int, bytes]:
    """Read frames until one of type `want`; (type, flags, payload)."""
    sock.settimeout(timeout_s)
    buf = b""
    while True:
        while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3]):
            chunk = sock.recv(65536)
            assert chunk, "connection closed before the frame came"
            buf += chunk
        n = int.from_bytes(buf[:3])
        ftype, flags, payload, buf = buf[3], buf[4], buf[9 : 9 + n], buf[9 + n :]
        if ftype == want:
            return ftype, flags, payload


def test_raw_frames_ping_ack_and_bad_preface(echo: tuple[int, subprocess.Popen[bytes], Path]) -> None:
    port = echo[0]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"12345678"))
        _, flags, payload = _frames(sock, PING)
        assert flags & ACK and payload == b"12345678"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _, _, payload = _frames(sock, GOAWAY)
        _last_stream, code = struct.unpack(">II", payload[:8])
        assert code == 1  # PROTOCOL_ERROR
