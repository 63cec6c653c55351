"""The core process's front-end processes: make the shared ports (ports.py), start N front ends, restart one that
dies, drain them on shutdown. Front ends are fresh interpreters (`python -m service.remote.frontend_main`), never
forks of the running event loop; each inherits the listening sockets of the shared ports, a restarted one the same
sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys

from service.config.flags import ServerConfig
from service.core.engine import Engine
from service.remote.host import RemoteHost
from service.remote.ports import SharedPort, grpc_port, http_port

log = logging.getLogger("trireme.frontends")

RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)


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
        self._ports: list[SharedPort] = []
        self._grpc = SharedPort(0)
        self._http = SharedPort(0)
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
        """Make the shared ports, start the front ends and wait until all listen (OSError when one cannot start)."""
        config = self.config
        self._grpc = grpc_port(config.grpc_address, config.grpc_port, config.grpc.reuse_port, config.grpc.transport)
        self._ports.append(self._grpc)
        self.grpc_port = self._grpc.port
        if config.allow_http:
            self._http = http_port(config.http_address, config.http_port, config.reuse_http_port)
            self._ports.append(self._http)
            self.http_port = self._http.port
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
        args += [str(self.grpc_port), str(self.http_port), str(trace_fd)]
        grpc_fds, http_fds = [s.fileno() for s in self._grpc.listening], [s.fileno() for s in self._http.listening]
        args += [",".join(map(str, grpc_fds)) or "-", ",".join(map(str, http_fds)) or "-", "--", *self.argv]
        return await asyncio.create_subprocess_exec(*args, pass_fds=(trace_fd, *grpc_fds, *http_fds))

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
        # the listening sockets close once every front end has stopped listening too: new connections are then
        # refused, as when one process stops, rather than queued for nobody
        for port in self._ports:
            port.close()
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
