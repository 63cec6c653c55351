"""Model sources the integration tests share: Python-backend models that map one input to one output
(identity, x + 1, 2x + 1, ...) and the config.pbtxt text of a Python model, so that a test states what its
model does in one line instead of embedding the whole model.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

Tensor = tuple[str, str, Sequence[int]]  # (name, config data type such as "TYPE_FP32", dims)


def elementwise_py(expr: str = "x", inp: str = "INPUT0", out: str = "OUTPUT0", setup: str = "") -> str:
    """model.py answering each request with `out` = expr, where x is input `inp` as a numpy array (`x` itself
    for identity: the response carries the input array, no copy). `setup` runs in execute before the loop."""
    setup_line = f"        {setup}\n" if setup else ""
    return f"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
{setup_line}        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "{inp}").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("{out}", {expr})]))
        return responses
"""


IDENTITY_PY = elementwise_py()


def _tensors(kind: str, tensors: Sequence[Tensor], extra: str = "") -> str:
    entries = ", ".join(
        f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ]{extra} }}'
        for name, dtype, dims in tensors
    )
    return f"{kind} [ {entries} ]"


def python_config(
    name: str,
    inputs: Sequence[Tensor] = (("INPUT0", "TYPE_FP32", (-1,)),),
    outputs: Sequence[Tensor] = (("OUTPUT0", "TYPE_FP32", (-1,)),),
    max_batch_size: int = 0,
    extra: str = "",
    output_extra: str = "",
) -> str:
    """config.pbtxt of a Python-backend model; `extra` is appended as is (instance_group, batching, ...),
    `output_extra` goes inside every output entry (e.g. label_filename)."""
    return (
        "\n".join(
            [
                f'name: "{name}"',
                'backend: "python"',
                f"max_batch_size: {max_batch_size}",
                _tensors("input", inputs),
                _tensors("output", outputs, output_extra),
                extra,
            ]
        ).rstrip()
        + "\n"
    )


def write_python_model(repo: Path, name: str, model_py: str = IDENTITY_PY, **config: object) -> Path:
    """A Python model <repo>/<name> with python_config(name, **config); returns the model dir."""
    from tests.conftest import write_model  # pytest's conftest; this module is also used by tests/bench scripts

    return write_model(repo, name, python_config(name, **config), model_py)  # type: ignore[arg-type]
