"""Starting a worker process: its command line, its environment, its frame channel (two pipes) and its cancel
socket."""

from __future__ import annotations

import asyncio
import os
import socket

from service.ipc.launch import fds_env, worker_command
from service.ipc.pipes import PipeEnds, close_ends, pipe_pair


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a worker: ours (with `extra` on top), plus the repo root in front of PYTHONPATH so
    `service` imports anywhere (an execution environment's `extra` replaces the server's PYTHONPATH)."""
    env = dict(os.environ)
    if extra:
        env.update(extra)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


async def spawn_worker(
    env: dict[str, str], title: dict[str, str], python: str = ""
) -> tuple[asyncio.subprocess.Process, PipeEnds, socket.socket]:
    """Start `python -m service.worker.main model=.. version=.. instance=..` (`title`: what ps shows; the
    descriptors go in the environment; `python`: an execution environment's interpreter, "" for ours):
    (process, the server's ends of the frame pipes, non-blocking cancel socket)."""
    # Cancel frames get their own socket: a worker thread blocks on it, so a running execute() sees
    # is_cancelled() without anything waking up on the hot path.
    cancel_sock, cancel_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    cancel_sock.setblocking(False)
    try:
        parent_ends, child_ends = pipe_pair()
    except BaseException:
        cancel_sock.close()
        cancel_child.close()
        raise
    try:
        fds = [child_ends.read_fd, child_ends.write_fd, cancel_child.fileno()]
        proc = await asyncio.create_subprocess_exec(
            *worker_command(title, python),
            pass_fds=fds,
            env=worker_env({**env, **fds_env(fds)}),
            stdin=asyncio.subprocess.DEVNULL,
            # own session: signals sent to the server's process group (Ctrl-C, timeout) must not
            # kill workers behind the server's back; the server stops them, or they exit on EOF
            start_new_session=True,
        )
    except BaseException:
        close_ends(parent_ends)
        cancel_sock.close()
        raise
    finally:
        close_ends(child_ends)
        cancel_child.close()
    return proc, parent_ends, cancel_sock
