"""OpenVINO through a real server and tritonclient: the `openvino` backend on an IR (model.xml + model.bin
converted here with openvino.convert_model from a small ONNX graph) and on the ONNX file itself, config
auto-complete, and the onnxruntime backend's `openvino` CPU execution accelerator (OpenVINO's library really
loaded in that worker). Answers are compared with numpy's; bad configs fail only their own load."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ov = pytest.importorskip("openvino", reason="the openvino extra (openvino) is not installed")
onnx = pytest.importorskip("onnx", reason="onnx is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

import tritonclient.grpc as grpcclient  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from service.worker.backends.base import BackendError  # noqa: E402
from service.worker.backends.onnxruntime import openvino_route  # noqa: E402
from tests.conftest import running_server  # noqa: E402

pytestmark = pytest.mark.single_pass

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)

IO = """\
input [ {{ name: "x" data_type: {dtype} dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
"""


FIXED = 'parameters { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value: { string_value: "YES" } }\n'
PAD = 'parameters { key: "ENABLE_BATCH_PADDING" value: { string_value: "YES" } }\n'


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


def write_onnx(path: Path) -> None:
    """y = relu(x @ W + B) on FP32 [batch, 4] -> [batch, 3]."""
    path.parent.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def write_ir(version: Path, tmp: Path) -> None:
    """model.xml + model.bin converted by OpenVINO from the ONNX graph (full precision)."""
    write_onnx(tmp / "src.onnx")
    version.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.convert_model(str(tmp / "src.onnx")), str(version / "model.xml"), compress_to_fp16=False)


def config(body: str, dtype: str = "TYPE_FP32", io: bool = True) -> str:
    return (
        body
        + "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n"
        + (IO.format(dtype=dtype) if io else "")
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("ov")
    repo = tmp / "repo"
    models = {
        "ov_ir": config('backend: "openvino"\n'),
        "ov_onnx": config('backend: "openvino"\ndefault_model_filename: "model.onnx"\n'),
        "ov_auto": 'backend: "openvino"\n',
        "ort_openvino": config(
            'platform: "onnxruntime_onnx"\noptimization { execution_accelerators { cpu_execution_accelerator : '
            '[ { name : "openvino" } ] } }\n'
        ),
        "ort_plain": config('platform: "onnxruntime_onnx"\n'),
        "ov_bad_name": config('backend: "openvino"\n').replace('name: "x"', 'name: "INPUT0"'),
        "ov_bad_dtype": config('backend: "openvino"\n', dtype="TYPE_INT32"),
        "ov_missing": config('backend: "openvino"\n'),
        "ov_fixed_pad": config('backend: "openvino"\n' + FIXED + PAD),
        "ov_fixed": config('backend: "openvino"\n' + FIXED),
    }
    for name, text in models.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
        version = repo / name / "1"
        if name.startswith("ort_") or name == "ov_onnx":
            write_onnx(version / "model.onnx")
        elif name != "ov_missing":
            write_ir(version, tmp)
        else:
            version.mkdir()
    with running_server([repo], tmp / "server.log", ["--exit-on-error=false"]) as srv:
        yield srv


def _infer(client: grpcclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out: np.ndarray = client.infer(model, [inp]).as_numpy("y")
    return out


def test_openvino_models_answer_like_numpy(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    for model in ("ov_ir", "ov_onnx", "ov_auto", "ort_openvino", "ort_plain"):
        np.testing.assert_allclose(_infer(client, model, x), expected(x), rtol=1e-5, atol=1e-5, err_msg=model)
    auto = client.get_model_config("ov_auto", as_json=True)["config"]
    assert int(auto["max_batch_size"]) == 4 and "dynamic_batching" in auto
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in auto["input"]] == [
        ("x", "TYPE_FP32", [4])
    ]
    client.close()


def test_openvino_dynamic_batching(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal((int(rng.integers(1, 3)), 4)).astype(np.float32) for _ in range(24)]
    before = client.get_inference_statistics("ov_ir").model_stats[0].execution_count
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda r: _infer(client, "ov_ir", r), rows))
    for r, got in zip(rows, answers, strict=True):
        np.testing.assert_allclose(got, expected(r), rtol=1e-5, atol=1e-5)
    executions = client.get_inference_statistics("ov_ir").model_stats[0].execution_count - before
    assert executions < len(rows)
    client.close()


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_onnx_openvino_accelerator_loads_openvino_in_its_worker(server: Any) -> None:
    """Exactly the workers of models that use OpenVINO map its library: the plain ONNX model's worker does not."""
    client = grpcclient.InferenceServerClient(server.url)
    x = np.ones((1, 4), np.float32)
    _infer(client, "ort_openvino", x)
    _infer(client, "ort_plain", x)
    workers = server.worker_pids()
    with_openvino = [pid for pid in workers if "libopenvino" in _maps(pid)]
    # one worker per loaded model (the bad ones' workers exited): ov_ir, ov_onnx, ov_auto, ov_fixed,
    # ov_fixed_pad and ort_openvino map OpenVINO; ort_plain's worker does not
    assert len(workers) == 7 and len(with_openvino) == 6, (workers, with_openvino)
    client.close()


def test_openvino_bad_models_fail_their_own_load(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m for m in client.get_model_repository_index().models}
    for name, fragment in {"ov_bad_name": "'INPUT0'", "ov_bad_dtype": "TYPE_INT32", "ov_missing": "model.xml"}.items():
        assert index[name].state == "UNAVAILABLE", name
        assert f"'{name}'" in index[name].reason and fragment in index[name].reason, index[name].reason
    client.close()


def test_openvino_accelerator_without_openvino_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OpenVINO EP, no plugin, no openvino package: the load error says what to install."""
    import onnxruntime

    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.setitem(sys.modules, "onnxruntime_ep_openvino", None)
    with pytest.raises(BackendError, match=r"pip install 'trireme\[openvino\]'"):
        openvino_route(onnxruntime, onnxruntime.SessionOptions(), ["CPUExecutionProvider"])
    assert openvino_route(onnxruntime, None, ["OpenVINOExecutionProvider", "CPUExecutionProvider"]) == "provider"


def test_openvino_fixed_batch_pads_or_says_why(server: Any) -> None:
    """SKIP_OV_DYNAMIC_BATCHSIZE compiles for max_batch_size rows: with ENABLE_BATCH_PADDING 3 rows are padded
    and answered; without it the request fails with a message naming the parameter."""
    client = grpcclient.InferenceServerClient(server.url)
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(_infer(client, "ov_fixed_pad", x), expected(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="ENABLE_BATCH_PADDING"):
        _infer(client, "ov_fixed", x)
    full = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_allclose(_infer(client, "ov_fixed", full), expected(full), rtol=1e-5, atol=1e-5)
    client.close()
