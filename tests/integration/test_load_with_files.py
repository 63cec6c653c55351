"""Model files sent with a load request (`config` plus `file:<version>/<name>`, base64 over HTTP and bytes over
gRPC) create or override a model, as Triton's repository API does; a later load without files reads the
repository again; Triton's checks on the files."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, write_model
from tests.integration.models import elementwise_py, python_config

CONFIG = {
    "name": "scaled",
    "backend": "python",
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}


def _model_py(factor: int) -> bytes:
    return elementwise_py(f"x * {factor}").encode()


def _read_or_empty(path: Path) -> bytes:
    """The file's bytes; b"" where it is gone (another server's files, removed as that server stopped)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _infer(server: ServerProcess, model: str) -> list[float]:
    with grpcclient.InferenceServerClient(server.url) as client:
        x = grpcclient.InferInput("INPUT0", [3], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
        out = client.infer(model, [x]).as_numpy("OUTPUT0")
    assert out is not None
    return [float(v) for v in out]


@pytest.fixture
def server(tmp_path: Path, start_server: Any) -> ServerProcess:
    write_model(tmp_path / "repo", "scaled", python_config("scaled"), elementwise_py("x * 2"))
    srv: ServerProcess = start_server([tmp_path / "repo"], ["--model-control-mode=explicit"])
    return srv


def test_files_create_a_model_over_grpc_and_override_one_over_http(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        config = {**CONFIG, "name": "sent"}
        client.load_model("sent", config=json.dumps(config), files={"file:1/model.py": _model_py(5)})
        assert client.is_model_ready("sent")
    assert _infer(server, "sent") == [5, 10, 15]

    with httpclient.InferenceServerClient(server.http_url) as http:
        http.load_model("scaled")
        assert _infer(server, "scaled") == [2, 4, 6]  # the repository's files
        # the client base64-encodes the files; version 3 of the sent files replaces the repository's version 1
        http.load_model("scaled", config=json.dumps(CONFIG), files={"file:3/model.py": _model_py(7)})
        assert _infer(server, "scaled") == [7, 14, 21]
        index = http.get_model_repository_index()
        assert [m["version"] for m in index if m["name"] == "scaled" and m["state"] == "READY"] == ["3"]
        http.load_model("scaled")  # without files: the repository again
        assert _infer(server, "scaled") == [2, 4, 6]


@pytest.mark.parametrize(
    ("files", "config", "message"),
    [
        ({"file:1/model.py": b"x"}, None, "Load parameter 'config' must be specified for model file override"),
        ({"file:../escape.py": b"x"}, CONFIG, "must stay within model directory."),
        ({"file:1/../../up/model.py": b"x"}, CONFIG, "must stay within model directory."),
        (
            {"file:1": b"a file", "file:1/model.py": b"x"},
            CONFIG,
            "Invalid file parameter 'file:1/model.py', directory has been created as a file",
        ),
    ],
)
def test_refused_files(server: ServerProcess, files: dict[str, bytes], config: Any, message: str) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("scaled", config=json.dumps(config) if config else None, files=files)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert message in info.value.message()
        assert not client.is_model_ready("scaled")
        client.load_model("scaled")  # the server keeps serving
    assert _infer(server, "scaled") == [2, 4, 6]


def test_wrong_value_types(server: ServerProcess) -> None:
    request = service_pb2.RepositoryModelLoadRequest(model_name="scaled")
    request.parameters["config"].string_param = json.dumps(CONFIG)
    request.parameters["file:1/model.py"].string_param = "not bytes"
    with grpcclient.InferenceServerClient(server.url) as client, pytest.raises(Exception) as info:
        client._client_stub.RepositoryModelLoad(request)
    assert "invalid value type for load parameter 'file:1/model.py', expected bytes_param." in str(info.value)
    body = {"parameters": {"config": json.dumps(CONFIG), "file:1/model.py": "@@not base64@@"}}
    r = requests.post(f"http://{server.http_url}/v2/repository/models/scaled/load", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"] == "Unable to parse 'file:1/model.py': invalid base64 content"


def test_files_are_removed_with_the_server(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        # a mark of this test's file: another test run on this machine (tools/test.sh runs two at once) may have
        # the same model's files in the temp directory right now
        mark = f"# sent by {uuid.uuid4().hex}\n".encode()
        client.load_model("scaled", config=json.dumps(CONFIG), files={"file:1/model.py": _model_py(3) + mark})
        assert _infer(server, "scaled") == [3, 6, 9]
    sent = Path(tempfile.gettempdir()).glob("trireme-model-files-*/scaled-*/1/model.py")
    ours = [f.parents[2] for f in sent if mark in _read_or_empty(f)]
    assert len(ours) == 1
    server.stop()
    assert not any(d.exists() for d in ours)
