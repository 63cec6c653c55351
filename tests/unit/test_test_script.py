"""tools/test.sh (the README's test command) says what it does: one line per step, before each step's command,
so a quiet pip install or a 700 MB download is never mistaken for a hang (issue 33)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "test.sh"
# lines that start a step's work: pip/ruff/mypy/pytest from the venv, the venv itself, the helper scripts, apt-get
COMMAND = re.compile(r'^(\.venv/bin/|"\$PY" -m venv|bash tools/|PYTHON=\.venv|\{ apt-get)')


def test_every_step_is_announced() -> None:
    lines = [line.strip() for line in SCRIPT.read_text().splitlines()]
    announced = False
    commands = []
    for line in lines:
        if line.startswith("step "):
            announced = True
        elif COMMAND.match(line):
            assert announced, f"tools/test.sh runs {line!r} without a step line before it"
            announced = False
            commands.append(line)
    kinds = " ".join(commands)
    for needed in ("pip install -q -e", "install-triton-tools.sh", "apt-get install", "gen_protos.py", "ruff check",
                   "ruff format", "mypy", "build-image.sh", "pytest"):  # fmt: skip
        assert needed in kinds, needed


def test_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
