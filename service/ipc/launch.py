"""How a worker process is started: its command line (what `ps` and `top` show) and how it finds its channel.

The command line only names the worker (model, version, instance), as Triton's stub shows its model: the
descriptors of its channel (ipc/pipes.py) and cancel socket travel in an environment variable that the worker
reads and removes, so that nothing of the worker's own plumbing reaches `sys.argv` (or the environment) of the
model it runs.
"""

from __future__ import annotations

import os
import sys

WORKER_MODULE = "service.worker.main"
FDS_ENV = "TRIREME_WORKER_FDS"  # "<channel read fd>,<channel write fd>[,<cancel socket fd>]"


def worker_command(title: dict[str, str], python: str = "") -> list[str]:
    """argv of a worker: this interpreter (or an execution environment's) running the worker module, then
    `key=value` words naming it."""
    return [python or sys.executable, "-m", WORKER_MODULE, *(f"{key}={value}" for key, value in title.items())]


def fds_env(fds: list[int]) -> dict[str, str]:
    """The environment entry that hands the worker its inherited descriptors."""
    return {FDS_ENV: ",".join(str(fd) for fd in fds)}


def take_fds() -> list[int]:
    """The worker's descriptors, removed from the environment (children of the model never see them)."""
    value = os.environ.pop(FDS_ENV, "")
    try:
        return [int(part) for part in value.split(",") if part]
    except ValueError:
        raise SystemExit(f"{FDS_ENV} must list file descriptors, got '{value}'") from None


PLACEMENT_ENV = "TRIREME_WORKER_PLACEMENT"  # "<cores>;<numa node>": "0,1,2;0", "0,1;" or ";1"


def placement_env(cores: tuple[int, ...], memory_node: int | None) -> dict[str, str]:
    """The environment entry that tells a worker where to run (a host policy); {} when it may run anywhere."""
    if not cores and memory_node is None:
        return {}
    node = "" if memory_node is None else str(memory_node)
    return {PLACEMENT_ENV: ",".join(str(c) for c in cores) + ";" + node}


def take_placement() -> tuple[list[int], int | None]:
    """(cores, NUMA node to bind memory to) from the environment, removed from it; ([], None) when unset."""
    value = os.environ.pop(PLACEMENT_ENV, "")
    cores, _, node = value.partition(";")
    try:
        return [int(c) for c in cores.split(",") if c], int(node) if node else None
    except ValueError:
        raise SystemExit(f"{PLACEMENT_ENV} must be '<cores>;<node>', got '{value}'") from None
