"""Start a Triton-compatible server for benchmarks and tests: a model repository, free ports, a command.

`write_model_repo(dir)` writes small Python-backend models (identity_fp32, identity_bytes, add_sub,
sequence_accumulate, repeat_decoupled, always_fails). `start_server(kind, repo, log_dir)` runs Trireme
(`python -m service serve ...`) or the real Triton from a command template, waits until it is ready,
and returns a handle whose `stop()` leaves no process behind. Override the command with
TRIREME_LOAD_SERVER_CMD (a template with {python} {triton} {repo} {grpc} {http} {metrics}).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from load.tools import tool

TRITON_BIN = str(tool("tritonserver"))  # from tools/install-triton-tools.sh, under $TRIREME_TOOLS
PERF_ANALYZER_BIN = str(tool("perf_analyzer"))
COMMANDS = {
    "trireme": "{python} -m service serve --model-repository {repo} --grpc-port {grpc} --http-port {http} "
    "--metrics-port {metrics} --allow-client-shm=true",
    "triton": "{triton} --model-repository={repo} --grpc-port={grpc} --http-port={http} --metrics-port={metrics}",
}

_IDENTITY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
        return out
"""

_ADD_SUB = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            out.append(pb_utils.InferenceResponse(outputs))
        return out
"""

_ACCUMULATE = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        out = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            cid = request.correlation_id()
            total = (0 if int(start.reshape(-1)[0]) else self.sums.get(cid, 0)) + int(value.reshape(-1)[0])
            self.sums[cid] = total
            result = np.full(value.shape, total, dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", result)]))
        return out
"""

_REPEAT = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            for _ in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


_FAIL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("model refuses on purpose")) for _ in requests]
"""


def _io(kind: str, name: str, dtype: str, dims: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }} ]\n'


MODELS: dict[str, tuple[str, str]] = {
    "identity_fp32": (
        "max_batch_size: 8\n" + _io("input", "INPUT0", "TYPE_FP32", "16") + _io("output", "OUTPUT0", "TYPE_FP32", "16"),
        _IDENTITY,
    ),
    "identity_bytes": (
        "max_batch_size: 8\n"
        + _io("input", "INPUT0", "TYPE_STRING", "1")
        + _io("output", "OUTPUT0", "TYPE_STRING", "1"),
        _IDENTITY,
    ),
    "add_sub": (
        "max_batch_size: 8\n"
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        _ADD_SUB,
    ),
    "sequence_accumulate": (
        "max_batch_size: 4\n"
        "sequence_batching {\n  max_sequence_idle_microseconds: 5000000\n  control_input [\n"
        '    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },\n'
        '    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }\n  ]\n}\n'
        + _io("input", "INPUT", "TYPE_INT32", "1")
        + _io("output", "OUTPUT", "TYPE_INT32", "1"),
        _ACCUMULATE,
    ),
    "repeat_decoupled": (
        "max_batch_size: 8\nmodel_transaction_policy { decoupled: true }\n"
        + _io("input", "INPUT0", "TYPE_FP32", "16")
        + _io("output", "OUTPUT0", "TYPE_FP32", "16"),
        _REPEAT,
    ),
    "always_fails": (
        "max_batch_size: 8\n" + _io("input", "INPUT0", "TYPE_FP32", "16") + _io("output", "OUTPUT0", "TYPE_FP32", "16"),
        _FAIL,
    ),
}


def write_model_repo(root: Path, names: list[str] | None = None) -> Path:
    """Write the test/benchmark models under `root` (created if needed) and return it."""
    for name in names or list(MODELS):
        config, code = MODELS[name]
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        head = f'name: "{name}"\nbackend: "python"\n'
        tail = "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        (root / name / "config.pbtxt").write_text(head + config + tail)
        (root / name / "1" / "model.py").write_text(code)
    return root


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def available_kinds() -> list[str]:
    """Server kinds that could be started here, preferred first (Trireme, then real Triton)."""
    kinds = []
    if (
        importlib.util.find_spec("service") is not None
        and Path(__file__).parent.parent.joinpath("service", "__main__.py").exists()
    ):
        kinds.append("trireme")
    if Path(TRITON_BIN).exists():
        kinds.append("triton")
    return kinds


@dataclass
class ServerHandle:
    """A running server: its kind, gRPC URL, process and log file."""

    kind: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, wait, then SIGKILL the server and anything left in its process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: stubs it may have left


def start_server(kind: str, repo: Path, log_dir: Path, timeout_s: float = 90.0) -> ServerHandle:
    """Start a server of `kind` on free ports and wait until ServerReady; RuntimeError if it never is."""
    from load.transports.client import ClientError, InferenceClient

    grpc, http, metrics = free_port(), free_port(), free_port()
    template = os.environ.get("TRIREME_LOAD_SERVER_CMD") or COMMANDS[kind]
    cmd = template.format(python=sys.executable, triton=TRITON_BIN, repo=repo, grpc=grpc, http=http, metrics=metrics)
    log_path = log_dir / f"{kind}-{grpc}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(shlex.split(cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    handle = ServerHandle(kind, f"127.0.0.1:{grpc}", proc, log_path)
    deadline = time.monotonic() + timeout_s
    with InferenceClient(handle.url, timeout_s=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if client.server_ready():
                    return handle
            except ClientError:
                pass
            time.sleep(0.2)
    handle.stop()
    raise RuntimeError(f"{kind} server did not become ready ({cmd}):\n{handle.log_tail()}")


def start_preferred(repo: Path, log_dir: Path) -> ServerHandle:
    """Trireme when it serves, else real Triton; TRIREME_LOAD_SERVER=trireme|triton forces one."""
    forced = os.environ.get("TRIREME_LOAD_SERVER")
    kinds = [forced] if forced else available_kinds()
    if not kinds:
        raise RuntimeError(f"neither Trireme (python -m service) nor Triton ({TRITON_BIN}) is available")
    problems = []
    for kind in kinds:
        try:
            return start_server(kind, repo, log_dir)
        except (RuntimeError, OSError) as err:
            problems.append(str(err))
    raise RuntimeError("no server could be started:\n" + "\n".join(problems))
