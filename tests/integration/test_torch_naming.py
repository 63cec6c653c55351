"""TorchBackend in-process with real TorchScript files: Triton's input/output naming rules, batching, errors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from service.core.repository import model_config as cfg  # noqa: E402
from service.errors import ErrorCode  # noqa: E402
from service.worker.backends.base import BackendContext, BackendError, WorkerRequest  # noqa: E402
from service.worker.backends.pytorch import TorchBackend  # noqa: E402

pytestmark = pytest.mark.single_pass


class Sub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x - y


class SubRows(torch.nn.Module):
    """(x - y, rows of this call as int64[rows, 1])."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.full((x.shape[0], 1), x.shape[0], dtype=torch.int64)
        return x - y, rows


class DictIn(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"] - inputs["y"]


def save(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(module).save(str(path))


def backend(tmp_path: Path, module: torch.nn.Module, config_text: str) -> TorchBackend:
    model_dir = tmp_path / "m"
    save(module, model_dir / "1" / "model.pt")
    config = cfg.parse_config_text('name: "m"\nplatform: "pytorch_libtorch"\n' + config_text, "config.pbtxt")
    cfg.fill_backend(config, str(model_dir), [1])
    cfg.normalize(config, "m")
    as_json = cfg.to_json_dict(config)
    context = BackendContext(
        "m", "1", str(model_dir), str(model_dir / "1"), as_json, json.dumps(as_json), "m_0", "CPU", 0
    )
    b = TorchBackend(context)
    b.initialize()
    return b


def run(b: TorchBackend, *feeds: dict[str, np.ndarray]) -> list[Any]:
    answers: dict[int, Any] = {}

    def responder(req: WorkerRequest, outputs: Any, error: Any, final: bool, params: Any) -> None:
        answers[req.rid] = error if error is not None else outputs
        req.closed = final

    b.execute([WorkerRequest(i, "", feed, [], {}, 0, 0, 0, responder) for i, feed in enumerate(feeds)])
    return [answers[i] for i in range(len(feeds))]


def tensors(*specs: tuple[str, str]) -> str:
    return ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ 2 ] }}' for n, t in specs)


X = np.array([[5.0, 7.0]], np.float32)
Y = np.array([[1.0, 2.0]], np.float32)


@pytest.mark.parametrize(
    ("config_order", "x_name", "y_name", "module"),
    [
        (["y", "x"], "x", "y", Sub()),  # forward() argument names, listed in another order: mapped by name
        (["IN__1", "IN__0"], "IN__0", "IN__1", Sub()),  # <name>__<index>: mapped by index
        (["second", "first"], "second", "first", Sub()),  # neither: configuration order
        (["y", "x"], "x", "y", DictIn()),  # a single Dict[str, Tensor] argument: the dict keys
    ],
)
def test_input_naming_rules(
    tmp_path: Path, config_order: list[str], x_name: str, y_name: str, module: torch.nn.Module
) -> None:
    b = backend(
        tmp_path,
        module,
        "max_batch_size: 4\n"
        f"input [ {tensors(*((n, 'TYPE_FP32') for n in config_order))} ]\n"
        f"output [ {tensors(('OUTPUT__0', 'TYPE_FP32'))} ]\n",
    )
    (out,) = run(b, {x_name: X, y_name: Y})
    np.testing.assert_array_equal(out["OUTPUT__0"], X - Y)


def test_batch_is_one_forward_call_and_rows_go_back(tmp_path: Path) -> None:
    b = backend(
        tmp_path,
        SubRows(),
        "max_batch_size: 16\n"
        f"input [ {tensors(('x', 'TYPE_FP32'), ('y', 'TYPE_FP32'))} ]\n"
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] }, '
        '{ name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 1 ] } ]\n',
    )
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.random((n, 2), np.float32), "y": rng.random((n, 2), np.float32)} for n in (1, 3, 2)]
    answers = run(b, *feeds)
    for feed, out in zip(feeds, answers, strict=True):
        np.testing.assert_allclose(out["OUTPUT__0"], feed["x"] - feed["y"], rtol=1e-6)
        np.testing.assert_array_equal(out["OUTPUT__1"], np.full((feed["x"].shape[0], 1), 6))  # 1+3+2 rows, one call


def test_output_datatype_mismatch_names_both_types(tmp_path: Path) -> None:
    b = backend(
        tmp_path,
        Sub(),
        f"max_batch_size: 4\ninput [ {tensors(('x', 'TYPE_FP32'), ('y', 'TYPE_FP32'))} ]\n"
        f"output [ {tensors(('OUTPUT__0', 'TYPE_INT32'))} ]\n",
    )
    (answer,) = run(b, {"x": X, "y": Y})
    code, message = answer
    assert code == int(ErrorCode.INTERNAL)
    assert (
        message
        == "configuration expects datatype TYPE_INT32 for output 'OUTPUT__0' of model 'm', model provides TYPE_FP32"
    )


def test_too_many_config_inputs_fail_the_load(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"configuration expects 3 inputs, model's forward\(\) takes 2 \(x, y\)"):
        backend(
            tmp_path,
            Sub(),
            f"max_batch_size: 4\ninput [ {tensors(('x', 'TYPE_FP32'), ('y', 'TYPE_FP32'), ('z', 'TYPE_FP32'))} ]\n"
            f"output [ {tensors(('OUTPUT__0', 'TYPE_FP32'))} ]\n",
        )
