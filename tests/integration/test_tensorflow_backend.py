"""The tensorflow backend through a real server, real TF workers and tritonclient, answers checked against TF's own.

Models come from tests/integration/tf_models.py (run in a subprocess, so the pytest process never imports TF).
One server holds every model of the main tests: GraphDef (names with and without ':0', a reshape, dynamic
batching), SavedModel (default_model_filename, BYTES output), SavedModel auto-completed from its signature, another
signature by TF_SIGNATURE_DEF, and four broken models whose loads fail with messages naming them.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from load.tools import tool
from tests.conftest import ROOT, ServerProcess

pytestmark = [
    pytest.mark.single_pass,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None,
        reason="tensorflow is not installed (pip install 'trireme[tensorflow]')",
    ),
]
LOAD_TIMEOUT_S = 300.0  # every TF worker imports TensorFlow (seconds of CPU each on a busy 2-core machine)

GRAPHDEF_CONFIG = """\
name: "{name}"
platform: "tensorflow_graphdef"
max_batch_size: 8
input [ {{ name: "{input}" data_type: {dtype} dims: [ 4 ] }} ]
output [
  {{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }},
  {{ name: "am:0" data_type: TYPE_INT64 dims: [ 1 ] reshape: {{ shape: [ ] }} }}
]
dynamic_batching {{ max_queue_delay_microseconds: 200000 }}
instance_group [ {{ kind: KIND_CPU }} ]
parameters {{ key: "TF_NUM_INTRA_THREADS" value: {{ string_value: "1" }} }}
"""
SAVEDMODEL_CONFIG = """\
name: "tf_savedmodel"
platform: "tensorflow_savedmodel"
max_batch_size: 8
default_model_filename: "custom.savedmodel"
input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "b:0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "out" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "text" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
SIGNATURE_CONFIG = """\
name: "tf_double"
backend: "tensorflow"
max_batch_size: 8
parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "double" } }
"""


@pytest.fixture(scope="module")
def tf_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated models and TF's reference answers."""
    out = tmp_path_factory.mktemp("tf_models")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-m", "tests.integration.tf_models", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def reference(tf_models: Path) -> dict[str, np.ndarray]:
    with np.load(tf_models / "reference.npz", allow_pickle=True) as data:
        return {k: data[k] for k in data.files}


def add_model(repo: Path, name: str, config: str | None, files: dict[str, Path | bytes]) -> None:
    """repo/name/config.pbtxt (unless None) and repo/name/1/<file> for each file (a copied path, or bytes)."""
    version = repo / name / "1"
    version.mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    for filename, source in files.items():
        if isinstance(source, bytes):
            (version / filename).write_bytes(source)
        elif source.is_dir():
            shutil.copytree(source, version / filename)
        else:
            shutil.copy(source, version / filename)


def start(repo: Path, log: Path, env: dict[str, str] | None = None) -> ServerProcess:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        server = ServerProcess([repo], ["--exit-on-error=false"], log)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        server.wait_ready(LOAD_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def tf_server(tf_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("tf_repo")
    graphdef, saved = tf_models / "graphdef" / "model.graphdef", tf_models / "savedmodel"
    add_model(
        repo,
        "tf_graphdef",
        GRAPHDEF_CONFIG.format(name="tf_graphdef", input="x:0", dtype="TYPE_FP32"),
        {"model.graphdef": graphdef},
    )
    add_model(repo, "tf_savedmodel", SAVEDMODEL_CONFIG, {"custom.savedmodel": saved})
    add_model(repo, "tf_auto", None, {"model.savedmodel": saved})
    add_model(repo, "tf_double", SIGNATURE_CONFIG, {"model.savedmodel": saved})
    add_model(repo, "bad_missing", GRAPHDEF_CONFIG.format(name="bad_missing", input="x", dtype="TYPE_FP32"), {})
    add_model(
        repo,
        "bad_name",
        GRAPHDEF_CONFIG.format(name="bad_name", input="nope", dtype="TYPE_FP32"),
        {"model.graphdef": graphdef},
    )
    add_model(
        repo,
        "bad_dtype",
        GRAPHDEF_CONFIG.format(name="bad_dtype", input="x", dtype="TYPE_INT32"),
        {"model.graphdef": graphdef},
    )
    add_model(
        repo,
        "bad_graphdef",
        GRAPHDEF_CONFIG.format(name="bad_graphdef", input="x", dtype="TYPE_FP32"),
        {"model.graphdef": b"this is not a GraphDef"},
    )
    server = start(repo, tmp_path_factory.mktemp("tf_log") / "server.log")
    yield server
    server.stop()


def infer(client: grpcclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray]) -> Any:
    tensors = []
    for name, array in inputs.items():
        t = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "FP32")
        t.set_data_from_numpy(array)
        tensors.append(t)
    return client.infer(model, tensors)


def test_graphdef_answers_match_tensorflow_and_batch(tf_server: ServerProcess, tf_models: Path) -> None:
    ref = reference(tf_models)
    client = grpcclient.InferenceServerClient(tf_server.url)
    try:
        result = infer(client, "tf_graphdef", {"x:0": ref["x"][:3]})
        np.testing.assert_allclose(result.as_numpy("y"), ref["y"][:3], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("am:0"), ref["am"][:3].reshape(3, 1))  # config reshape
        # 8 single-row requests at once: the dynamic batcher runs them as fewer TF calls, each answer its own row
        before = client.get_inference_statistics("tf_graphdef").model_stats[0].execution_count
        answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
        for i in range(8):
            t = grpcclient.InferInput("x:0", [1, 4], "FP32")
            t.set_data_from_numpy(ref["x"][i : i + 1])
            client.async_infer("tf_graphdef", [t], callback=lambda result, error, i=i: answers.put((i, result, error)))
        for _ in range(8):
            i, r, e = answers.get(timeout=60)
            assert e is None, e
            np.testing.assert_allclose(r.as_numpy("y"), ref["y"][i : i + 1], rtol=1e-5, atol=1e-6)
        stats = client.get_inference_statistics("tf_graphdef").model_stats[0]
        assert stats.execution_count - before < 8 and stats.inference_count == 11
    finally:
        client.close()


def test_savedmodel_with_config_and_autocompleted(tf_server: ServerProcess, tf_models: Path) -> None:
    ref = reference(tf_models)
    client = grpcclient.InferenceServerClient(tf_server.url)
    try:
        result = infer(client, "tf_savedmodel", {"a": ref["x"], "b:0": ref["b"]})  # default_model_filename honoured
        np.testing.assert_allclose(result.as_numpy("out"), ref["out"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("text"), ref["text"])
        # no config.pbtxt: the signature gives the tensors, batching -> max_batch_size 4 and the dynamic batcher
        config = client.get_model_config("tf_auto", as_json=True)["config"]
        assert (config["platform"], config["backend"], int(config["max_batch_size"])) == (
            "tensorflow_savedmodel",
            "tensorflow",
            4,
        )
        assert "dynamic_batching" in config
        dims = {t["name"]: (t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"] + config["output"]}
        assert dims == {"a": ("TYPE_FP32", [4]), "b": ("TYPE_FP32", [4]), "out": ("TYPE_FP32", [3]),
                        "text": ("TYPE_STRING", [1])}  # fmt: skip
        result = infer(client, "tf_auto", {"a": ref["x"][:4], "b": ref["b"][:4]})
        np.testing.assert_allclose(result.as_numpy("out"), ref["out"][:4], rtol=1e-5, atol=1e-6)
        # TF_SIGNATURE_DEF picks another signature, for auto-complete and serving alike
        config = client.get_model_config("tf_double", as_json=True)["config"]
        assert [t["name"] for t in config["input"]] == ["x"] and [t["name"] for t in config["output"]] == ["twice"]
        result = infer(client, "tf_double", {"x": ref["x"][:2]})
        np.testing.assert_allclose(result.as_numpy("twice"), ref["twice"][:2], rtol=1e-6)
    finally:
        client.close()


def test_bad_models_fail_their_load_with_a_message_naming_them(tf_server: ServerProcess, tf_models: Path) -> None:
    client = grpcclient.InferenceServerClient(tf_server.url)
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        for good in ("tf_graphdef", "tf_savedmodel", "tf_auto", "tf_double"):
            assert index[good].state == "READY", index[good].reason
        reasons = {name: index[name].reason for name in ("bad_missing", "bad_name", "bad_dtype", "bad_graphdef")}
        assert all(index[name].state == "UNAVAILABLE" for name in reasons)
        for name, reason in reasons.items():
            assert f"'{name}'" in reason, reason
        assert (
            "unable to find '" in reasons["bad_missing"] and "bad_missing/1/model.graphdef'" in reasons["bad_missing"]
        )
        assert "unexpected inference input 'nope', allowed inputs are: x" in reasons["bad_name"]
        assert (
            "configuration expects datatype TYPE_INT32 for input 'x', model provides TYPE_FP32"
            in (reasons["bad_dtype"])
        )
        assert "model.graphdef' is not a GraphDef" in reasons["bad_graphdef"]
        ref = reference(tf_models)  # and the rest serves
        np.testing.assert_allclose(
            infer(client, "tf_graphdef", {"x:0": ref["x"][:1]}).as_numpy("y"), ref["y"][:1], rtol=1e-5, atol=1e-6
        )
    finally:
        client.close()


PERF_ANALYZER = str(tool("perf_analyzer"))
# docs/optimization.md's steps on the tiny stand-in for inception_graphdef (same tensor names and shapes)
TINY_CONFIG = """\
name: "{name}"
platform: "tensorflow_graphdef"
max_batch_size: 128
input [ {{ name: "input" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 299, 299, 3 ] }} ]
output [ {{ name: "InceptionV3/Predictions/Softmax" data_type: TYPE_FP32 dims: [ 1001 ] }} ]
{extra}
"""
# the guide's GPU accelerators: for GPU instances, so a CPU instance loads and ignores them
AMP = 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "auto_mixed_precision" } ] } }'
# Grappler's first-call optimization moved into the load (docs/backends.md)
WARMUP = """model_warmup [ { name: "zeros" batch_size: 1
  inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 299, 299, 3 ] zero_data: true } } } ]
"""
BATCHED_XLA_TRT = """\
dynamic_batching { }
optimization {
  graph { level: 1 }
  execution_accelerators { gpu_execution_accelerator : [ {
    name : "tensorrt"
    parameters { key: "precision_mode" value: "FP16" }
  } ] }
}
"""


def perf(url: str, *args: str) -> str:
    """perf_analyzer over gRPC, short windows; a busy CI machine is noisy, so any latency spread counts as stable."""
    command = [PERF_ANALYZER, "-i", "grpc", "-u", url, "--measurement-mode", "count_windows"]
    command += ["--measurement-request-count", "50", "--stability-percentage", "1000", "--max-trials", "5", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout + run.stderr


@pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed")
def test_optimization_walkthrough_small(tf_models: Path, tmp_path: Path) -> None:
    from tests.compat.test_perf_analyzer_stream import success_and_fail

    repo = tmp_path / "repo"
    tiny = tf_models / "tiny" / "model.graphdef"
    add_model(repo, "tiny_plain", TINY_CONFIG.format(name="tiny_plain", extra=AMP + WARMUP), {"model.graphdef": tiny})
    add_model(
        repo, "tiny_batched", TINY_CONFIG.format(name="tiny_batched", extra=BATCHED_XLA_TRT), {"model.graphdef": tiny}
    )
    # TF_XLA_FLAGS in the server's environment reaches the workers; on CPU, XLA auto-clustering needs
    # --tf_xla_cpu_global_jit, and then `graph { level: 1 }` turns it on for that model only
    env = {"TF_XLA_FLAGS": "--tf_xla_cpu_global_jit", "TF_CPP_MIN_LOG_LEVEL": "0"}
    server = start(repo, tmp_path / "server.log", env)
    try:
        ref = reference(tf_models)
        client = grpcclient.InferenceServerClient(server.url)
        try:
            for model in ("tiny_plain", "tiny_batched"):
                probs = infer(client, model, {"input": ref["images"]}).as_numpy("InceptionV3/Predictions/Softmax")
                np.testing.assert_allclose(probs, ref["probs"], rtol=1e-3, atol=1e-6)
        finally:
            client.close()
        for model in ("tiny_plain", "tiny_batched"):
            output = perf(server.url, "-m", model, "--percentile=95", "--concurrency-range", "1:2")
            assert "Throughput:" in output and "error" not in output.lower(), output
            assert "Concurrency: 1, throughput:" in output and "Concurrency: 2, throughput:" in output, output
            ok, failed = success_and_fail(server.url, model)
            assert ok >= 100 and failed == 0
        log = server.log()
        assert log.count("Compiled cluster using XLA") == 1, "only the graph level 1 model is compiled by XLA"
        assert "GPU Execution Accelerator will be ignored for model instance on CPU" in log
    finally:
        server.stop()
