"""What the worker installs for the running model: its directory and the BLS client (`pb_utils.runtime`)."""

from __future__ import annotations

from typing import Any


class _Runtime:
    """Hooks the worker installs: the model dir and the BLS client (None until the worker sets them)."""

    model_dir: str = ""
    bls: Any = None
    # log(level, message, file, line): hands a pb_utils.Logger line to the server (a worker process sets it);
    # None: the line is logged in this process (in-process instances, tools that import pb_utils)
    log: Any = None


runtime = _Runtime()


def get_model_dir() -> str:
    """Directory of the running model.py (<model_dir>/<version>)."""
    return runtime.model_dir
