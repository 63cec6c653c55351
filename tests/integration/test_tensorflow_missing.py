"""Without TensorFlow in the worker's environment a TF model fails its load saying what to install; others serve.

Runs whether or not tensorflow is installed: a `tensorflow` package that raises ImportError shadows the real one
(first on PYTHONPATH, which the server passes on to its workers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import copy_example

pytestmark = pytest.mark.single_pass

CONFIG = """\
name: "tf_model"
platform: "tensorflow_graphdef"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def test_tf_model_without_tensorflow_names_the_extra(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow = tmp_path / "shadow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'tensorflow' (shadowed by the test)\")\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))
    repo = tmp_path / "repo"
    (repo / "tf_model" / "1").mkdir(parents=True)
    (repo / "tf_model" / "1" / "model.graphdef").write_bytes(b"never read")
    (repo / "tf_model" / "config.pbtxt").write_text(CONFIG)
    copy_example(repo, "identity_fp32")
    server = start_server(repos=[repo], args=["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["tf_model"].state == "UNAVAILABLE"
        reason = index["tf_model"].reason
        assert "unable to load model 'tf_model'" in reason and "pip install 'trireme[tensorflow]'" in reason, reason
        x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        assert index["identity_fp32"].state == "READY"
        client.infer("identity_fp32", [x])
    finally:
        client.close()
