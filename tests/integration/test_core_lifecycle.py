"""Model lifecycle through a real server: crashes and restarts, broken models, auto-complete, version policies, CLI."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_example, shm_entries, write_model
from tests.integration.models import python_config

CRASHY_CONFIG = python_config(
    "crashy", [("INPUT0", "TYPE_FP32", [1])], [("OUTPUT0", "TYPE_FP32", [1])], max_batch_size=4
)

# INPUT0 == 1: os._exit; == 2: segfault; == 3: sleep 2 s (to be killed); else identity.
# Every start after the first sleeps 1.5 s in initialize, so a restart is observable from the outside.
CRASHY_MODEL = """
    import ctypes
    import os
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            marker = os.path.join(args["model_repository"], "started")
            if os.path.exists(marker):
                time.sleep(1.5)
            with open(marker, "a") as f:
                f.write("x")

        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                if x[0, 0] == 1:
                    os._exit(3)
                if x[0, 0] == 2:
                    ctypes.string_at(0)
                if x[0, 0] == 3:
                    time.sleep(2)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            return out
"""


def _value(v: float) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    t.set_data_from_numpy(np.array([[v]], np.float32))
    return [t]


def _wait_ready(client: grpcclient.InferenceServerClient, model: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.is_model_ready(model):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{model} not ready after {timeout_s} s")


@pytest.mark.parametrize(("trigger", "how"), [(1.0, "os._exit"), (2.0, "segfault")])
def test_crashing_stub_fails_only_its_request_and_restarts(
    tmp_path: Path, start_server, trigger: float, how: str
) -> None:
    write_model(tmp_path, "crashy", CRASHY_CONFIG, CRASHY_MODEL)
    copy_example(tmp_path, "identity_fp32")
    server = start_server([tmp_path])
    client = grpcclient.InferenceServerClient(server.url)
    assert client.infer("crashy", _value(5.0)).as_numpy("OUTPUT0")[0, 0] == 5.0
    pids_before = set(server.worker_pids())
    with pytest.raises(InferenceServerException) as info:
        client.infer("crashy", _value(trigger))
    assert info.value.status() == "StatusCode.UNAVAILABLE", how
    assert "Stub process 'crashy_0' is not healthy" in info.value.message()
    # the restart takes >= 1.5 s: meanwhile the model is not ready, the server and other models still serve
    assert not client.is_model_ready("crashy")
    assert not client.is_server_ready()  # its only instance is dead: /v2/health/ready too, as Triton 2.73
    assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 400
    assert client.is_server_live()
    ones = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    ones.set_data_from_numpy(np.ones((1, 16), np.float32))
    assert client.infer("identity_fp32", [ones]).as_numpy("OUTPUT0").sum() == 16
    _wait_ready(client, "crashy")
    assert client.infer("crashy", _value(7.0)).as_numpy("OUTPUT0")[0, 0] == 7.0
    assert set(server.worker_pids()) != pids_before  # a new stub process
    assert "restarted" in server.log()
    client.close()


def test_kill_9_of_stub_fails_in_flight_requests_and_recovers(tmp_path: Path, start_server) -> None:
    write_model(tmp_path, "crashy", CRASHY_CONFIG, CRASHY_MODEL)
    server = start_server([tmp_path])
    client = grpcclient.InferenceServerClient(server.url)
    (worker_pid,) = server.worker_pids()
    errors: list[InferenceServerException] = []

    def slow_call() -> None:
        try:
            client.infer("crashy", _value(3.0))
        except InferenceServerException as e:
            errors.append(e)

    thread = threading.Thread(target=slow_call)
    thread.start()
    time.sleep(0.5)  # the request is now inside execute (sleeping 2 s)
    os.kill(worker_pid, signal.SIGKILL)
    thread.join(10)
    assert len(errors) == 1 and errors[0].status() == "StatusCode.UNAVAILABLE"
    assert "exit status -9" in errors[0].message()
    _wait_ready(client, "crashy")
    assert client.infer("crashy", _value(4.0)).as_numpy("OUTPUT0")[0, 0] == 4.0
    client.close()


def test_broken_models_next_to_working_ones(tmp_path: Path, start_server) -> None:
    copy_example(tmp_path, "add_sub")
    write_model(
        tmp_path, "bad_config", 'name: "bad_config"\nbackend: "python"\ninput [ { name: "X" data_typ: TYPE_FP32 } ]\n'
    )
    write_model(
        tmp_path,
        "bad_init",
        CRASHY_CONFIG.replace('"crashy"', '"bad_init"'),
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('no weights found')\n",
    )
    server = start_server([tmp_path], ["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["add_sub"].state == "READY"
    assert index["bad_config"].state == "UNAVAILABLE"
    assert "config.pbtxt" in index["bad_config"].reason and "data_typ" in index["bad_config"].reason
    assert index["bad_init"].state == "UNAVAILABLE"
    assert "RuntimeError: no weights found" in index["bad_init"].reason
    assert not client.is_model_ready("bad_init")
    assert client.is_model_ready("add_sub")
    assert not client.is_server_ready()  # strict readiness, as Triton
    with pytest.raises(InferenceServerException) as info:
        client.infer("bad_init", _value(1.0))
    assert info.value.status() == "StatusCode.NOT_FOUND"  # Triton: "... has no available versions"
    a = grpcclient.InferInput("INPUT0", [4], "FP32")
    a.set_data_from_numpy(np.ones(4, np.float32))
    b = grpcclient.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.ones(4, np.float32))
    assert client.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [2, 2, 2, 2]
    client.close()


def test_exit_on_error_stops_startup(tmp_path: Path, start_server) -> None:
    write_model(tmp_path, "bad_config", 'name: "bad_config"\nbackend: "python"\nmax_batch_size: -1\n')
    server = start_server([tmp_path], wait=False)
    assert server.proc.wait(60) == 1
    assert "max_batch_size" in server.log()


AUTO_MODEL = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [3]})
            auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [3]})
            auto_complete_model_config.set_max_batch_size(4)
            auto_complete_model_config.set_dynamic_batching()
            return auto_complete_model_config

        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", 2 * x)]))
            return out
"""


def test_auto_complete_config_without_config_file(tmp_path: Path, start_server) -> None:
    (tmp_path / "auto" / "1").mkdir(parents=True)
    (tmp_path / "auto" / "1" / "model.py").write_text(AUTO_MODEL.replace("\n    ", "\n").strip() + "\n")
    server = start_server([tmp_path], ["--strict-model-config=false"])
    client = grpcclient.InferenceServerClient(server.url)
    config = client.get_model_config("auto", as_json=True)["config"]
    assert config["name"] == "auto" and config["backend"] == "python" and config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["IN"]
    assert "dynamic_batching" in config
    x = grpcclient.InferInput("IN", [1, 3], "INT32")
    x.set_data_from_numpy(np.array([[1, 2, 3]], np.int32))
    assert client.infer("auto", [x]).as_numpy("OUT").tolist() == [[2, 4, 6]]
    client.close()


def test_strict_model_config_disables_auto_complete(tmp_path: Path, start_server) -> None:
    (tmp_path / "auto" / "1").mkdir(parents=True)
    (tmp_path / "auto" / "1" / "model.py").write_text(AUTO_MODEL.replace("\n    ", "\n").strip() + "\n")
    server = start_server([tmp_path], ["--strict-model-config=true", "--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    (row,) = client.get_model_repository_index().models
    assert row.state == "UNAVAILABLE" and "auto-complete is disabled" in row.reason
    client.close()


IDENTITY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.version = int(args["model_version"])

        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + self.version)]))
            return out
"""


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [2, 3]),
        ("version_policy: { all: {} }", [1, 2, 3]),
        ("version_policy: { specific: { versions: [1, 3] } }", [1, 3]),
    ],
)
def test_version_policies(tmp_path: Path, start_server, policy: str, expected: list[int]) -> None:
    config = CRASHY_CONFIG.replace('"crashy"', '"versioned"') + policy
    for v in (1, 2, 3):
        write_model(tmp_path, "versioned", config, IDENTITY, version=v)
    (tmp_path / "versioned" / "01").mkdir()  # ignored: starts with 0
    (tmp_path / "versioned" / "notes").mkdir()  # ignored: not numeric
    server = start_server([tmp_path])
    client = grpcclient.InferenceServerClient(server.url)
    ready = [v for v in (1, 2, 3) if client.is_model_ready("versioned", str(v))]
    assert ready == expected
    assert client.infer("versioned", _value(10.0)).as_numpy("OUTPUT0")[0, 0] == 10.0 + max(expected)
    for v in expected:
        assert client.infer("versioned", _value(10.0), model_version=str(v)).as_numpy("OUTPUT0")[0, 0] == 10.0 + v
    assert list(client.get_model_metadata("versioned").versions) == [str(v) for v in expected]
    client.close()


def test_unknown_triton_flags_are_accepted_and_nothing_leaks(tmp_path: Path, start_server) -> None:
    copy_example(tmp_path, "identity_fp32")
    server = start_server(
        [tmp_path],
        [
            "--backend-directory=/opt/tritonserver/backends",
            "--pinned-memory-pool-byte-size=0",
            "--log-verbose=0",
            "--id=my-server",
        ],
    )
    assert "ignoring unsupported option '--pinned-memory-pool-byte-size=0'" in server.log()
    # Triton's backend directory is a real flag (Python-based backends); a missing one only warns
    assert "--backend-directory '/opt/tritonserver/backends' is not a directory" in server.log()
    client = grpcclient.InferenceServerClient(server.url)
    x = grpcclient.InferInput("INPUT0", [1, 1 << 16], "FP32")  # uses the worker arena
    assert client.is_server_ready()
    client.close()
    del x
    ours = f"trireme_{server.proc.pid}_"
    # arena names are unlinked as soon as both sides have mapped them
    assert not {n for n in shm_entries() if n.startswith(ours)}
    server.stop()
    assert server.proc.returncode == 0
    assert not {n for n in shm_entries() if n.startswith(ours)}
    assert "+---" in server.log() and "| identity_fp32" in server.log()


def test_group_signal_stops_the_server_not_its_workers(tmp_path: Path, start_server) -> None:
    copy_example(tmp_path, "identity_fp32", "add_sub")
    server = start_server([tmp_path])
    workers = server.worker_pids()
    assert len(workers) == 2
    os.killpg(server.proc.pid, signal.SIGTERM)  # as `timeout` does: the whole group; workers are not in it
    server.proc.wait(20)
    assert server.proc.returncode == 0  # orderly shutdown, workers finalized by the server
    assert "add_sub: cleaning up" in server.log()


def test_workers_exit_when_the_server_dies_hard(tmp_path: Path, start_server) -> None:
    copy_example(tmp_path, "identity_fp32")
    server = start_server([tmp_path])
    (worker,) = server.worker_pids()
    server.proc.kill()
    server.proc.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return  # the worker saw EOF on its control socket and exited
        time.sleep(0.05)
    raise AssertionError(f"worker {worker} outlived the killed server")
