"""Shared fixtures: free ports, a real Trireme server process, tritonclient clients, model repo helpers."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_REPO = ROOT / "service" / "example_models"


def worker_children(pid: int) -> list[int]:
    """PIDs of the worker processes a server started (its children, without its front-end processes, which
    --frontend-processes N >= 2 adds: `TRIREME_FRONTEND_PROCESSES=2 pytest` runs the suite that way)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    pids = []
    for p in out.split():
        try:
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"service.remote.frontend_main" not in cmdline:
            pids.append(int(p))
    return pids


class ServerProcess:
    """A `python -m service` process on a free port, with its log captured to a file."""

    def __init__(
        self,
        repos: list[Path],
        extra_args: list[str],
        log_path: Path,
        prefix: list[str] | None = None,
        client_shm: bool = True,
    ) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.http_port = free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"  # tritonclient.http form; requests wants "http://" + this
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.log_path = log_path
        args = [sys.executable, "-m", "service", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", str(self.port)]
        args += ["--http-address", "127.0.0.1", "--http-port", str(self.http_port)]
        args += ["--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port)]
        for repo in repos:
            args += ["--model-repository", str(repo)]
        # client shared memory is off by default (Triton 2.69+); the suite uses it widely, so it is on unless a
        # test sets --allow-client-shm itself or asks for the server's default (client_shm=False)
        if client_shm and not any(a.startswith("--allow-client-shm") for a in extra_args):
            args.append("--allow-client-shm=true")
        args = [*(prefix or []), *args, *extra_args]  # prefix: a command that execs the server (e.g. unshare)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        # own process group, so a test can signal "the server and its group" as a terminal would
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the server says it started (it binds every endpoint before announcing gRPC)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if "Started GRPCInferenceService" in self.log():
                return
            time.sleep(0.05)
        raise TimeoutError(f"server did not start in {timeout_s} s:\n{self.log()}")

    def worker_pids(self) -> list[int]:
        """PIDs of this server's worker processes."""
        return worker_children(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; checks that no worker (or front-end) process outlives the server."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        children = [int(p) for p in out.split()]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in children:
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
        self._log.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    """Factory: start_server(repos=[...], args=[...]) -> ready ServerProcess; all are stopped at teardown.
    client_shm=False starts it without --allow-client-shm=true (the server's default: client shm off)."""
    servers: list[ServerProcess] = []

    def start(
        repos: list[Path] | None = None, args: list[str] | None = None, wait: bool = True, client_shm: bool = True
    ) -> ServerProcess:
        log = tmp_path / f"server{len(servers)}.log"
        server = ServerProcess(repos or [EXAMPLE_REPO], args or [], log, client_shm=client_shm)
        servers.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for s in servers:
        s.stop()


@contextmanager
def running_server(
    repos: list[Path], log_path: Path, extra_args: list[str] | None = None, prefix: list[str] | None = None
) -> Iterator[ServerProcess]:
    """A ready ServerProcess for the with-block (for module-scoped fixtures); stopped on exit."""
    server = ServerProcess(repos, extra_args or [], log_path, prefix)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on the embedded example repository, shared by a test module."""
    with running_server([EXAMPLE_REPO], tmp_path_factory.mktemp("srv") / "server.log") as server:
        yield server


@pytest.fixture
def grpc_client(example_server: ServerProcess):  # type: ignore[no-untyped-def]
    """A tritonclient.grpc client connected to the example server."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(example_server.url)
    yield client
    client.close()


def write_model(repo: Path, name: str, config: str, model_py: str | None = None, version: int = 1) -> Path:
    """Create <repo>/<name>/config.pbtxt and <repo>/<name>/<version>/model.py; returns the model dir."""
    model_dir = repo / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    if model_py is not None:
        (model_dir / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    return model_dir


def copy_example(repo: Path, *names: str) -> None:
    """Copy example models into a test repository."""
    for name in names:
        shutil.copytree(EXAMPLE_REPO / name, repo / name)


def add_sub_onnx_model(elem_type: int) -> Any:
    """An onnx ModelProto: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 on [batch, 16] of elem_type (a
    TensorProto data type), opset 13, IR version 8. Needs the onnx package."""
    from onnx import helper

    io = [helper.make_tensor_value_info(n, elem_type, ["batch", 16]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, elem_type, ["batch", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        io,
        outs,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def shm_entries() -> set[str]:
    """Names currently in /dev/shm."""
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


@pytest.fixture
def machine_wide_shm_names() -> Iterator[None]:
    """Runs the test alone among the tests that ask for this fixture in every test process on this machine.

    For tests whose client names its system shared-memory segments itself, with names that are machine-wide and not
    configurable: real perf_analyzer with --shared-memory (its regions are /INPUT0_0_0, /OUTPUT0, ...) and
    trireme-perf, which uses the same names. tools/test.sh runs its two pytest passes at once; two such clients
    at the same moment would create, overwrite and unlink each other's segments. The lock (flock on a file in the
    temp directory) is held for the test and released by the kernel if the process dies."""
    with open(os.path.join(tempfile.gettempdir(), "trireme-test-shm-names.lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
