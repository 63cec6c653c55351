"""Python-based backends (--backend-directory DIR): DIR/<name>/model.py serves every model whose config says
`backend: "<name>"` and whose version folders hold only that backend's files; through real tritonclient."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT, write_model

EXAMPLE = ROOT / "docs" / "examples" / "custom_backend"

# a second backend: completes the config of models that name no tensors, and reports what it was given
REPORTING_BACKEND = """
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def initialize(self, args):
        keep = ("model_name", "model_version", "model_repository", "model_instance_name")
        self.info = {k: args[k] for k in keep}
        self.info.update(module=__name__, file=__file__, argv=sys.argv)

    def execute(self, requests):
        out = np.array([json.dumps(self.info)], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)]) for _ in requests]
"""

LINEAR_CONFIG = """
name: "{name}"
backend: "linear"
max_batch_size: 8
input [{{ name: "FEATURES" data_type: TYPE_FP32 dims: [ {n_in} ] }}]
output [{{ name: "SCORES" data_type: TYPE_FP32 dims: [ {n_out} ] }}]
dynamic_batching {{ }}
"""


def linear_model(repo: Path, name: str, version: int, weights: np.ndarray, bias: np.ndarray) -> None:
    """A model of the example `linear` engine: its version folder holds only model.json."""
    config = LINEAR_CONFIG.format(name=name, n_in=weights.shape[0], n_out=weights.shape[1])
    model_dir = write_model(repo, name, config, version=version)
    spec = {"weights": weights.tolist(), "bias": bias.tolist()}
    (model_dir / str(version) / "model.json").write_text(json.dumps(spec))


@pytest.fixture
def custom_setup(tmp_path: Path) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """(backend dir, repository, weights, bias): the documented example plus generated models."""
    backends = tmp_path / "backends"
    shutil.copytree(EXAMPLE / "backends", backends)
    (backends / "reporting").mkdir()
    (backends / "reporting" / "model.py").write_text(REPORTING_BACKEND)
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE / "models", repo)
    rng = np.random.default_rng(7)
    weights = rng.normal(size=(5, 4)).astype(np.float32)
    bias = rng.normal(size=4).astype(np.float32)
    linear_model(repo, "linear_wide", 2, weights, bias)  # version 2 only: args["model_version"] must say so
    write_model(repo, "reporter", 'name: "reporter"\nbackend: "reporting"\n')
    (repo / "reporter" / "1" / "weights.bin").write_bytes(b"\0" * 16)
    write_model(repo, "no_such_backend", 'name: "no_such_backend"\nbackend: "nowhere"\n')
    (repo / "no_such_backend" / "1" / "model.json").write_text("{}")
    return backends, repo, weights, bias


def test_python_based_backends_serve_their_models(custom_setup: Any, start_server: Any) -> None:
    backends, repo, weights, bias = custom_setup
    server = start_server([repo], ["--backend-directory", str(backends), "--exit-on-error=false"])
    x = np.random.default_rng(1).normal(size=(3, 5)).astype(np.float32)
    grpc = grpcclient.InferenceServerClient(server.url)
    try:
        t = grpcclient.InferInput("FEATURES", [3, 5], "FP32")
        t.set_data_from_numpy(x)
        result = grpc.infer("linear_wide", [t])
        np.testing.assert_allclose(result.as_numpy("SCORES"), x @ weights + bias, rtol=1e-5, atol=1e-5)
        assert result.get_response().model_version == "2"

        t = grpcclient.InferInput("X", [1], "INT32")
        t.set_data_from_numpy(np.array([1], np.int32))
        out = grpc.infer("reporter", [t]).as_numpy("INFO")
        assert out is not None
        info = json.loads(out[0])
        assert info["model_name"] == "reporter" and info["model_version"] == "1"
        assert info["model_repository"] == str(repo / "reporter")
        assert info["module"] == "model" and info["file"] == str(backends / "reporting" / "model.py")
        assert info["argv"] == [""]

        config = grpc.get_model_config("linear_wide", as_json=True)["config"]
        assert config["backend"] == "linear" and config["runtime"] == "model.py"
        assert config.get("default_model_filename", "") == ""
        index = {m["name"]: m for m in grpc.get_model_repository_index(as_json=True)["models"]}
        assert index["no_such_backend"]["state"] == "UNAVAILABLE"
        assert "unable to find backend library for backend 'nowhere'" in index["no_such_backend"]["reason"]
        assert str(backends / "nowhere" / "model.py") in index["no_such_backend"]["reason"]
    finally:
        grpc.close()
    # the documented example, over HTTP
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        t = httpclient.InferInput("INPUT", [2, 3], "FP32")
        t.set_data_from_numpy(np.array([[1, 2, 3], [0, 0, 1]], np.float32))
        scores = http.infer("linear_demo", [t]).as_numpy("OUTPUT")
    finally:
        http.close()
    spec = json.loads((repo / "linear_demo" / "1" / "model.json").read_text())
    expected = np.array([[1, 2, 3], [0, 0, 1]], np.float32) @ np.array(spec["weights"]) + np.array(spec["bias"])
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


def test_without_backend_directory_a_custom_backend_fails_only_its_model(custom_setup: Any, start_server: Any) -> None:
    _backends, repo, _w, _b = custom_setup
    server = start_server([repo], ["--exit-on-error=false"])
    index = requests.post(f"http://{server.http_url}/v2/repository/index", timeout=10).json()
    states = {m["name"]: (m["state"], m.get("reason", "")) for m in index}
    assert states["linear_demo"][0] == "UNAVAILABLE"
    assert "no --backend-directory is set" in states["linear_demo"][1]
