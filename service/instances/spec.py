"""InstanceSpec: everything needed to (re)start one model instance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class InstanceSpec:
    """Everything needed to (re)start one model instance."""

    backend: str
    model_name: str
    model_version: str
    model_dir: str
    version_dir: str
    config_json: str
    instance_name: str
    instance_kind: str = "CPU"
    device_id: int = 0
    group_name: str = ""  # the instance_group it comes from (its rate_limiter settings)
    arena_bytes: int = 256 << 20
    arena_growth_bytes: int = 64 << 20
    arena_reserve: bool = False  # posix_fallocate the arenas at start (a full /dev/shm fails the load, never SIGBUS)
    start_timeout_s: float = 120.0
    log_verbose: int = 0
    env: dict[str, str] = field(default_factory=dict)
    in_process: bool = False  # run on a thread of the server (TRIREME_INSTANCE_MODE=in_process)
    inline: bool = False  # in-process, execute() on the server's event loop (in_process_inline)
    # called with every WorkerProcess made from this spec (restarts too), e.g. to add message_handlers (BLS)
    attach: Callable[[Any], None] | None = None
    backend_dir: str = ""  # a Python-based backend's folder (DIR/<name> of --backend-directory); "" = built-in
    python: str = ""  # the interpreter of the model's execution environment (envs/); "" = the server's
