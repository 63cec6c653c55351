"""Ragged batching through a real server and tritonclient: requests of different lengths batched by the dynamic
batcher without padding into real ONNX and TorchScript models made here, with every batch_input kind and a
scattered batch_output; the Python backend's requests one by one; Triton's load error for a bad source input."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import write_model

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
try:
    import torch
except ImportError:
    torch = None

if torch is not None:

    class RaggedTorch(torch.nn.Module):
        """OUT = 2 * INPUT over the concatenated 1-D input; ACC_OUT the accumulated counts, a row per request."""

        def forward(self, INPUT: torch.Tensor, ACC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return INPUT * 2, ACC.unsqueeze(1)


LENGTHS = (3, 4, 5)
BATCHER = "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 5000000 }"

ONNX_CONFIG = f"""
name: "ragged_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
batch_input [
  {{ kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT" }},
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ACC" data_type: TYPE_INT32 source_input: "INPUT" }},
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ZACC" data_type: TYPE_INT32
     source_input: "INPUT" }},
  {{ kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAXS" data_type: TYPE_INT32 source_input: "INPUT" }},
  {{ kind: BATCH_ITEM_SHAPE target_name: "ITEM" data_type: TYPE_INT32 source_input: "INPUT" }},
  {{ kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT" data_type: TYPE_INT32 source_input: "INPUT" }}
]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "COUNT_OUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "MAX_OUT" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "ITEM_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "FLAT_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "TOTAL_OUT" data_type: TYPE_INT64 dims: [ 1 ] }}
]
batch_output [ {{ target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{BATCHER}
"""


def write_ragged_onnx(path: Path) -> None:
    """OUT = 2 * INPUT over the concatenated 1-D input; every batch input echoed as one row per request, and
    TOTAL_OUT the length of the concatenated input (so a request sees what the model saw)."""
    from onnx import TensorProto, helper

    f32, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    ins = [
        helper.make_tensor_value_info("INPUT", f32, ["total"]),
        helper.make_tensor_value_info("COUNT", f32, ["n"]),
        helper.make_tensor_value_info("ACC", i32, ["n"]),
        helper.make_tensor_value_info("ZACC", i32, ["n1"]),
        helper.make_tensor_value_info("MAXS", i32, ["m"]),
        helper.make_tensor_value_info("ITEM", i32, ["n", 1]),
        helper.make_tensor_value_info("FLAT", i32, ["n"]),
    ]
    outs = [
        helper.make_tensor_value_info("OUT", f32, ["total"]),
        helper.make_tensor_value_info("COUNT_OUT", f32, ["n", 1]),
        helper.make_tensor_value_info("ACC_OUT", i32, ["n", 1]),
        helper.make_tensor_value_info("START_OUT", i32, ["n", 1]),
        helper.make_tensor_value_info("MAX_OUT", i64, ["n", 1]),
        helper.make_tensor_value_info("ITEM_OUT", i32, ["n", 1]),
        helper.make_tensor_value_info("FLAT_OUT", i32, ["n", 1]),
        helper.make_tensor_value_info("TOTAL_OUT", i64, ["n", 1]),
    ]
    const = helper.make_tensor
    nodes = [
        helper.make_node("Constant", [], ["two"], value=const("two", f32, [], [2.0])),
        helper.make_node("Constant", [], ["axis1"], value=const("axis1", i64, [1], [1])),
        helper.make_node("Constant", [], ["zero"], value=const("zero", i64, [1], [0])),
        helper.make_node("Constant", [], ["minus1"], value=const("minus1", i64, [1], [-1])),
        helper.make_node("Mul", ["INPUT", "two"], ["OUT"]),
        helper.make_node("Unsqueeze", ["COUNT", "axis1"], ["COUNT_OUT"]),
        helper.make_node("Unsqueeze", ["ACC", "axis1"], ["ACC_OUT"]),
        helper.make_node("Slice", ["ZACC", "zero", "minus1"], ["starts"]),
        helper.make_node("Unsqueeze", ["starts", "axis1"], ["START_OUT"]),
        # a row per request holding len(MAXS) (and len(INPUT)): zeros shaped like ACC, plus the length
        helper.make_node("Cast", ["ACC"], ["acc64"], to=i64),
        helper.make_node("Mul", ["acc64", "zero"], ["zeros"]),
        helper.make_node("Shape", ["MAXS"], ["maxlen"]),
        helper.make_node("Add", ["zeros", "maxlen"], ["maxrow"]),
        helper.make_node("Unsqueeze", ["maxrow", "axis1"], ["MAX_OUT"]),
        helper.make_node("Shape", ["INPUT"], ["total"]),
        helper.make_node("Add", ["zeros", "total"], ["totalrow"]),
        helper.make_node("Unsqueeze", ["totalrow", "axis1"], ["TOTAL_OUT"]),
        helper.make_node("Identity", ["ITEM"], ["ITEM_OUT"]),
        helper.make_node("Unsqueeze", ["FLAT", "axis1"], ["FLAT_OUT"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "ragged", ins, outs), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


TORCH_CONFIG = f"""
name: "ragged_torch"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
batch_input [ {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ACC" data_type: TYPE_INT32
                 source_input: "INPUT" }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
batch_output [ {{ target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{BATCHER}
"""

PYTHON_CONFIG = f"""
name: "ragged_python"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
batch_input [ {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ACC" data_type: TYPE_INT32
                 source_input: "INPUT" }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "SEEN" data_type: TYPE_INT32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{BATCHER}
"""

# SEEN = [requests in this execute() call, whether the request carries the batch input ACC]
PYTHON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            has_acc = pb_utils.get_input_tensor_by_name(r, "ACC") is not None
            seen = np.array([[len(requests), int(has_acc)]], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("SEEN", seen)]))
        return out
"""

TF_CONFIG = TORCH_CONFIG.replace('name: "ragged_torch"', 'name: "ragged_tf"').replace(
    'platform: "pytorch_libtorch"', 'platform: "tensorflow_graphdef"'
)

# a frozen GraphDef: placeholders INPUT (FP32 [-1]) and ACC (INT32 [-1]); OUT = 2 * INPUT, ACC_OUT = ACC as rows
TF_GRAPH = """
import sys
import tensorflow as tf
graph = tf.Graph()
with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None], name="INPUT")
    acc = tf.compat.v1.placeholder(tf.int32, [None], name="ACC")
    tf.identity(x * 2.0, name="OUT")
    tf.expand_dims(acc, 1, name="ACC_OUT")
open(sys.argv[1], "wb").write(graph.as_graph_def().SerializeToString())
"""

BAD_CONFIG = """
name: "bad_source"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 source_input: "NOPE" } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ragged_repo")
    write_model(repo, "ragged_onnx", ONNX_CONFIG)
    write_ragged_onnx(repo / "ragged_onnx" / "1" / "model.onnx")
    write_model(repo, "ragged_python", PYTHON_CONFIG, PYTHON_MODEL)
    write_model(repo, "bad_source", BAD_CONFIG, PYTHON_MODEL)
    if torch is not None:
        write_model(repo, "ragged_torch", TORCH_CONFIG)
        with warnings.catch_warnings():  # torch >= 2.9 deprecates TorchScript, the format this platform loads
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.script(RaggedTorch()).save(str(repo / "ragged_torch" / "1" / "model.pt"))
    if importlib.util.find_spec("tensorflow") is not None:
        write_model(repo, "ragged_tf", TF_CONFIG)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        target = repo / "ragged_tf" / "1" / "model.graphdef"
        subprocess.run([sys.executable, "-c", TF_GRAPH, str(target)], check=True, env=env, timeout=300)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.conftest import running_server

    models = ["ragged_onnx", "ragged_python"]
    models += [m for m in ("ragged_torch", "ragged_tf") if (repo / m / "1").exists()]
    args = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]
    with running_server([repo], tmp_path_factory.mktemp("ragged_srv") / "server.log", args) as s:
        yield s


def send_together(url: str, model: str) -> list[tuple[np.ndarray, Any]]:
    """One request per length in LENGTHS, sent at once (the batcher waits for all three); (input, result)."""

    def one(n: int) -> tuple[np.ndarray, Any]:
        c = grpcclient.InferenceServerClient(url)
        try:
            x = (np.arange(n, dtype=np.float32) + 10 * n).reshape(1, n)
            inp = grpcclient.InferInput("INPUT", [1, n], "FP32")
            inp.set_data_from_numpy(x)
            return x, c.infer(model, [inp], client_timeout=60)
        finally:
            c.close()

    with ThreadPoolExecutor(len(LENGTHS)) as pool:
        return list(pool.map(one, LENGTHS))


def executions(url: str, model: str) -> int:
    c = grpcclient.InferenceServerClient(url)
    try:
        return int(c.get_inference_statistics(model).model_stats[0].execution_count)
    finally:
        c.close()


def test_onnx_gets_the_concatenated_input_and_every_batch_input(server: Any) -> None:
    results = send_together(server.url, "ragged_onnx")
    assert executions(server.url, "ragged_onnx") == 1  # one batch of three differently sized requests
    spans = []
    for x, r in results:
        n = x.shape[1]
        out = r.as_numpy("OUT")
        assert out.shape == (1, n)  # scattered back with the request's own input shape
        np.testing.assert_array_equal(out, x * 2)
        assert r.as_numpy("COUNT_OUT").tolist() == [[float(n)]]  # BATCH_ELEMENT_COUNT (FP32)
        start, end = int(r.as_numpy("START_OUT")[0, 0]), int(r.as_numpy("ACC_OUT")[0, 0])
        assert end - start == n  # WITH_ZERO[i] and ACCUMULATED[i] bound this request's slice
        spans.append((start, end))
        assert r.as_numpy("MAX_OUT").tolist() == [[max(LENGTHS)]]  # shape [max element count in the batch]
        assert r.as_numpy("TOTAL_OUT").tolist() == [[sum(LENGTHS)]]  # one 1-D tensor of 3 + 4 + 5, no padding
        assert r.as_numpy("ITEM_OUT").tolist() == [[n]]  # BATCH_ITEM_SHAPE: [n] for its one batch item
        assert r.as_numpy("FLAT_OUT").tolist() == [[n]]
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == sum(LENGTHS)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # consecutive, in batch order


@pytest.mark.parametrize("model", ["ragged_torch", "ragged_tf"])
def test_torchscript_and_tensorflow_get_the_concatenated_input(server: Any, repo: Path, model: str) -> None:
    if not (repo / model / "1").exists():
        pytest.skip(f"{'torch' if model == 'ragged_torch' else 'tensorflow'} is not installed")
    results = send_together(server.url, model)
    assert executions(server.url, model) == 1
    ends = {}
    for x, r in results:
        np.testing.assert_array_equal(r.as_numpy("OUT"), x * 2)
        assert r.as_numpy("OUT").shape == x.shape
        ends[x.shape[1]] = int(r.as_numpy("ACC_OUT")[0, 0])
    # each request's slice of the concatenated input starts where another's ends (or at 0); the last ends at 12
    assert all(end - n in (0, *ends.values()) for n, end in ends.items())
    assert max(ends.values()) == sum(LENGTHS)


def test_python_backend_gets_the_requests_one_by_one_without_batch_inputs(server: Any) -> None:
    results = send_together(server.url, "ragged_python")
    assert executions(server.url, "ragged_python") == 1  # batched into one execute() call ...
    for x, r in results:
        np.testing.assert_array_equal(r.as_numpy("OUT"), x * 2)  # ... each request with its own input
        assert r.as_numpy("SEEN").tolist() == [[len(LENGTHS), 0]]  # three requests, no batch input


def test_unknown_source_input_fails_the_load_with_tritons_message(server: Any) -> None:
    c = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.load_model("bad_source")
        assert "unknown source input name 'NOPE' for bad_source" in e.value.message()
        assert c.is_server_live() and c.is_model_ready("ragged_onnx")
    finally:
        c.close()
