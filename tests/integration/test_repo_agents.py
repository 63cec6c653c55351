"""Repository agents through a real server: Triton's checksum agent (matching, mismatched and unknown agents) and
a Python agent from --repoagent-directory that decodes a model's files into a folder of its own."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import write_model

CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_FP32, dims: [2] }}]
output [{{ name: "OUT", data_type: TYPE_FP32, dims: [2] }}]
instance_group [{{ count: 1, kind: KIND_CPU }}]
{agents}
"""

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * {factor})]))
        return out
"""

# decodes every *.b64 file of the model into a folder of its own and loads the model from there; records actions
DECODE_AGENT = """
import json, os, shutil, base64

class TritonRepoAgent:
    def model_action(self, action, model):
        with open(model.parameters["record"], "a") as f:
            f.write(json.dumps([action, model.name, model.location]) + "\\n")
        if action != "LOAD":
            return
        if model.parameters.get("refuse") == "yes":
            raise RuntimeError("the key is not known")
        target = model.acquire_mutable_location()
        for root, _, files in os.walk(model.location):
            rel = os.path.relpath(root, model.location)
            os.makedirs(os.path.join(target, rel), exist_ok=True)
            for name in files:
                src = os.path.join(root, name)
                if name.endswith(".b64"):
                    with open(src, "rb") as f, open(os.path.join(target, rel, name[:-4]), "wb") as g:
                        g.write(base64.b64decode(f.read()))
                else:
                    shutil.copy(src, os.path.join(target, rel, name))
        model.set_location(target)
"""


def _agents(name: str, params: dict[str, str]) -> str:
    body = ", ".join(f'{{ key: "{k}", value: "{v}" }}' for k, v in params.items())
    return f'model_repository_agents {{ agents [{{ name: "{name}", parameters [{body}] }}] }}'


def _infer(client: grpcclient.InferenceServerClient, model: str) -> np.ndarray:
    x = grpcclient.InferInput("IN", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    return client.infer(model, [x]).as_numpy("OUT")


def _reason(client: grpcclient.InferenceServerClient, model: str) -> str:
    return next(m.reason for m in client.get_model_repository_index().models if m.name == model)


def test_checksum_agent(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    source = textwrap.dedent(MODEL.format(factor=2))
    good = hashlib.md5(source.encode()).hexdigest()
    write_model(
        tmp_path, "checked", CONFIG.format(name="checked", agents=_agents("checksum", {"MD5:1/model.py": good})), source
    )
    write_model(
        tmp_path,
        "tampered",
        CONFIG.format(name="tampered", agents=_agents("checksum", {"MD5:1/model.py": good})),
        source.replace("x * 2", "x * 3"),
    )
    write_model(
        tmp_path,
        "no_file",
        CONFIG.format(name="no_file", agents=_agents("checksum", {"MD5:1/weights.bin": good})),
        source,
    )
    write_model(tmp_path, "no_agent", CONFIG.format(name="no_agent", agents=_agents("nosuch", {"k": "v"})), source)
    server = start_server([tmp_path], ["--exit-on-error=false", f"--repoagent-directory={tmp_path / 'agents'}"])
    client = grpcclient.InferenceServerClient(server.url)
    assert _infer(client, "checked").tolist() == [2.0, 4.0]
    assert not client.is_model_ready("tampered")
    got = hashlib.md5(source.replace("x * 2", "x * 3").encode()).hexdigest()
    assert f"Mismatched MD5 hash for file 1/model.py, expect: {good}, got: {got}" in _reason(client, "tampered")
    with pytest.raises(InferenceServerException):
        _infer(client, "tampered")
    assert "failed to open text file for read 1/weights.bin" in _reason(client, "no_file")
    assert (
        f"unable to find 'libtritonrepoagent_nosuch.so' (or 'nosuch/agent.py') for repo agent 'nosuch', searched: "
        f"{tmp_path / 'agents'}" in _reason(client, "no_agent")
    )
    client.close()


def test_python_agent_from_repoagent_directory(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    agents = tmp_path / "agents"
    (agents / "decode").mkdir(parents=True)
    (agents / "decode" / "agent.py").write_text(textwrap.dedent(DECODE_AGENT))
    record = tmp_path / "record.jsonl"
    repo = tmp_path / "repo"
    model = write_model(repo, "sealed", CONFIG.format(name="sealed", agents=_agents("decode", {"record": str(record)})))
    (model / "1" / "model.py.b64").write_bytes(base64.b64encode(textwrap.dedent(MODEL.format(factor=5)).encode()))
    write_model(
        repo,
        "refused",
        CONFIG.format(name="refused", agents=_agents("decode", {"record": str(record), "refuse": "yes"})),
    )
    server = start_server(
        [repo], ["--model-control-mode=explicit", "--load-model=sealed", f"--repoagent-directory={agents}"]
    )
    client = grpcclient.InferenceServerClient(server.url)
    assert _infer(client, "sealed").tolist() == [5.0, 10.0]  # loaded from the agent's decoded copy
    actions = [json.loads(line) for line in record.read_text().splitlines()]
    assert [a[0] for a in actions] == ["LOAD", "LOAD_COMPLETE"]
    decoded = actions[1][2]
    assert decoded != str(model) and os.path.exists(os.path.join(decoded, "1", "model.py"))

    with pytest.raises(InferenceServerException) as info:
        client.load_model("refused")
    assert "the key is not known" in info.value.message()
    assert _infer(client, "sealed").tolist() == [5.0, 10.0]  # the other model serves

    client.unload_model("sealed")
    actions = [json.loads(line) for line in record.read_text().splitlines()]
    assert [a[0] for a in actions if a[1] == "sealed"] == ["LOAD", "LOAD_COMPLETE", "UNLOAD", "UNLOAD_COMPLETE"]
    assert not os.path.exists(decoded)  # the agent's folder is removed after UNLOAD_COMPLETE
    client.close()
