"""--frontend-processes 2: the front ends accept from the core's listening sockets, inherited (one accept queue per
address), for HTTP and for gRPC on the h2 transport. A stopped front end takes no new connection (with a
listener of its own per process, SO_REUSEPORT, the kernel gave it about half of them, which hung); connections
waiting to be accepted when a front end is killed are served by the other one (with SO_REUSEPORT those queued on
the killed one were reset); a restarted front end inherits the same sockets. gRPC on grpcio binds its own
SO_REUSEPORT listener in each front end (service/remote/ports.py): its part is skipped there."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient

from service.config.groups.grpc_transport import default_transport
from tests.conftest import ServerProcess
from tests.integration.test_cancel import wait_for
from tests.integration.test_frontend_processes import FRONTENDS, OWN_CONNECTION, client_on, frontend_pids

CONNECTIONS = 16
ANSWER_S = 60.0  # generous: a front end that holds a connection it never accepts hangs it for good
H2 = default_transport() == "h2"  # the transport the server starts with ($TRIREME_GRPC_TRANSPORT, else h2)
HTTP_REQUEST = b"GET /v2/health/live HTTP/1.1\r\nHost: trireme\r\n\r\n"
# the HTTP/2 client preface and an empty SETTINGS frame: a server answers with its own SETTINGS frame
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    (tmp_path / "repo").mkdir()
    srv = ServerProcess([tmp_path / "repo"], FRONTENDS, tmp_path / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        for pid in frontend_pids(srv):  # a front end a failed test left stopped would hold up the drain
            os.kill(pid, signal.SIGCONT)
        srv.stop()


def listening_sockets(pid: int, port: int) -> set[str]:
    """The listening sockets of process `pid` on `port`, as their inodes ('socket:[N]'): the same inode in two
    processes is one socket, with one accept queue."""
    found = set()
    for c in psutil.Process(pid).net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.fd >= 0:
            found.add(os.readlink(f"/proc/{pid}/fd/{c.fd}"))
    return found


def assert_inherited(server: ServerProcess) -> None:
    """Every front end listens on the core's sockets of the HTTP port (and of the gRPC port on h2), no other."""
    ports = [server.http_port] + ([server.port] if H2 else [])
    for port in ports:
        core = listening_sockets(server.proc.pid, port)
        assert len(core) == 1, (port, core)  # 127.0.0.1: one address
        for pid in frontend_pids(server):
            assert listening_sockets(pid, port) == core, (port, pid)


def connect(port: int, first: bytes) -> socket.socket:
    """A new connection, established (in an accept queue, or accepted) before this returns, that sent `first`."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S)
    sock.sendall(first)
    return sock


def first_bytes(socks: list[socket.socket], n: int) -> list[bytes | str]:
    """The first `n` bytes each connection received within ANSWER_S in all, or what became of it ("reset",
    "closed", "silent")."""
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    result: dict[socket.socket, bytes | str] = {}
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + ANSWER_S
        while len(result) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(n - len(got[s]))
                except ConnectionResetError:
                    data, result[s] = b"", "reset"
                if not data:
                    result.setdefault(s, "closed")
                    sel.unregister(s)
                    continue
                got[s] += data
                if len(got[s]) >= n:
                    result[s] = got[s]
                    sel.unregister(s)
    return [result.get(s, "silent") for s in socks]


def test_frontends_inherit_the_cores_listening_sockets(server: ServerProcess) -> None:
    assert len(frontend_pids(server)) == 2
    assert_inherited(server)


def test_stopped_and_killed_frontend_loses_no_connection(server: ServerProcess) -> None:
    victim = frontend_pids(server)[0]
    os.kill(victim, signal.SIGSTOP)
    try:
        # new connections while a front end is stopped: all answered, by the other one
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            http = pool.map(
                lambda _: requests.get(f"http://{server.http_url}/v2/health/live", timeout=ANSWER_S), range(CONNECTIONS)
            )
            assert [r.status_code for r in http] == [200] * CONNECTIONS
            if H2:

                def live(_: int) -> bool:
                    client = grpcclient.InferenceServerClient(server.url, channel_args=OWN_CONNECTION)
                    try:
                        return bool(client.is_server_live(client_timeout=ANSWER_S))
                    finally:
                        client.close()

                assert list(pool.map(live, range(CONNECTIONS))) == [True] * CONNECTIONS
        # connections established (waiting in the accept queue, or accepted by the running front end) when the
        # stopped front end is killed: none is lost
        http_socks = [connect(server.http_port, HTTP_REQUEST) for _ in range(CONNECTIONS)]
        h2_socks = [connect(server.port, H2_PREFACE) for _ in range(CONNECTIONS if H2 else 0)]
        os.kill(victim, signal.SIGKILL)
        assert first_bytes(http_socks, 12) == [b"HTTP/1.1 200"] * CONNECTIONS
        frames = first_bytes(h2_socks, 9)
        assert [f if isinstance(f, str) else f[3] for f in frames] == [4] * len(h2_socks)  # a SETTINGS frame each
        for s in http_socks + h2_socks:
            s.close()
    finally:
        if psutil.pid_exists(victim):
            os.kill(victim, signal.SIGKILL)
    # the supervisor restarts it on the same sockets, and it serves
    wait_for(lambda: len(frontend_pids(server)) == 2 and victim not in frontend_pids(server), 30)
    wait_for(lambda: requests.get(f"http://{server.http_url}/v2/health/ready", timeout=ANSWER_S).status_code == 200, 60)
    assert_inherited(server)
    for pid in frontend_pids(server):
        client = client_on(server, pid, channel_args=OWN_CONNECTION)
        try:
            assert client.is_server_ready()
        finally:
            client.close()
    assert "restarting it" in server.log()
