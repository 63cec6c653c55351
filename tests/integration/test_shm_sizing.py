"""A server whose /dev/shm is a small tmpfs (as in a container): shrunk arenas that serve, or a clear refusal.

Each server runs in its own mount namespace with a real tmpfs of the given size mounted on /dev/shm, the way
`docker run --shm-size` (default 64 MB) or a Kubernetes memory emptyDir limits it. Skipped where mount
namespaces are not allowed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, copy_example, free_port

UNSHARE = ["unshare", "--mount", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


def _namespaces_work() -> bool:
    try:
        probe = subprocess.run(
            [*UNSHARE, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="mount namespaces (unshare --mount) not allowed here")


class SmallShmServer:
    """`python -m service` with a private /dev/shm tmpfs of shm_size."""

    def __init__(self, repo: Path, shm_size: str, log_path: Path, args: list[str]) -> None:
        self.port = free_port()
        self.log_path = log_path
        server = [sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1"]
        server += ["--grpc-port", str(self.port), "--model-repository", str(repo)]
        server += ["--http-address", "127.0.0.1", "--http-port", str(free_port()), "--metrics-port", str(free_port())]
        server += args
        script = f'mount -t tmpfs -o size={shm_size},mode=1777 tmpfs /dev/shm && exec "$@"'
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*UNSHARE, "sh", "-c", script, "sh", *server], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "Started GRPCInferenceService" not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(self.log())
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture
def small_shm_server(tmp_path: Path) -> Iterator:
    servers: list[SmallShmServer] = []

    def start(repo: Path, shm_size: str, args: list[str] | None = None) -> SmallShmServer:
        servers.append(SmallShmServer(repo, shm_size, tmp_path / f"server{len(servers)}.log", args or []))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def infer_identity(client: grpcclient.InferenceServerClient, n: int) -> None:
    data = np.arange(n, dtype=np.float32).reshape(1, n)
    x = grpcclient.InferInput("INPUT0", [1, n], "FP32")
    x.set_data_from_numpy(data)
    assert np.array_equal(client.infer("identity_fp32_any", [x]).as_numpy("OUTPUT0"), data)


def test_docker_default_shm_shrinks_and_reserves_arenas(tmp_path: Path, small_shm_server) -> None:
    """64 MB /dev/shm, default 256 MiB arenas: without the shrink, a 40 MiB tensor through both arenas is SIGBUS.

    The arenas shrink to 24 MiB (3/4 of the free space for 1 worker x 2 arenas) and are reserved; a tensor larger
    than an arena needs the arena to grow, which /dev/shm cannot hold: that request gets a clear error naming
    --shm-size, and the same worker keeps serving.
    """
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32_any")
    server = small_shm_server(repo, "64m")
    server.wait_ready()
    assert "worker arenas shrink from 256 MiB to 24 MiB each (reserved)" in server.log()
    assert "--shm-size=" in server.log()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    infer_identity(client, 1000)
    infer_identity(client, 10 * (1 << 20) // 4)  # 10 MiB: in the arena
    with pytest.raises(InferenceServerException) as e:
        infer_identity(client, 40 * (1 << 20) // 4)  # 40 MiB: the arena would have to grow
    assert "Failed to increase the shared memory pool size" in str(e.value) and "--shm-size" in str(e.value)
    infer_identity(client, 1000)
    assert "restart" not in server.log().lower()  # the worker never died
    assert server.stop() == 0, server.log()


def test_arenas_that_take_over_half_of_shm_are_reserved(tmp_path: Path, small_shm_server) -> None:
    """Fits without shrinking but tight: the pages are reserved at start, visible as used /dev/shm space."""
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32_any")
    server = small_shm_server(repo, "24m", ["--backend-config=python,shm-default-byte-size=8388608"])
    server.wait_ready()
    assert "their pages are reserved" in server.log()
    used = subprocess.run(
        ["nsenter", "-t", str(server.proc.pid), "-m", "df", "-B1", "--output=used", "/dev/shm"],
        capture_output=True,
        text=True,
    )
    assert used.returncode == 0, used.stderr
    assert int(used.stdout.split()[-1]) >= 16 << 20  # both 8 MiB arenas reserved before any request
    infer_identity(client=grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}"), n=1000)


def test_too_small_shm_fails_at_start_with_a_clear_message(tmp_path: Path, small_shm_server) -> None:
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32_any", "identity_fp32", "add_sub")
    server = small_shm_server(repo, "4m")  # 3 workers x 2 arenas x 1 MiB minimum = 6 MiB > 4 MiB
    code = server.proc.wait(60)
    log = server.log()
    assert code == 1, log  # an orderly exit, not a signal (SIGBUS would be -7)
    assert "/dev/shm has 4 MiB free, too little for the shared-memory arenas of 3 model instance(s)" in log
    assert "--shm-size=" in log
    assert "Traceback" not in log
