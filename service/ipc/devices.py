"""The GPUs a process may use, read without importing CUDA: the server plans KIND_AUTO instances with it and
workers check their device kind."""

from __future__ import annotations

import os


def visible_gpu_count() -> int:
    """NVIDIA GPUs this process may use (driver's device list, limited by CUDA_VISIBLE_DEVICES); no CUDA import."""
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]
        count = min(count, len(ids))
    return count
