"""Worker shared-memory arenas grow on demand (`--backend-config=python,shm-growth-byte-size=N`): requests,
responses and BLS calls with tensors larger than the arena (`shm-default-byte-size`) travel through new shared
memory segments; only a full /dev/shm fails a request, with "Failed to increase the shared memory pool size",
and the server and the worker keep serving."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.models import elementwise_py, python_config

MIB = 1 << 20
ARENA_ARGS = [
    f"--backend-config=python,shm-default-byte-size={MIB}",
    f"--backend-config=python,shm-growth-byte-size={MIB}",
]

IDENTITY_CONFIG = python_config(
    "identity",
    [("IN", "TYPE_FP32", [-1])],
    [("OUT", "TYPE_FP32", [-1])],
    extra="instance_group [ { count: 1 kind: KIND_CPU } ]",
)

# OUT = IN + 1 (a new array the worker writes into its response arena)
IDENTITY_PY = elementwise_py("x + 1", inp="IN", out="OUT")

BLS_CONFIG = IDENTITY_CONFIG.replace('"identity"', '"bls_big"')

# Sends IN to `identity` through BLS (a request tensor in this worker's arena, the reply in the server's) and
# returns the reply + 1; a BLS error becomes this model's error.
BLS_PY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                reply = pb_utils.InferenceRequest(
                    model_name="identity", inputs=[pb_utils.get_input_tensor_by_name(r, "IN")],
                    requested_output_names=["OUT"],
                ).exec()
                if reply.has_error():
                    out.append(pb_utils.InferenceResponse(error=reply.error()))
                    continue
                x = pb_utils.get_output_tensor_by_name(reply, "OUT").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
            return out
"""


EXPAND_CONFIG = python_config("expand", [("MIB", "TYPE_INT32", [1])], [("OUT", "TYPE_FP32", [-1])])

# A small request, a large response: OUT holds MIB MiB of ones (grows the worker's response arena).
EXPAND_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                mib = int(pb_utils.get_input_tensor_by_name(r, "MIB").as_numpy()[0])
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(mib << 18, np.float32))]))
            return out
"""


def make_repo(repo: Path) -> Path:
    write_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    write_model(repo, "bls_big", BLS_CONFIG, BLS_PY)
    write_model(repo, "expand", EXPAND_CONFIG, EXPAND_PY)
    return repo


def mib_input(mib: int) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("MIB", [1], "INT32")
    t.set_data_from_numpy(np.array([mib], np.int32))
    return [t]


def tensor(n_bytes: int, seed: int = 0) -> tuple[list[grpcclient.InferInput], np.ndarray]:
    x = np.random.default_rng(seed).random(n_bytes // 4, dtype=np.float32)
    t = grpcclient.InferInput("IN", [x.size], "FP32")
    t.set_data_from_numpy(x)
    return [t], x


def mapped_arena_segments(pid: int) -> set[str]:
    """Arena segments (first and grown) mapped by a process."""
    with open(f"/proc/{pid}/maps") as f:
        return {
            line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
            for line in f
            if "/dev/shm/trireme_" in line
        }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = make_repo(tmp_path_factory.mktemp("repo"))
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log", ARENA_ARGS) as srv:
        yield srv


def test_tensors_larger_than_the_arena_grow_it(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        for size in (8 * MIB, 3 * MIB, 20 * MIB):  # 1 MiB arenas
            inputs, x = tensor(size, seed=size)
            np.testing.assert_array_equal(client.infer("identity", inputs).as_numpy("OUT"), x + 1)
        assert client.infer("expand", mib_input(6)).as_numpy("OUT").sum() == 6 * MIB // 4
    finally:
        client.close()
    # the grown segments live in shared memory, mapped by the worker and the server, their names already gone
    grown = {name for pid in server.worker_pids() for name in mapped_arena_segments(pid) if "." in name}
    assert grown, "no grown arena segment is mapped by a worker"
    assert grown & mapped_arena_segments(server.proc.pid)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"trireme_{server.proc.pid}_") and "." in n]


def test_bls_tensors_larger_than_the_arena(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        inputs, x = tensor(12 * MIB, seed=1)
        np.testing.assert_array_equal(client.infer("bls_big", inputs).as_numpy("OUT"), x + 2)
    finally:
        client.close()


def test_several_large_requests_in_flight(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    failures: list[BaseException] = []

    def one(seed: int) -> None:
        try:
            inputs, x = tensor((2 + seed) * MIB, seed=seed)
            model = "bls_big" if seed % 2 else "identity"
            expected = x + (2 if seed % 2 else 1)
            np.testing.assert_array_equal(client.infer(model, inputs, client_timeout=60).as_numpy("OUT"), expected)
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    threads = [threading.Thread(target=one, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    client.close()
    assert not failures, failures


def test_full_dev_shm_fails_the_request_and_the_server_keeps_serving(tmp_path: Path) -> None:
    # the server runs in its own mount namespace with a 48 MiB /dev/shm (needs unshare and mount rights)
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip("no permission to mount a private /dev/shm")
    wrapper = tmp_path / "small_shm.sh"
    wrapper.write_text('#!/bin/sh\nmount -t tmpfs -o size=48m tmpfs /dev/shm && exec "$@"\n')
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", str(wrapper)]
    repo = make_repo(tmp_path / "repo")
    with running_server([repo], tmp_path / "server.log", ARENA_ARGS, prefix=prefix) as srv:
        client = grpcclient.InferenceServerClient(srv.url)
        try:
            for model in ("identity", "bls_big"):
                inputs, _ = tensor(64 * MIB, seed=3)  # more than /dev/shm holds
                with pytest.raises(InferenceServerException) as e:
                    client.infer(model, inputs)
                assert "Failed to increase the shared memory pool size" in str(e.value)
                assert "/dev/shm is full" in str(e.value)
                # a tensor that fits what is left still works, on the same worker
                inputs, x = tensor(2 * MIB, seed=4)
                offset = 1 if model == "identity" else 2
                np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUT"), x + offset)
            # a small request whose response does not fit: the worker's arena cannot grow
            with pytest.raises(InferenceServerException) as e:
                client.infer("expand", mib_input(64))
            assert "Failed to increase the shared memory pool size" in str(e.value)
            assert client.infer("expand", mib_input(2)).as_numpy("OUT").size == 2 * MIB // 4
            assert client.is_server_live() and client.is_model_ready("identity")
        finally:
            client.close()
        pids = srv.worker_pids()
    assert pids
