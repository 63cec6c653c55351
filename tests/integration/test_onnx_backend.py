"""ONNX Runtime backend through a real server and tritonclient: add/sub INT32[16], with and without config.pbtxt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tritonclient.grpc as grpcclient  # noqa: E402
from onnx import TensorProto  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.conftest import add_sub_onnx_model  # noqa: E402

pytestmark = pytest.mark.single_pass

CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: {dtype} dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
instance_group [ {{ kind: KIND_CPU }} ]
"""


def write_add_sub_onnx(path: Path) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 on INT32[batch, 16], built with the onnx helpers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model = add_sub_onnx_model(TensorProto.INT32)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _infer(client: grpcclient.InferenceServerClient, model: str, a: np.ndarray, b: np.ndarray):  # type: ignore[no-untyped-def]
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer(model, inputs)


@pytest.fixture
def onnx_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_add_sub_onnx(repo / "add_sub_onnx" / "1" / "model.onnx")
    (repo / "add_sub_onnx" / "config.pbtxt").write_text(CONFIG.format(name="add_sub_onnx", dtype="TYPE_INT32"))
    write_add_sub_onnx(repo / "add_sub_auto" / "1" / "model.onnx")  # no config.pbtxt: auto-complete
    return repo


def test_onnx_add_sub_with_and_without_config(start_server, onnx_repo: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repos=[onnx_repo])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        rng = np.random.default_rng(0)
        a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
        b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
        for model in ("add_sub_onnx", "add_sub_auto"):
            result = _infer(client, model, a, b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.as_numpy("OUTPUT0").dtype == np.int32
        # the auto-completed config: tensors from the model, batching model -> max_batch_size 4 + dynamic batcher
        config = client.get_model_config("add_sub_auto", as_json=True)["config"]
        assert config["platform"] == "onnxruntime_onnx"
        assert config["backend"] == "onnxruntime"
        assert int(config["max_batch_size"]) == 4
        assert "dynamic_batching" in config
        assert {t["name"]: (t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]} == {
            "INPUT0": ("TYPE_INT32", [16]),
            "INPUT1": ("TYPE_INT32", [16]),
        }
        assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]
        meta = client.get_model_metadata("add_sub_auto")
        assert [list(t.shape) for t in meta.inputs] == [[-1, 16], [-1, 16]]
        with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
            _infer(client, "add_sub_auto", np.zeros((5, 16), np.int32), np.zeros((5, 16), np.int32))
    finally:
        client.close()


def test_onnx_config_mismatch_names_model_tensor_and_values(start_server, onnx_repo: Path) -> None:  # type: ignore[no-untyped-def]
    bad = onnx_repo / "bad_dtype"
    write_add_sub_onnx(bad / "1" / "model.onnx")
    (bad / "config.pbtxt").write_text(CONFIG.format(name="bad_dtype", dtype="TYPE_FP32"))
    bad_dims = onnx_repo / "bad_dims"
    write_add_sub_onnx(bad_dims / "1" / "model.onnx")
    (bad_dims / "config.pbtxt").write_text(
        CONFIG.format(name="bad_dims", dtype="TYPE_INT32").replace(
            '"INPUT1" data_type: TYPE_INT32 dims: [ 16 ]', '"INPUT1" data_type: TYPE_INT32 dims: [ 4 ]'
        )
    )
    server = start_server(repos=[onnx_repo], args=["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["add_sub_onnx"].state == "READY"
        assert index["bad_dtype"].state == "UNAVAILABLE"
        assert "configuration expects datatype TYPE_FP32 for input 'INPUT0', model provides TYPE_INT32" in (
            index["bad_dtype"].reason
        )
        assert "'bad_dtype'" in index["bad_dtype"].reason
        reason = index["bad_dims"].reason
        assert "model 'bad_dims', tensor 'INPUT1'" in reason
        assert "shape [-1,16]" in reason and "[-1,4]" in reason
        # the rest keeps serving
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        np.testing.assert_array_equal(_infer(client, "add_sub_onnx", a, a).as_numpy("OUTPUT0"), 2 * a)
    finally:
        client.close()
