"""The model folder of a bound function: config.pbtxt, a model.py that imports the bound-function model, the
function (pickled, or an in-process token) and what the worker checks answers against."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from trireme.bind.spec import NAME_RE, ModelConfig, Tensor, config_text, named
from trireme.bind.worker import LOCAL, PICKLE_FILE, SPEC_FILE

MODEL_PY = "from trireme.bind.worker import TritonPythonModel  # noqa: F401  (a function bound with trireme)\n"


def check_declaration(
    model_name: str, functions: Sequence[Callable[..., Any]], inputs: Sequence[Tensor], outputs: Sequence[Tensor]
) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs with default names; ValueError/TypeError saying what is wrong."""
    if not isinstance(model_name, str) or not NAME_RE.match(model_name):
        raise ValueError(
            f"model name {model_name!r} is not valid: use letters, digits, dots, underscores and dashes only"
        )
    if not functions or not all(callable(f) for f in functions):
        raise TypeError(f"infer_func of model '{model_name}' must be a callable (or a list of callables)")
    if not outputs:
        raise ValueError(f"model '{model_name}' must declare at least one output")
    for t in [*inputs, *outputs]:
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs and outputs must be trireme.Tensor declarations, not {type(t).__name__}")
        t.datatype()
    return named(inputs, "INPUT"), named(outputs, "OUTPUT")


def write_model(
    root: str,
    model_name: str,
    version: int,
    functions: list[Callable[..., Any]],
    inputs: list[Tensor],
    outputs: list[Tensor],
    config: ModelConfig,
    strict: bool,
    in_process: bool,
) -> tuple[str, str]:
    """Write <root>/<model_name>/ and return (its folder, the in-process token or "")."""
    folder = os.path.join(root, model_name)
    version_dir = os.path.join(folder, str(version))
    spec: dict[str, Any] = {
        "outputs": [{"name": t.name, "datatype": t.datatype(), "dims": [int(d) for d in t.shape]} for t in outputs],
        "batched": config.batching and config.max_batch_size > 0,
        "decoupled": config.decoupled,
        "strict": strict,
    }
    payload = b""
    token = ""
    if in_process:
        token = f"{model_name}-{uuid.uuid4().hex}"
        spec["local"] = token
    else:
        try:
            payload = cloudpickle.dumps(functions)
        except Exception as e:
            raise TypeError(
                f"cannot send infer_func of model '{model_name}' to worker processes: it cannot be pickled "
                f"({type(e).__name__}: {e}); define it in an importable module, or bind it with in_process=True"
            ) from None
        spec["sys_path"] = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    instances = max(len(functions), config.instance_count)
    parameters = {"TRIREME_INSTANCE_MODE": "in_process"} if in_process else {}
    os.makedirs(version_dir)
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write(config_text(model_name, inputs, outputs, config, instances, parameters))
    with open(os.path.join(version_dir, "model.py"), "w") as f:
        f.write(MODEL_PY)
    with open(os.path.join(version_dir, SPEC_FILE), "w") as f:
        json.dump(spec, f)
    if payload:
        with open(os.path.join(version_dir, PICKLE_FILE), "wb") as f:
            f.write(payload)
    if token:
        LOCAL[token] = list(functions)
    return folder, token
