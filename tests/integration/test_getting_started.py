"""docs/getting-started.md, executed: every fenced block in order, so the guide cannot rot.

A block's info string says what to do with it (words after the language):
  file=PATH       write the block to PATH (relative to the working folder)
  run             run the block with bash; it must exit 0
  server          stop the previous server, start this command in the background, wait until it serves
  output          the exact stdout of the previous `run` block
  setup           installation steps: not run (the test environment is already installed)
  may-be-unstable perf_analyzer's "Failed to obtain stable measurement" (exit 2, a busy machine) is accepted
  needs=a,b       only when torch / perf_analyzer / matplotlib are available; otherwise the block is skipped
                  and the test reports the skip at the end
The guide's ports 8001 (gRPC) and 8000 (HTTP) are replaced by free ports, and server commands get a free
`--metrics-port` as well (accepted by every version of the server), so nothing assumes 8000-8002 are free.
`.venv` in the working folder links to this interpreter's environment, and PYTHONPATH points at this checkout
so its code is what runs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from load.tools import tool
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "getting-started.md"
GUIDE_PORTS = ("8001", "8000")
PERF_ANALYZER = tool("perf_analyzer")
FENCE = re.compile(r"^```(\S*)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)

pytestmark = [pytest.mark.single_pass, pytest.mark.slow]


@dataclass
class Block:
    """One fenced code block of the guide and its tags."""

    lang: str
    tags: dict[str, str]
    body: str
    line: int


def parse_guide(text: str) -> list[Block]:
    """Every fenced block with its info-string tags (`run`, `file=PATH`, `needs=a,b`, ...)."""
    blocks = []
    for m in FENCE.finditer(text):
        tags = {}
        for word in m.group(2).split():
            key, _, value = word.partition("=")
            tags[key] = value
        blocks.append(Block(m.group(1), tags, m.group(3), text.count("\n", 0, m.start()) + 1))
    return blocks


def available(need: str) -> bool:
    """Whether an optional tool of a `needs=` tag is here."""
    if need == "perf_analyzer":
        return PERF_ANALYZER.exists()
    if need in ("torch", "matplotlib"):
        return importlib.util.find_spec(need) is not None
    if need == "curl":
        return shutil.which("curl") is not None
    raise AssertionError(f"unknown needs= tag '{need}'")


class GuideServer:
    """A `server` block running in the background, in its own process group."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, services: list[str], timeout_s: float = 120.0) -> None:
        """Wait until the log says every service in `services` started."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{text}")
            if all(f"Started {name}" in text for name in services):
                return
            time.sleep(0.1)
        raise AssertionError(f"server not ready in {timeout_s} s:\n{self.log_path.read_text(errors='replace')}")

    def stop(self) -> None:
        """Ctrl-C as a reader would press it; the server stops its workers and exits."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def test_guide_blocks_are_tagged() -> None:
    blocks = parse_guide(GUIDE.read_text())
    known = {"file", "run", "server", "output", "setup", "needs", "may-be-unstable"}
    for b in blocks:
        assert set(b.tags) <= known, f"line {b.line}: unknown tags {set(b.tags) - known}"
    assert sum("run" in b.tags for b in blocks) >= 5
    setup = "\n".join(b.body for b in blocks if "setup" in b.tags)
    for path in re.findall(r"\b(tools/[\w.-]+)", setup):
        assert (ROOT / path).exists(), f"the guide's setup uses {path}, which this repository lacks"


def test_getting_started_guide_runs(tmp_path: Path) -> None:
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "trireme").exists():
        pytest.skip(f"{venv} has no trireme script (run inside the project's venv: pip install -e .)")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(venv)
    ports = {guide: str(free_port()) for guide in GUIDE_PORTS}
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    skipped: list[str] = []
    server: GuideServer | None = None
    last_stdout: str | None = None
    try:
        for i, block in enumerate(parse_guide(GUIDE.read_text())):
            if "setup" in block.tags or not ({"file", "run", "server", "output"} & set(block.tags)):
                continue
            missing = [n for n in block.tags.get("needs", "").split(",") if n and not available(n)]
            if missing:
                skipped.append(f"line {block.line} ({', '.join(missing)} missing)")
                last_stdout = None
                continue
            body = block.body
            for guide_port, port in ports.items():
                body = body.replace(guide_port, port)
            where = f"docs/getting-started.md line {block.line}"
            if "file" in block.tags:
                path = work / block.tags["file"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body)
            elif "server" in block.tags:
                if server is not None:
                    server.stop()
                command = f"{body.strip()} --metrics-port={free_port()}"
                server = GuideServer(command, work, env, tmp_path / f"server{i}.log")
                server.wait_ready(["GRPCInferenceService", *(["HTTPService"] if "--http-port" in body else [])])
            elif "run" in block.tags:
                proc = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", body], cwd=work, env=env, capture_output=True, text=True,
                    timeout=240,
                )  # fmt: skip
                unstable = proc.returncode == 2 and "Failed to obtain stable measurement" in proc.stdout + proc.stderr
                if unstable and "may-be-unstable" in block.tags:
                    proc.returncode = 0  # it connected, sent and measured; the machine is too noisy to settle
                assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
                last_stdout = proc.stdout
            elif "output" in block.tags:
                if last_stdout is None:  # its command was skipped
                    continue
                assert last_stdout.strip() == block.body.strip(), f"{where}: the command printed\n{last_stdout}"
                last_stdout = None
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work / "models", ignore_errors=True)
    if skipped:
        pytest.skip("ran the guide except blocks at " + "; ".join(skipped))
