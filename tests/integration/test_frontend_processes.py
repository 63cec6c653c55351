"""--frontend-processes 2: two front-end processes share the gRPC and HTTP ports over one core process. Clients
connected to different front ends share sequences, shared-memory regions, statistics, /metrics and model control;
cancellation, drain on SIGTERM and the restart of a killed front end work as with one process."""

from __future__ import annotations

import json
import queue
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.conftest import ServerProcess
from tests.integration.models import write_python_model
from tests.integration.test_cancel import executions, slow_inputs, wait_for
from tests.integration.test_stream_models import ACCUMULATE_PY, accumulate_config, write_repeat, write_slow

FRONTENDS = ["--frontend-processes", "2"]
# gRPC shares one connection between channels to the same target unless told otherwise
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def frontend_pids(server: ServerProcess) -> list[int]:
    """PIDs of the server's front-end processes."""
    pids = []
    for p in psutil.Process(server.proc.pid).children():
        try:
            if "service.remote.frontend_main" in " ".join(p.cmdline()):
                pids.append(p.pid)
        except psutil.Error:  # exited (a zombie until the core reaps it)
            continue
    return sorted(pids)


def connections(pid: int, port: int) -> set[int]:
    """Client-side ports of the established connections that front end `pid` accepted on `port`."""
    return {
        c.raddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED and c.raddr
    }


def client_on(
    server: ServerProcess, wanted: int, tries: int = 64, channel_args: list[tuple[str, Any]] | None = None
) -> grpcclient.InferenceServerClient:
    """A gRPC client whose connection front end `wanted` accepted (the kernel balances new connections)."""
    for _ in range(tries):
        before = {pid: connections(pid, server.port) for pid in frontend_pids(server)}
        args = OWN_CONNECTION + (channel_args or [])
        client = grpcclient.InferenceServerClient(server.url, channel_args=args)
        client.is_server_live()  # connects
        after = {pid: connections(pid, server.port) for pid in before}
        owner = [pid for pid in before if after[pid] - before[pid]]
        if owner == [wanted]:
            return client
        client.close()
    raise AssertionError(f"no connection landed on front end {wanted} in {tries} tries")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("frontends")
    return {"repo": base / "repo", "base": base, "slow_log": base / "slow.log"}


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    """Two front ends over one core: an accumulator (sequence batcher), a decoupled model, a slow model and an
    identity model, in explicit model-control mode (everything loaded at start)."""
    repo = paths["repo"]
    from tests.conftest import write_model

    write_model(repo, "acc", accumulate_config("acc", 0), ACCUMULATE_PY)
    write_repeat(repo)
    write_slow(repo, paths["slow_log"])
    write_python_model(repo, "ident")
    args = [*FRONTENDS, "--model-control-mode", "explicit", "--load-model", "*"]
    srv = ServerProcess([repo], args, paths["base"] / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def pair(server: ServerProcess) -> Iterator[tuple[grpcclient.InferenceServerClient, grpcclient.InferenceServerClient]]:
    """Two gRPC clients connected to different front ends."""
    first, second = frontend_pids(server)
    a, b = client_on(server, first), client_on(server, second)
    yield a, b
    a.close()
    b.close()


def ident_inputs(values: list[float]) -> list[grpcclient.InferInput]:
    i = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    i.set_data_from_numpy(np.array(values, dtype=np.float32))
    return [i]


def acc(client: Any, x: int, start: bool = False, end: bool = False) -> int:
    i = grpcclient.InferInput("INPUT", [1], "INT32")
    i.set_data_from_numpy(np.array([x], dtype=np.int32))
    result = client.infer("acc", [i], sequence_id=42, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0])


def test_two_frontend_processes_share_the_ports(server: ServerProcess) -> None:
    pids = frontend_pids(server)
    assert len(pids) == 2
    clients = [client_on(server, pid) for pid in pids]
    try:
        for c in clients:
            assert c.is_server_ready()
            assert c.infer("ident", ident_inputs([1.5])).as_numpy("OUTPUT0").tolist() == [1.5]
    finally:
        for c in clients:
            c.close()
    for _ in range(8):  # HTTP too: every request answered whichever front end accepted it
        assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 200


def test_sequence_through_both_frontends(pair: tuple[Any, Any]) -> None:
    a, b = pair
    assert acc(a, 1, start=True) == 1
    assert acc(b, 10) == 11  # the core's sequence batcher holds the sequence's state, whoever forwards it
    assert acc(a, 100) == 111
    assert acc(b, 1000, end=True) == 1111


def test_statistics_and_metrics_count_every_frontend(server: ServerProcess, pair: tuple[Any, Any]) -> None:
    a, b = pair
    before = a.get_inference_statistics("ident").model_stats[0].inference_count
    for c in (a, b, a, b, b):
        c.infer("ident", ident_inputs([2.0]))
    for c in (a, b):
        assert c.get_inference_statistics("ident").model_stats[0].inference_count == before + 5
    text = requests.get(server.metrics_url, timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("nv_inference_request_success") and '"ident"' in x)
    assert float(line.rsplit(" ", 1)[1]) == before + 5


def test_shm_registered_through_one_frontend_used_through_the_other(pair: tuple[Any, Any]) -> None:
    a, b = pair
    key = f"/fe_shm_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("fe_region", key, 32)
    try:
        shm.set_shared_memory_region(handle, [np.array([1, 2, 3, 4], dtype=np.float32)])
        a.register_system_shared_memory("fe_region", key, 32)
        assert "fe_region" in str(b.get_system_shared_memory_status())
        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
        inp.set_shared_memory("fe_region", 16)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("fe_region", 16, offset=16)
        b.infer("ident", [inp], outputs=[out])
        result = shm.get_contents_as_numpy(handle, np.float32, [4], offset=16)
        assert result.tolist() == [1, 2, 3, 4]
        b.unregister_system_shared_memory("fe_region")
        assert "fe_region" not in str(a.get_system_shared_memory_status())
    finally:
        shm.destroy_shared_memory_region(handle)


def test_decoupled_stream(pair: tuple[Any, Any]) -> None:
    for client in pair:
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error, q=results: q.put((result, error)))
        values = grpcclient.InferInput("IN", [3], "INT32")
        values.set_data_from_numpy(np.array([4, 5, 6], dtype=np.int32))
        delays = grpcclient.InferInput("DELAY", [3], "UINT32")
        delays.set_data_from_numpy(np.array([10, 10, 10], dtype=np.uint32))
        wait = grpcclient.InferInput("WAIT", [1], "UINT32")
        wait.set_data_from_numpy(np.array([0], dtype=np.uint32))
        client.async_stream_infer("repeat_int32", [values, delays, wait])
        got = []
        for _ in range(3):
            result, error = results.get(timeout=30)
            assert error is None
            got.append(int(result.as_numpy("OUT")[0]))
        client.stop_stream()
        assert got == [4, 5, 6]


def test_cancelling_a_call_and_a_stream(pair: tuple[Any, Any], paths: dict[str, Path]) -> None:
    a, b = pair
    log = paths["slow_log"]
    start = len(executions(log))
    done: list[Any] = []
    running = a.async_infer("slow_identity", slow_inputs(1, 5000), callback=lambda result, error: done.append(error))
    time.sleep(0.3)
    b.start_stream(callback=lambda result, error: done.append(error))
    b.async_stream_infer("slow_identity", slow_inputs(2, 0))  # queued behind the running call
    time.sleep(0.3)
    b.stop_stream(cancel_requests=True)
    running.cancel()
    wait_for(lambda: len(executions(log)) == start + 1)
    time.sleep(0.5)  # the queued stream request would have started by now if it were still queued
    assert executions(log)[start:] == ["1 cancelled=True"]
    assert any(e is not None and "CANCELLED" in e.status() for e in done)


def test_model_control_seen_by_the_other_frontend(pair: tuple[Any, Any]) -> None:
    a, b = pair
    a.unload_model("ident")
    wait_for(lambda: not b.is_model_ready("ident"))
    with pytest.raises(Exception, match="ident"):
        b.infer("ident", ident_inputs([1.0]))
    b.load_model("ident")
    assert a.is_model_ready("ident")
    assert a.infer("ident", ident_inputs([3.0])).as_numpy("OUTPUT0").tolist() == [3.0]


def _http_ready(server: ServerProcess) -> bool:
    """/v2/health/ready answers 200 (400 while the replacement is not connected to the core yet). Strict: every
    front end accepts from the core's one HTTP listening socket (service/remote/ports.py), which stays open while
    one is killed and replaced, so a new connection is neither refused nor reset."""
    return requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 200


def test_killed_frontend_is_restarted(server: ServerProcess) -> None:
    victim = frontend_pids(server)[0]
    psutil.Process(victim).kill()
    wait_for(lambda: len(frontend_pids(server)) == 2 and victim not in frontend_pids(server), 30)
    wait_for(lambda: _http_ready(server), 30)
    for pid in frontend_pids(server):  # both serve again
        c = client_on(server, pid)
        try:
            assert c.infer("ident", ident_inputs([4.0])).as_numpy("OUTPUT0").tolist() == [4.0]
        finally:
            c.close()
    assert "front-end process 0" in server.log() and "restarting it" in server.log()


def test_drain_on_sigterm(tmp_path: Path) -> None:
    repo, log = tmp_path / "repo", tmp_path / "slow.log"
    write_slow(repo, log)
    srv = ServerProcess([repo], FRONTENDS, tmp_path / "server.log")
    try:
        srv.wait_ready()
        pids = frontend_pids(srv)
        client = grpcclient.InferenceServerClient(srv.url)
        done: list[Any] = []
        client.async_infer(
            "slow_identity", slow_inputs(5, 1500), callback=lambda result, error: done.append((result, error))
        )
        time.sleep(0.5)
        srv.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: len(done) == 1, 20)
        result, error = done[0]
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [5]  # the in-flight call finished
        assert srv.proc.wait(30) == 0
        client.close()
        for pid in pids:  # no front end outlives the core
            wait_for(lambda pid=pid: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 10)
    finally:
        srv.stop()


def test_tracing_through_both_frontends(tmp_path: Path) -> None:
    """One trace file, written by the core, holds the traces of requests from both front ends with every stamp
    in order; trace settings changed through one front end hold for the other, and trace_count for both."""
    from tests.integration.test_tracing import ORDER, traces_by_id

    repo, trace_file = tmp_path / "repo", tmp_path / "trace.json"
    write_python_model(repo, "ident")
    args = [*FRONTENDS, "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS"]
    args += ["--trace-config", "rate=1", "--trace-config", "count=0"]  # nothing traced until a client says so
    srv = ServerProcess([repo], args, tmp_path / "server.log")
    try:
        srv.wait_ready()
        first, second = frontend_pids(srv)
        a, b = client_on(srv, first), client_on(srv, second)
        a.infer("ident", ident_inputs([0.5]), request_id="untraced")
        a.update_trace_settings(settings={"trace_count": "6"})
        assert b.get_trace_settings(as_json=True)["settings"]["trace_count"]["value"] == ["6"]
        for i in range(5):  # 10 requests, alternating front ends (b first: it sees a's change): the first 6 traced
            b.infer("ident", ident_inputs([float(i)]), request_id=f"b{i}")
            a.infer("ident", ident_inputs([float(i)]), request_id=f"a{i}")
        assert a.get_trace_settings(as_json=True)["settings"]["trace_count"]["value"] == ["0"]
        a.close()
        b.close()
    finally:
        srv.stop()  # log_frequency 0: the core writes the file at exit
    traces = traces_by_id(json.loads(trace_file.read_text()))
    assert sorted(t["request_id"] for t in traces.values()) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    for t in traces.values():
        assert t["model_name"] == "ident" and t["model_version"] == 1
        stamps = t["timestamps"]
        assert list(stamps) == ORDER, stamps
        values = [stamps[name] for name in ORDER]
        assert values == sorted(values), stamps
    assert not list(tmp_path.glob("trace.json.*"))  # one file
