"""Pin this worker process where its host policy says (--host-policy): its threads to CPU cores (sched_setaffinity
on every thread that exists; threads started later inherit it) and its memory to a NUMA node (set_mempolicy
MPOL_BIND on the main thread, inherited the same way). Runs before the model is loaded."""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("trireme.worker")

MPOL_BIND = 2
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}  # syscall numbers (glibc has no wrapper; libnuma is not needed)


def pin(cores: list[int], memory_node: int | None) -> None:
    """Apply a placement; OSError naming what could not be done (the instance then fails to load)."""
    if cores:
        for tid in _threads():
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:
                continue  # the thread ended meanwhile
            except OSError as e:
                raise OSError(e.errno, f"cannot pin the worker to CPU cores {cores}: {e.strerror}") from None
    if memory_node is not None:
        bind_memory(memory_node)


def bind_memory(node: int) -> None:
    """set_mempolicy(MPOL_BIND, {node}) for this thread and the threads it starts later."""
    number = SET_MEMPOLICY.get(platform.machine())
    if number is None:
        log.warning("memory not bound to NUMA node %d: set_mempolicy is unknown on %s", node, platform.machine())
        return
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot bind the worker's memory to NUMA node {node}: {os.strerror(errno)}")


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no procfs: this thread only
