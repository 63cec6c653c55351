"""Two test runs at once on one machine (tools/test.sh runs its two pytest passes side by side) never share a
server port (tests/ports.py), and the tests that use perf_analyzer's fixed shared-memory names run one at a time
across processes (tests/conftest.py, machine_wide_shm_names)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from tests import ports
from tests.conftest import ROOT

OTHER_RUN = "from tests.ports import free_port; print(free_port(), free_port())"


def _other_process(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ports_come_from_this_process_block_and_are_bindable() -> None:
    picked = [ports.free_port() for _ in range(5)]
    if ports._block is None:
        pytest.skip("every port block is held by other test processes here (free_port falls back to bind(0))")
    assert len(set(picked)) == 5 and all(p in ports._block for p in picked), (picked, ports._block)
    assert ports._block.stop <= ports._ephemeral_low()  # no outgoing connection can take one
    with socket.socket() as s:
        s.bind(("127.0.0.1", picked[-1]))


def test_another_test_process_gets_other_ports() -> None:
    ports.free_port()  # this process holds its block from now on
    if ports._block is None:
        pytest.skip("every port block is held by other test processes here")
    theirs = [int(p) for p in _other_process(OTHER_RUN).split()]
    assert not any(p in ports._block for p in theirs), (theirs, ports._block)


def test_shm_name_lock_is_held_across_processes(machine_wide_shm_names: None) -> None:
    path = os.path.join(tempfile.gettempdir(), "trireme-test-shm-names.lock")
    code = (
        "import fcntl\n"
        f"f = open({path!r}, 'a+b')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('taken')\n"
        "except BlockingIOError:\n    print('held')\n"
    )
    assert _other_process(code).strip() == "held"
