"""The one entry point: the environment a model version's workers run in, ready to use (or a load error)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.errors import ErrorCode, ServiceError
from service.instances.envs.probe import clean_env, compatibility_error, interpreter, probe, worker_deps
from service.instances.envs.request import EnvRequest, env_request
from service.instances.envs.unpack import EnvError, unpacked
from service.instances.envs.uvbuild import built
from service.instances.spec import InstanceSpec

log = logging.getLogger("trireme.envs")


@dataclass(frozen=True, slots=True)
class ExecEnv:
    """The interpreter a worker runs and the environment entries it gets (PATH, PYTHONPATH, VIRTUAL_ENV, ...)."""

    python: str
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""  # what the config named (for messages)


_ready: dict[tuple[EnvRequest, int, int], ExecEnv] = {}  # (request, mtime_ns, size) -> checked environment
_ready_lock = threading.Lock()


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


def prepare_env(parameters: Mapping[str, Any], model_dir: str, version_dir: str) -> ExecEnv | None:
    """The environment the config asks for (None: the server's own), unpacked or built and checked.

    Blocking (an unpack or a build may take minutes the first time): run it off the event loop. ServiceError
    with the reason when the environment cannot run the model's worker.
    """
    request = env_request(parameters, model_dir, version_dir)
    if request is None:
        return None
    try:
        path = os.path.realpath(request.path, strict=True)
        stamp = _stamp(path)
    except OSError:
        what = (
            "Failed to get the canonical path for" if request.kind == "path" else "Failed to find the requirements file"
        )
        raise ServiceError(ErrorCode.INTERNAL, f"{what} {request.path}.") from None
    with _ready_lock:
        known = _ready.get((request, *stamp))
    if known is not None:
        return known
    try:
        if request.kind == "requirements":
            log.info("preparing the Python environment of %s (uv)", path)
            env_dir = built(path)
        elif os.path.isdir(path):
            env_dir = path  # an unpacked environment is used where it is, as Triton does
        else:
            log.info("preparing the Python execution environment %s", path)
            env_dir = unpacked(path)
        python = interpreter(env_dir)
        problem = compatibility_error(probe(python, env_dir), request.path)
    except EnvError as e:
        raise ServiceError(ErrorCode.INTERNAL, str(e)) from None
    if problem:
        raise ServiceError(ErrorCode.INVALID_ARG, problem)
    base = clean_env(env_dir)
    keys = ("PATH", "LD_LIBRARY_PATH", "PYTHONNOUSERSITE", "VIRTUAL_ENV", "CONDA_PREFIX")
    env: dict[str, str] = {k: base[k] for k in keys if k in base}
    env["PYTHONPATH"] = worker_deps()  # the checkout goes in front of it (spawn.worker_env)
    out = ExecEnv(python, env, request.path)
    with _ready_lock:
        _ready[(request, *stamp)] = out
    return out


def apply_env(specs: list[InstanceSpec], env: ExecEnv | None, model_name: str) -> list[InstanceSpec]:
    """Point each spec's worker at the environment; in-process instances cannot run in another one."""
    if env is None:
        return specs
    for spec in specs:
        if spec.in_process:
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"model '{model_name}': an in-process instance runs in the server's Python and cannot use the "
                f"execution environment {env.source}",
            )
        spec.python = env.python
        spec.env.update(env.env)
    return specs
