"""Which build runs: the mypyc-compiled hot path (service/compiled.py, tools/build_compiled.py) or pure Python.

`trireme --version` names the build; TRIREME_PURE_PYTHON=1 forces pure Python although compiled modules are
present, in the server and in every worker process it starts (checked in the processes' memory maps). Where the
compiled build is expected (TRIREME_EXPECT_COMPILED=1: tools/test.sh's compiled pass), it must really be in use.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from service.compiled import COMPILED_MODULES, module_name
from tests.conftest import ROOT, ServerProcess

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. ".cpython-311-x86_64-linux-gnu.so"
BUILT = all((ROOT / path.removesuffix(".py")).with_name(Path(path).stem + SUFFIX).exists() for path in COMPILED_MODULES)
EXPECTED = os.environ.get("TRIREME_EXPECT_COMPILED") == "1"
needs_build = pytest.mark.skipif(
    not BUILT and not EXPECTED, reason="the compiled build is not built here (python tools/build_compiled.py)"
)


def _run(code: str, **env: str) -> str:
    """stdout of `python -c code` from the checkout, with `env` added and TRIREME_PURE_PYTHON as given."""
    full = {k: v for k, v in os.environ.items() if k != "TRIREME_PURE_PYTHON"} | env
    full["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _version(**env: str) -> str:
    return _run("import sys; sys.argv = ['trireme', '--version']; from service.__main__ import main; main()", **env)


FILES = "import importlib\nfor m in {mods!r}: print(importlib.import_module(m).__file__)"


def _module_files(**env: str) -> list[str]:
    return _run(FILES.format(mods=[module_name(p) for p in COMPILED_MODULES]), **env).split()


def test_forced_pure_python_runs_the_sources() -> None:
    """With TRIREME_PURE_PYTHON=1 every listed module comes from its .py, and --version says so."""
    assert _version(TRIREME_PURE_PYTHON="1").splitlines()[1] == "build: pure Python (forced by TRIREME_PURE_PYTHON)"
    files = _module_files(TRIREME_PURE_PYTHON="1")
    assert len(files) == len(COMPILED_MODULES) and all(f.endswith(".py") for f in files), files


@needs_build
def test_compiled_build_is_in_use() -> None:
    """Built (and not forced pure): every listed module is an extension module, and --version says mypyc."""
    n = len(COMPILED_MODULES)
    assert _version().splitlines()[1] == f"build: compiled with mypyc ({n} of {n} hot-path modules)"
    files = _module_files()
    assert len(files) == n and all(f.endswith(SUFFIX) for f in files), files


def _mapped_compiled(pid: int) -> bool:
    """Whether process `pid` has mypyc's shared library (trireme__mypyc) mapped."""
    return "trireme__mypyc" in Path(f"/proc/{pid}/maps").read_text()


def _serve_one(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer("identity_fp32", [inp])
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)


@needs_build
@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "forced-pure"])
def test_server_and_workers_run_the_same_build(
    pure: bool, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server and its worker processes (front-end processes too) all load the compiled library, or none does."""
    if pure:
        monkeypatch.setenv("TRIREME_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("TRIREME_PURE_PYTHON", raising=False)
    server = start_server()
    _serve_one(server)
    pids = [server.proc.pid, *server.worker_pids()]
    children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split()
    pids += [int(p) for p in children if int(p) not in pids]
    assert len(pids) >= 2, "no worker process found"
    assert {pid: _mapped_compiled(pid) for pid in pids} == {pid: not pure for pid in pids}
