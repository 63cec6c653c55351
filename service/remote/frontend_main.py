"""A front-end process (`python -m service.remote.frontend_main NAME ID GRPC_PORT HTTP_PORT TRACE_FD GRPC_FDS HTTP_FDS
-- SERVER_FLAGS`, NAME the core's abstract Unix socket name, TRACE_FD the inherited tracing switch, GRPC_FDS and
HTTP_FDS the inherited listening sockets of the ports, comma-separated, "-" for none):
the gRPC and HTTP front ends on ports shared with the other front-end processes, over a RemoteEngine connected to
the core process that started it. A port whose sockets are inherited is served from them, the one accept queue of
all front ends; one without (gRPC on grpcio or native) is bound again here with SO_REUSEPORT (remote/ports.py).
It exits when the core tells it to drain (after its in-flight calls finish, up to --exit-timeout-secs) or at once
when the core's connection closes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field

import uvloop

from service.config.flags import ServerConfig, parse_args
from service.config.tls import ssl_context
from service.core.facade import Facade
from service.core.observability.log_output import configure as configure_log
from service.core.observability.log_output import reopen as reopen_log_file
from service.frontend.grpc.server import build_grpc_server
from service.frontend.http.server import HttpFrontend, HttpOptions
from service.remote.client import RemoteEngine

log = logging.getLogger("trireme.frontend")


@dataclass
class Ports:
    """The shared ports and their inherited listening sockets (empty: bind the port with SO_REUSEPORT)."""

    grpc: int
    http: int
    grpc_sockets: list[socket.socket] = field(default_factory=list)
    http_sockets: list[socket.socket] = field(default_factory=list)

    @classmethod
    def parse(cls, grpc: str, http: str, grpc_fds: str, http_fds: str) -> Ports:
        def inherited(fds: str) -> list[socket.socket]:
            return [] if fds == "-" else [socket.socket(fileno=int(fd)) for fd in fds.split(",")]

        return cls(int(grpc), int(http), inherited(grpc_fds), inherited(http_fds))


async def serve_frontend(path: str, frontend_id: int, ports: Ports, trace_fd: int, config: ServerConfig) -> int:
    """Listen, serve until drained or orphaned; returns the exit status."""
    remote = RemoteEngine(path, frontend_id, config.model_control_mode, config.allow_client_shm, trace_fd)
    stop = asyncio.Event()
    lost = False

    def core_lost() -> None:
        nonlocal lost
        lost = True
        stop.set()

    remote.on_drain = stop.set
    remote.on_core_lost = core_lost
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if config.log_file:
        loop.add_signal_handler(signal.SIGHUP, reopen_log_file)  # the core forwards its SIGHUP (log rotation)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the core, which drains every front end
    await remote.connect()
    engine: Facade = remote  # the surface the front ends use (service/core/facade.py)
    address = f"{config.grpc_address}:{ports.grpc}"
    grpc_server, _ = build_grpc_server(engine, address, config.grpc, reuse_port=True, listening=ports.grpc_sockets)
    await grpc_server.start()
    http: HttpFrontend | None = None
    if config.allow_http:
        options = HttpOptions(
            address=config.http_address,
            port=ports.http,
            max_input_size=config.http_max_input_size,
            header_forward_pattern=config.http_header_forward_pattern,
            reuse_port=True,
            sock=ports.http_sockets[0] if ports.http_sockets else None,
            shutdown_timeout_s=config.exit_timeout_secs,
            restricted=list(config.http_restricted),
            ssl_context=ssl_context(config.http_tls),
        )
        http = HttpFrontend(engine, options)
        await http.start()
    remote.hello()
    await stop.wait()
    grace = 0 if lost else config.exit_timeout_secs
    stopping = [grpc_server.stop(grace=grace)]
    if http is not None:
        stopping.append(http.stop())
    await asyncio.gather(*stopping)
    remote.close()
    return 0


def main() -> None:
    path, frontend_id = "\0" + sys.argv[1], int(sys.argv[2])
    ports = Ports.parse(sys.argv[3], sys.argv[4], sys.argv[6], sys.argv[7])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("trireme.config", "trireme.trace"):  # the core already warned about its flags
        logging.getLogger(name).setLevel(logging.ERROR)
    trace_fd = int(sys.argv[5])
    config = parse_args(sys.argv[9:])
    if config.log_file or config.log_format:
        configure_log(config.log_file, config.log_format or "default")
    uvloop.install()
    try:
        code = asyncio.run(serve_frontend(path, frontend_id, ports, trace_fd, config))
    except (ConnectionError, OSError) as e:
        log.error("front end %d (pid %d) stops: %s", frontend_id, os.getpid(), e)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
