"""Model control from a model: pb_utils.load_model (with config and files), unload_model (with
unload_dependents) and is_model_ready, from execute and from initialize, in explicit mode, as Triton's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, write_model
from tests.integration.models import elementwise_py, python_config

# CMD is a JSON list of calls [op, args...]; OUT is the JSON list of their results ("error: <exception>" on one)
CONTROLLER_PY = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    def call(op, *args):
        try:
            if op == "load":
                name, config, files = args
                files = {k: v.encode() for k, v in files.items()} if files is not None else None
                return pb_utils.load_model(name, config=config, files=files)
            if op == "unload":
                return pb_utils.unload_model(args[0], unload_dependents=args[1])
            return pb_utils.is_model_ready(*args)
        except pb_utils.TritonModelException as e:
            return f"error: {e}"


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                calls = json.loads(pb_utils.get_input_tensor_by_name(request, "CMD").as_numpy()[0])
                out = json.dumps([call(*c) for c in calls])
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([out], np.object_))]))
            return responses
"""

# loads "target" from initialize() and records that it was ready then
STARTER_PY = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            pb_utils.load_model("target")
            self.ready = pb_utils.is_model_ready("target")

        def execute(self, requests):
            out = np.array([self.ready], np.bool_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("READY", out)]) for _ in requests]
"""


def _string_config(name: str, inp: str, out: str, out_type: str = "TYPE_STRING") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "{inp}" data_type: TYPE_STRING dims: [ 1 ] }} ]
        output [ {{ name: "{out}" data_type: {out_type} dims: [ 1 ] }} ]
    """


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_model(repo, "controller", _string_config("controller", "CMD", "OUT"), CONTROLLER_PY)
    write_model(repo, "starter", _string_config("starter", "X", "READY", "TYPE_BOOL"), STARTER_PY)
    write_model(repo, "target", python_config("target"), elementwise_py("x + 1"))
    step = '{ model_name: "target" model_version: -1 input_map { key: "INPUT0" value: "IN" } '
    step += 'output_map { key: "OUTPUT0" value: "OUT" } }'
    write_model(
        repo,
        "ens",
        f"""
        name: "ens"
        platform: "ensemble"
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        ensemble_scheduling {{ step [ {step} ] }}
        """,
    )
    return repo


def _control(server: ServerProcess, *calls: list[Any]) -> list[Any]:
    with grpcclient.InferenceServerClient(server.url) as client:
        cmd = grpcclient.InferInput("CMD", [1], "BYTES")
        cmd.set_data_from_numpy(np.array([json.dumps(calls).encode()], np.object_))
        out = client.infer("controller", [cmd], timeout=120).as_numpy("OUT")
    assert out is not None
    return list(json.loads(out[0]))


def _ready(server: ServerProcess, name: str) -> bool:
    with grpcclient.InferenceServerClient(server.url) as client:
        return bool(client.is_model_ready(name))


def test_load_unload_and_readiness_from_execute_and_initialize(repo: Path, start_server: Any) -> None:
    server = start_server([repo], ["--model-control-mode=explicit", "--load-model=controller", "--load-model=starter"])
    # starter's initialize() loaded target, and saw it ready
    with grpcclient.InferenceServerClient(server.url) as client:
        x = grpcclient.InferInput("X", [1], "BYTES")
        x.set_data_from_numpy(np.array([b""], np.object_))
        assert client.infer("starter", [x]).as_numpy("READY").tolist() == [True]
    assert _ready(server, "target")

    assert _control(server, ["ready", "target", ""], ["unload", "target", False], ["ready", "target", "1"]) == [
        True,
        None,
        False,
    ]
    assert not _ready(server, "target")
    assert _control(server, ["load", "target", "", None], ["ready", "target", ""]) == [None, True]

    # a model made from a config and files the model sends, then served to clients
    config = {
        "name": "made",
        "backend": "python",
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    files = {"file:1/model.py": elementwise_py("x * 10")}
    assert _control(server, ["load", "made", json.dumps(config), files]) == [None]
    with grpcclient.InferenceServerClient(server.url) as client:
        x = grpcclient.InferInput("INPUT0", [2], "FP32")
        x.set_data_from_numpy(np.array([1, 2], np.float32))
        assert client.infer("made", [x]).as_numpy("OUTPUT0").tolist() == [10, 20]

    # unload_dependents: the ensemble and its composing model go
    assert _control(server, ["load", "ens", "", None], ["ready", "ens", ""]) == [None, True]
    assert _control(server, ["unload", "ens", True]) == [None]
    assert not _ready(server, "ens") and not _ready(server, "target")


def test_errors_reach_the_model_as_triton_raises_them(repo: Path, start_server: Any) -> None:
    server = start_server([repo], ["--model-control-mode=explicit", "--load-model=controller"])
    results = _control(
        server,
        ["load", "no_such_model", "", None],
        ["load", "target", "", {"file:1/model.py": "x"}],
        ["ready", "target", "abc"],
        ["ready", "unknown_model", ""],
    )
    assert results == [
        "error: Failed to load model: failed to load 'no_such_model', failed to poll from model repository",
        "error: Failed to load model: Load parameter 'config' must be specified for model file override",
        "error: failed to get model version from specified version string 'abc', version should be an integral "
        "value > 0",
        "error: Failed to check model readiness: Request for unknown model: 'unknown_model' is not found",
    ]
    assert _ready(server, "controller")  # the server and the calling model keep serving


def test_model_control_needs_explicit_mode(repo: Path, start_server: Any) -> None:
    shutil.rmtree(repo / "starter")  # its initialize() would fail to load (and stop the server): see below
    server = start_server([repo])
    assert _control(server, ["unload", "target", False], ["ready", "target", ""]) == [
        "error: Failed to unload model: explicit model load / unload is not allowed if polling is enabled",
        True,
    ]
