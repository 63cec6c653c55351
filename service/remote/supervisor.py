"""The core process's front-end processes: reserve the shared ports, start N front ends, restart one that dies,
drain them on shutdown. Front ends are fresh interpreters (`python -m service.remote.frontend_main`), never forks of
the running event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys

from service.config.flags import ServerConfig
from service.core.engine import Engine
from service.remote.host import RemoteHost

log = logging.getLogger("trireme.frontends")

RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)


def reserve_port(address: str, port: int, shared: bool = False) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket: fixes the port (port 0 picks one) for the front ends that share
    it and fails early, as a single process would, when the address is taken. Kept open while the server runs.
    Unless `shared` (--reuse-grpc-port / --reuse-http-port), a port another server holds, even with
    SO_REUSEPORT, is taken: a plain bind tries it first."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    if port and not shared:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # as a listener binds (grpc and asyncio set SO_REUSEADDR): connections of a server that just exited,
            # left in TIME_WAIT, do not count; a server still bound to the port does
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


class Frontends:
    """N front-end processes over `engine`."""

    def __init__(self, config: ServerConfig, engine: Engine, argv: list[str]) -> None:
        self.config = config
        self.n = config.frontend_processes
        self.argv = argv
        # an abstract Unix socket name (Linux): nothing is left in the file system, even after kill -9
        path = f"\0trireme-frontends-{os.getpid()}-{secrets.token_hex(8)}"
        self.host = RemoteHost(engine, path, self.up)
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._reserved: list[socket.socket] = []
        self.grpc_port = 0
        self.http_port = 0
        self.stopping = False
        self._all_up = asyncio.Event()
        self.host.on_hello = self._hello

    def up(self) -> bool:
        """Every front end is connected and listening."""
        return not self.stopping and len(self.host.conns) == self.n

    def _hello(self, frontend_id: int) -> None:
        if len(self.host.conns) == self.n:
            self._all_up.set()

    async def start(self) -> None:
        """Reserve the ports, start the front ends and wait until all listen (OSError when one cannot start)."""
        config = self.config
        address = f"{config.grpc_address}:{config.grpc_port}"
        try:
            grpc_sock = reserve_port(config.grpc_address, config.grpc_port, config.grpc.reuse_port)
        except OSError:  # the message of one process (frontend/grpc/server.py build_grpc_server)
            raise OSError(f"unable to bind the gRPC server to {address} (address already in use?)") from None
        self._reserved.append(grpc_sock)
        self.grpc_port = int(grpc_sock.getsockname()[1])
        if config.allow_http:
            http_sock = reserve_port(config.http_address, config.http_port, config.reuse_http_port)
            self._reserved.append(http_sock)
            self.http_port = int(http_sock.getsockname()[1])
        await self.host.start()
        for i in range(self.n):
            self.procs[i] = await self._spawn(i)
        waiting = asyncio.ensure_future(self._all_up.wait())
        exits = [asyncio.ensure_future(p.wait()) for p in self.procs.values()]
        done, _ = await asyncio.wait([waiting, *exits], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        for f in exits:
            f.cancel()
        if waiting not in done:
            waiting.cancel()
            raise OSError("a front-end process did not start (see its log lines above)")
        self._watchers = [asyncio.ensure_future(self._watch(i)) for i in range(self.n)]
        log.info("%d front-end processes: pids %s", self.n, ", ".join(str(p.pid) for p in self.procs.values()))

    async def _spawn(self, i: int) -> asyncio.subprocess.Process:
        name = self.host.path.lstrip("\0")  # argv cannot carry the leading NUL: the front end adds it back
        args = [sys.executable, "-m", "service.remote.frontend_main", name, str(i)]
        trace_fd = self.host.tracing.fd  # the core's tracing switch (service/remote/tracing.py)
        args += [str(self.grpc_port), str(self.http_port), str(trace_fd), "--", *self.argv]
        return await asyncio.create_subprocess_exec(*args, pass_fds=(trace_fd,))

    async def _watch(self, i: int) -> None:
        """Restart front end i whenever it exits while the server runs (its requests were cancelled in the core)."""
        failures = 0
        while True:
            proc = self.procs[i]
            status = await proc.wait()
            if self.stopping:
                return
            log.warning("front-end process %d (pid %d) exited with status %s: restarting it", i, proc.pid, status)
            await asyncio.sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
            failures += 1
            if self.stopping:
                return
            self.procs[i] = await self._spawn(i)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    async def stop(self) -> None:
        """Drain: front ends stop accepting, finish their in-flight calls (up to --exit-timeout-secs), exit."""
        self.stopping = True
        for w in self._watchers:
            w.cancel()
        self.host.broadcast(("drain",))
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()  # a front end that has not said hello yet drains on SIGTERM too
        limit = self.config.exit_timeout_secs + 5
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), limit)
            except TimeoutError:
                log.warning("front-end process pid %d did not exit: killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        await self.host.stop()
        for sock in self._reserved:
            sock.close()
