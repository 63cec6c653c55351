"""The interpreter of an environment, whether it can run the worker, and what the worker needs beside it.

The worker runs the environment's interpreter with the checkout and a small folder of the worker's own
plumbing (msgspec, posix_ipc, mypy_extensions: links to the server's copies) on PYTHONPATH; numpy comes from the
environment (Triton requires it there too). Those compiled modules are built for the server's Python, hence the
rule: the environment's Python must be the server's major.minor, and its numpy the server's major version.
Anything else is refused at load time with a message (Triton loads such a model and then answers with empty outputs).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy

from service.instances.envs.cache import cache_root
from service.instances.envs.unpack import EnvError

WORKER_DEPS = ("msgspec", "posix_ipc", "mypy_extensions")  # third-party modules the worker imports besides numpy

_PROBE = (
    "import json, sys\n"
    "out = {'python': '%d.%d.%d' % sys.version_info[:3]}\n"
    "try:\n"
    "    import numpy\n"
    "    out['numpy'] = numpy.__version__\n"
    "except Exception as e:\n"
    "    out['numpy_error'] = repr(e)\n"
    "print(json.dumps(out))\n"
)


def interpreter(env_dir: str) -> str:
    """bin/python3 (or bin/python) of an environment; Triton's error when it has no activate script."""
    activate = os.path.join(env_dir, "bin", "activate")
    if not os.path.exists(activate):
        raise EnvError(f"Path {activate} does not exist. The Python environment should contain an 'activate' script.")
    for name in ("python3", "python"):
        path = os.path.join(env_dir, "bin", name)
        if os.path.exists(path):
            return path
    raise EnvError(f"The Python environment {env_dir} has no bin/python3 or bin/python interpreter")


def clean_env(env_dir: str) -> dict[str, str]:
    """What `source bin/activate` would set (and nothing of the server's own Python setup)."""
    dropped = ("PYTHONHOME", "PYTHONPATH", "CONDA_PREFIX", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PATH"] = os.path.join(env_dir, "bin") + os.pathsep + env.get("PATH", "")
    env["LD_LIBRARY_PATH"] = os.path.join(env_dir, "lib") + (
        os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    env["VIRTUAL_ENV" if os.path.exists(os.path.join(env_dir, "pyvenv.cfg")) else "CONDA_PREFIX"] = env_dir
    env["PYTHONNOUSERSITE"] = "1"
    return env


def probe(python: str, env_dir: str) -> dict[str, str]:
    """The environment's Python and numpy versions (numpy_error when numpy does not import)."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], env=clean_env(env_dir), capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvError(f"The interpreter {python} of the Python environment does not run: {e}") from None
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise EnvError(
            f"The interpreter {python} of the Python environment failed: {done.stderr.strip()[-500:]}"
        ) from None


def compatibility_error(found: dict[str, str], where: str) -> str:
    """Empty when the worker can run with these versions, else why not (the message of the refused load)."""
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    theirs = ".".join(found.get("python", "?").split(".")[:2])
    if theirs != ours:
        return (
            f"the Python environment {where} has Python {found.get('python')}, but the server runs Python "
            f"{sys.version.split()[0]}: the environment's Python must be {ours}.x"
        )
    if "numpy" not in found:
        return (
            f"the Python environment {where} has no usable numpy ({found.get('numpy_error', 'not installed')}); "
            f"the Python backend needs numpy in it ({numpy.__version__.split('.')[0]}.x, the server has "
            f"{numpy.__version__})"
        )
    if found["numpy"].split(".")[0] != numpy.__version__.split(".")[0]:
        return (
            f"the Python environment {where} has numpy {found['numpy']}, but the server has numpy "
            f"{numpy.__version__}: the environment's numpy must be {numpy.__version__.split('.')[0]}.x"
        )
    return ""


def worker_deps() -> str:
    """A cache folder with links to the server's copies of the worker's compiled modules (made once)."""
    paths = []
    for name in WORKER_DEPS:
        module = importlib.import_module(name)
        file = module.__file__ or ""
        paths.append(os.path.dirname(file) if os.path.basename(file) == "__init__.py" else file)
    key = hashlib.sha256("\n".join([sys.version, *paths]).encode()).hexdigest()[:24]
    folder = os.path.join(cache_root(), "worker-deps", key)
    if os.path.isdir(folder):
        return folder
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{key}-", dir=os.path.dirname(folder))
    for path in paths:
        os.symlink(path, os.path.join(tmp, os.path.basename(path)))
    try:
        os.rename(tmp, folder)
    except OSError:  # another thread or server made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
