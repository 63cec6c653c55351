"""One setting for where the real Triton tools live (issue 33): TRIREME_TOOLS, default a per-user cache folder,
honoured alike by tools/install-triton-tools.sh, the tests and the benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from load.tools import tool, tools_dir

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install-triton-tools.sh"


def script_dest(env: dict[str, str]) -> str:
    """The folder install-triton-tools.sh installs into under `env` (its DEST line, evaluated by bash)."""
    dest_line = next(line for line in SCRIPT.read_text().splitlines() if line.startswith("DEST="))
    out = subprocess.run(["bash", "-c", f'{dest_line}; echo "$DEST"'], env=env, capture_output=True, text=True)
    return out.stdout.strip()


def test_default_is_a_per_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRIREME_TOOLS", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tools_dir() == tmp_path / ".cache" / "trireme" / "tools"
    assert script_dest(dict(os.environ)) == str(tools_dir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tools_dir() == tmp_path / "xdg" / "trireme" / "tools"
    assert script_dest(dict(os.environ)) == str(tools_dir())


def test_trireme_tools_is_honoured_everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRIREME_TOOLS", str(tmp_path / "t"))
    assert tools_dir() == tmp_path / "t"
    assert tool("perf_analyzer") == tmp_path / "t" / "bin" / "perf_analyzer"
    assert script_dest(dict(os.environ)) == str(tmp_path / "t")
    # the tests and benchmarks resolve their binaries through load.tools at import time
    code = "from tests.bench.servers import ANCHORS; from load.servers import TRITON_BIN; print(ANCHORS, TRITON_BIN)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.stdout.split() == [str(tmp_path / "t"), str(tmp_path / "t" / "bin" / "tritonserver")], out.stderr


def test_no_fixed_shared_folder_is_left() -> None:
    """No script, test or benchmark looks in the old machine-wide folder under the temp directory."""
    hits = []
    for folder in ("tests", "load", "tools", "service", "docs"):
        for path in (ROOT / folder).rglob("*"):
            wanted = path.suffix in {".py", ".sh", ".md"} and path != Path(__file__)
            if wanted and "/tmp/trireme-anchors" in path.read_text(errors="replace"):
                hits.append(str(path.relative_to(ROOT)))
    assert hits == []
