"""Sizes the worker arenas once at start so that all of them fit in the /dev/shm this server finds.

A worker maps two arenas (requests in, responses out) of `--backend-config=python,shm-default-byte-size` bytes
each. Creating a POSIX segment larger than the tmpfs behind /dev/shm succeeds (ftruncate does not reserve), and
the first write past the tmpfs limit kills the process with SIGBUS; a container's default /dev/shm is 64 MB while
one worker's arenas are 512 MiB. So the server counts the model instances its repositories ask for, and when
their arenas do not fit in the free space, shrinks the arena size so that they take three quarters of it (with a
warning; the rest is for arena growth and client regions), or refuses to start with a message naming
`--shm-size` when not even the minimum fits. When the arenas take more than half of the free space, their pages
are reserved (posix_fallocate) as they are created, so that growing arenas, which reserve what they add, cannot
take the space the first segments were promised.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from protos import model_config_pb2 as mc
from service.core.repository import model_config as cfg
from service.core.repository.versions import numeric_versions, select_versions
from service.errors import ErrorCode, ServiceError

log = logging.getLogger("trireme.shm")

SHM_DIR = "/dev/shm"
ARENAS_PER_WORKER = 2
MIN_ARENA_BYTES = 1 << 20
MIB = 1 << 20
HEADROOM_DIVISOR = 4  # shrunk arenas leave free/4 of /dev/shm for arena growth and client regions


@dataclass(frozen=True, slots=True)
class ArenaPlan:
    """The decision: bytes per arena, and what it was based on (for the log line)."""

    arena_bytes: int
    requested_bytes: int
    workers: int
    free_bytes: int
    reserve: bool = False  # reserve the arenas' pages at creation (they take over half of /dev/shm)

    @property
    def shrunk(self) -> bool:
        """True when the configured size did not fit."""
        return self.arena_bytes < self.requested_bytes


def free_shm_bytes(path: str = SHM_DIR) -> int:
    """Bytes an unprivileged process can still allocate in the filesystem at path (the tmpfs of /dev/shm)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def model_workers(model_dir: str, config_name: str = "", gpu_count: int = 0) -> int:
    """Worker processes a model directory's config asks for: instances x devices x versions served (0: ensemble)."""
    try:
        config, _, _ = cfg.read_config(model_dir, config_name)
    except ServiceError:
        return 1  # the load will report the config error; count the one worker it would have had
    if config.platform == "ensemble":
        return 0
    cfg.normalize(config, os.path.basename(model_dir), gpu_count)
    instances = sum(
        g.count * (len(g.gpus) if g.kind == mc.ModelInstanceGroup.KIND_GPU and g.gpus else 1)
        for g in config.instance_group
    )
    versions = len(select_versions(config, numeric_versions(model_dir))) if os.path.isdir(model_dir) else 1
    return instances * max(1, versions)


def fit_arena_bytes(requested: int, workers: int, free: int) -> ArenaPlan:
    """Arena size such that `workers` workers' arenas fit in `free` bytes; ServiceError when not even 1 MiB does."""
    need = requested * ARENAS_PER_WORKER * max(1, workers)
    if need <= free:
        return ArenaPlan(requested, requested, workers, free, reserve=2 * need > free)
    usable = free - free // HEADROOM_DIVISOR
    share = usable // (ARENAS_PER_WORKER * max(1, workers)) // MIB * MIB
    if share < MIN_ARENA_BYTES:
        raise ServiceError(
            ErrorCode.UNAVAILABLE,
            f"/dev/shm has {free // MIB} MiB free, too little for the shared-memory arenas of {workers} model "
            f"instance(s) ({ARENAS_PER_WORKER} arenas of at least {MIN_ARENA_BYTES // MIB} MiB each, "
            f"{ARENAS_PER_WORKER * max(1, workers) * MIN_ARENA_BYTES // MIB} MiB in all); give the server more "
            f"shared memory: `docker run --shm-size={suggest_shm_mib(requested, workers)}m ...`, or in Kubernetes "
            "an emptyDir with medium: Memory mounted at /dev/shm (docs/deploy.md)",
        )
    return ArenaPlan(min(share, requested), requested, workers, free, reserve=True)


def suggest_shm_mib(arena_bytes: int, workers: int) -> int:
    """A /dev/shm size (MiB) in which every arena at the configured size takes at most half."""
    return 2 * ARENAS_PER_WORKER * max(1, workers) * arena_bytes // MIB


def plan_arenas(
    model_dirs: list[str], requested: int, config_name: str = "", gpu_count: int = 0, shm_dir: str = SHM_DIR
) -> ArenaPlan:
    """The arena size for this start: logs a warning when it had to shrink; raises ServiceError when too small."""
    workers = sum(model_workers(d, config_name, gpu_count) for d in model_dirs)
    try:
        free = free_shm_bytes(shm_dir)
    except OSError:
        log.warning("cannot read the free space of %s; keeping the configured arena size", shm_dir)
        return ArenaPlan(requested, requested, workers, -1)
    plan = fit_arena_bytes(requested, workers, free)
    if plan.shrunk:
        log.warning(
            "/dev/shm has %d MiB free: worker arenas shrink from %d MiB to %d MiB each (reserved) so that the "
            "arenas of %d model instance(s) fit; start the container with --shm-size=%dm (or a larger /dev/shm "
            "emptyDir) to keep %d MiB",
            free // MIB,
            requested // MIB,
            plan.arena_bytes // MIB,
            workers,
            suggest_shm_mib(requested, workers),
            requested // MIB,
        )
    elif plan.reserve:
        log.info("worker arenas take over half of the free /dev/shm (%d MiB): their pages are reserved", free // MIB)
    return plan
