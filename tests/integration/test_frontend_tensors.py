"""--frontend-processes 2 with large tensors: inputs and outputs of 64 KiB and more travel between the front ends
and the core through shared-memory arenas (service/remote/tensors.py), not inside the frames. Every answer holds
exactly its own request's bytes (blocks are reused only once given back), blocks do come back (the arenas stop
growing), the in-process instance mode (whose outputs may be views of the inputs) is as exact, and nothing is
left in /dev/shm once the server stops."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess
from tests.integration.models import write_python_model
from tests.integration.test_frontend_processes import FRONTENDS, client_on, frontend_pids

INLINE_MODE = 'parameters { key: "TRIREME_INSTANCE_MODE" value: { string_value: "in_process_inline" } }'
MODELS = ["ident", "ident_inline"]
SIZES = [70 << 10, 1 << 20, 8 << 20]  # over the arena threshold; the last one copied by a thread
BIG_MESSAGES = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def big_client_on(server: ServerProcess, pid: int) -> grpcclient.InferenceServerClient:
    return client_on(server, pid, channel_args=BIG_MESSAGES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("frontend_tensors")
    write_python_model(base / "repo", "ident")
    write_python_model(base / "repo", "ident_inline", extra=INLINE_MODE)
    srv = ServerProcess([base / "repo"], FRONTENDS, base / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def link_segments(pid: int) -> set[str]:
    """The front-end link arenas' segments process `pid` has mapped (names end in _fe<k> / _fl<k>, plus .<n>)."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-2] if line.endswith("(deleted)") else line.split()[-1]
        tail = path.rsplit("_", 1)[-1]
        if "trireme_" in path and tail.startswith(("fe", "fl")):
            names.add(path)
    return names


def infer(client: Any, model: str, data: np.ndarray) -> np.ndarray:
    x = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    x.set_data_from_numpy(data)
    out: np.ndarray = client.infer(model, [x]).as_numpy("OUTPUT0")
    return out


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_large_tensors_come_back_exactly(server: ServerProcess, model: str) -> None:
    clients = [big_client_on(server, pid) for pid in frontend_pids(server)]
    errors: list[str] = []

    def run(k: int) -> None:
        client = clients[k % 2]
        for size in SIZES:
            for rep in range(3):  # distinct bytes per call: a block reused too early shows up as foreign data
                data = np.arange(size // 4, dtype=np.float32) + (k * 1000 + rep * 100 + size % 97)
                try:
                    out = infer(client, model, data)
                except Exception as e:
                    errors.append(f"client {k} size {size} rep {rep}: {e}")
                    continue
                if not np.array_equal(out, data):
                    errors.append(f"client {k} size {size} rep {rep}: wrong bytes")

    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        for c in clients:
            c.close()
    assert errors == []


def test_large_binary_tensor_over_http(server: ServerProcess) -> None:
    data = np.arange(3 << 20, dtype=np.float32)  # 12 MiB
    binary = {"binary_data_size": data.nbytes}
    header = {
        "inputs": [{"name": "INPUT0", "shape": [data.size], "datatype": "FP32", "parameters": binary}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    r = requests.post(
        f"http://{server.http_url}/v2/models/ident/infer",
        data=head + data.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head))},
        timeout=60,
    )
    assert r.status_code == 200, r.text[:300]
    json_len = int(r.headers["Inference-Header-Content-Length"])
    assert np.array_equal(np.frombuffer(r.content[json_len:], np.float32), data)


def test_lent_blocks_come_back_and_the_arenas_stop_growing(server: ServerProcess) -> None:
    pid = frontend_pids(server)[0]
    core_before = link_segments(server.proc.pid)
    client = big_client_on(server, pid)
    try:
        data = np.ones(2 << 20, np.float32)  # 8 MiB: two fit in one 16 MiB segment
        for _ in range(24):
            assert np.array_equal(infer(client, "ident", data), data)
    finally:
        client.close()
    # one segment (two when a block was still out as the next was needed) for the front end's inputs and for
    # the core's outputs to it; blocks kept until the garbage collector ran would need about one per request.
    # The core also maps the other front end's arenas, which the module's earlier tests used: up to 2 x 2 x 2.
    core_after = link_segments(server.proc.pid)
    assert len(link_segments(pid)) <= 4, link_segments(pid)
    assert len(core_after - core_before) <= 2 and len(core_after) <= 8, (core_before, core_after)


def test_nothing_left_in_dev_shm_after_stop(tmp_path: Path) -> None:
    write_python_model(tmp_path / "repo", "ident")
    srv = ServerProcess([tmp_path / "repo"], FRONTENDS, tmp_path / "server.log")
    try:
        srv.wait_ready()
        pids = [srv.proc.pid, *frontend_pids(srv)]
        client = grpcclient.InferenceServerClient(srv.url)
        data = np.ones(1 << 20, np.float32)
        assert np.array_equal(infer(client, "ident", data), data)
        client.close()
        assert any(link_segments(p) for p in pids)  # the arenas were used
    finally:
        srv.stop()
    left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"trireme_{p}_") for p in pids)]
    assert left == []
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == "zombie"
