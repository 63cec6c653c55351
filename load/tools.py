"""Where the real Triton tools live (perf_analyzer, tritonserver 2.51, a tritonclient venv), installed by
tools/install-triton-tools.sh. One setting for the script, the tests and the benchmarks: TRIREME_TOOLS, by default
a per-user cache folder, ${XDG_CACHE_HOME:-~/.cache}/trireme/tools."""

from __future__ import annotations

import os
from pathlib import Path


def tools_dir() -> Path:
    """$TRIREME_TOOLS, else ${XDG_CACHE_HOME:-~/.cache}/trireme/tools (the install script's default too)."""
    explicit = os.environ.get("TRIREME_TOOLS")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "trireme" / "tools"


def tool(name: str) -> Path:
    """An installed tool's launcher: tool('perf_analyzer'), tool('tritonserver')."""
    return tools_dir() / "bin" / name
