"""Explicit model control through tritonclient: --load-model at start, load, reload with a config, unload."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_example


def _identity(client: grpcclient.InferenceServerClient) -> np.ndarray:
    x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    return client.infer("identity_fp32", [x]).as_numpy("OUTPUT0")


def test_explicit_load_and_unload(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    copy_example(tmp_path, "add_sub")
    copy_example(tmp_path, "identity_fp32")
    server = start_server([tmp_path], ["--model-control-mode=explicit", "--load-model=add_sub"])
    client = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["add_sub"].state == "READY"
    assert index["identity_fp32"].state == "" and index["identity_fp32"].version == ""  # known, never loaded
    with pytest.raises(InferenceServerException) as info:
        _identity(client)
    assert info.value.status() == "StatusCode.NOT_FOUND"

    client.load_model("identity_fp32")
    assert client.is_model_ready("identity_fp32")
    assert _identity(client).shape == (1, 16)

    config = client.get_model_config("identity_fp32", as_json=True)["config"]
    config["max_batch_size"] = 4
    client.load_model("identity_fp32", config=json.dumps(config))  # reload with an override
    assert client.get_model_config("identity_fp32").config.max_batch_size == 4
    assert _identity(client).shape == (1, 16)

    client.unload_model("identity_fp32")
    assert not client.is_model_ready("identity_fp32")
    with pytest.raises(InferenceServerException) as info:
        _identity(client)
    assert info.value.status() == "StatusCode.NOT_FOUND"  # as Triton: "... has no available versions"
    assert "has no available versions" in info.value.message()
    rows = [m for m in client.get_model_repository_index().models if m.name == "identity_fp32"]
    assert rows[0].state == "UNAVAILABLE" and rows[0].reason == "unloaded"

    with pytest.raises(InferenceServerException) as info:
        client.load_model("no_such_model")
    assert info.value.status() == "StatusCode.INTERNAL"  # Triton's code and message
    assert "failed to poll from model repository" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("add_sub", config="{not json")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()


def test_load_is_refused_without_explicit_mode(grpc_client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model("add_sub")
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "explicit model load / unload is not allowed" in info.value.message()
