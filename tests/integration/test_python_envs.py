"""Per-model Python environments through a real server: EXECUTION_ENV_PATH (a venv-pack archive, the unpacked
folder), requirements.txt built with uv, and the refusals (missing archive, numpy 1.x, unreachable registry)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from service.instances.envs.uvbuild import pip_registry_args
from tests.conftest import write_model

UV = os.path.join(os.path.dirname(sys.executable), "uv")
VENV_PACK = os.path.join(os.path.dirname(sys.executable), "venv-pack")
pytestmark = [
    pytest.mark.single_pass,
    pytest.mark.skipif(
        not (os.path.exists(UV) and os.path.exists(VENV_PACK)),
        reason="uv and venv-pack are needed (pip install uv venv-pack)",
    ),
]

# a tiny pure-Python package the server's environment does not have
EXTRA = "inflection"

CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "IN", data_type: TYPE_STRING, dims: [1] }}]
output [{{ name: "OUT", data_type: TYPE_STRING, dims: [1] }}, {{ name: "PREFIX", data_type: TYPE_STRING, dims: [1] }}]
instance_group [{{ count: 2, kind: KIND_CPU }}]
{params}
"""

MODEL = """
import sys
import numpy as np
import inflection
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            words = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            camel = np.array([inflection.camelize(w.decode()).encode() for w in words], dtype=np.object_)
            prefix = np.array([sys.prefix.encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", camel), pb_utils.Tensor("PREFIX", prefix)]))
        return out
"""


def _param(key: str, value: str) -> str:
    return f'parameters: {{ key: "{key}", value: {{ string_value: "{value}" }} }}'


def _camel(client: grpcclient.InferenceServerClient, model: str) -> tuple[str, str]:
    x = grpcclient.InferInput("IN", [1], "BYTES")
    x.set_data_from_numpy(np.array([b"device_type"], dtype=np.object_))
    result = client.infer(model, [x])
    return result.as_numpy("OUT")[0].decode(), result.as_numpy("PREFIX")[0].decode()


def _reason(client: grpcclient.InferenceServerClient, model: str) -> str:
    rows = [m for m in client.get_model_repository_index().models if m.name == model]
    return rows[0].reason if rows else ""


@pytest.fixture(scope="module")
def packed_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding inflection and the server's numpy, packed with venv-pack."""
    assert importlib.util.find_spec(EXTRA) is None, f"the server's environment must not have {EXTRA}"
    work = tmp_path_factory.mktemp("venv")
    venv = work / "env"
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(
        [
            UV,
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            *pip_registry_args(),
            EXTRA,
            f"numpy=={np.__version__}",
        ],
        check=True,
    )
    subprocess.run([VENV_PACK, "-q", "-p", str(venv), "-o", str(work / "env.tar.gz")], check=True)
    shutil.rmtree(venv)
    return work / "env.tar.gz"


@pytest.fixture
def env_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "env-cache"
    monkeypatch.setenv("TRIREME_PYTHON_ENV_CACHE", str(cache))
    return cache


def test_packed_and_unpacked_environments(tmp_path: Path, packed_env: Path, env_cache: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    packed = write_model(
        repo,
        "camel",
        CONFIG.format(name="camel", params=_param("EXECUTION_ENV_PATH", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")),
        MODEL,
    )
    shutil.copy(packed_env, packed / "env.tar.gz")
    # the same archive elsewhere (an absolute path): same content, same cached environment
    write_model(
        repo, "camel_abs", CONFIG.format(name="camel_abs", params=_param("EXECUTION_ENV_PATH", str(packed_env))), MODEL
    )
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(packed_env), "-C", str(unpacked)], check=True)
    write_model(
        repo, "camel_dir", CONFIG.format(name="camel_dir", params=_param("EXECUTION_ENV_PATH", str(unpacked))), MODEL
    )
    write_model(
        repo,
        "camel_missing",
        CONFIG.format(
            name="camel_missing", params=_param("EXECUTION_ENV_PATH", "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
        ),
        MODEL,
    )
    write_model(repo, "camel_plain", CONFIG.format(name="camel_plain", params=""), MODEL)  # the server's env
    corrupt = write_model(
        repo,
        "camel_corrupt",
        CONFIG.format(name="camel_corrupt", params=_param("EXECUTION_ENV_PATH", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")),
        MODEL,
    )
    (corrupt / "env.tar.gz").write_bytes(packed_env.read_bytes()[:4096])  # a truncated download
    inproc = _param("EXECUTION_ENV_PATH", str(packed_env)) + "\n" + _param("TRIREME_INSTANCE_MODE", "in_process")
    write_model(repo, "camel_inproc", CONFIG.format(name="camel_inproc", params=inproc), MODEL)

    server = start_server([repo], ["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    camel, prefix = _camel(client, "camel")
    assert camel == "DeviceType"
    assert prefix.startswith(str(env_cache / "packed"))  # the worker runs the unpacked environment's interpreter
    assert _camel(client, "camel_abs") == (camel, prefix)  # one unpacked copy for both
    camel, prefix = _camel(client, "camel_dir")
    assert camel == "DeviceType" and prefix == str(unpacked)  # a folder is used where it is
    assert not client.is_model_ready("camel_missing")
    missing = str(packed.parent / "camel_missing" / "nowhere.tar.gz")
    assert f"Failed to get the canonical path for {missing}." in _reason(client, "camel_missing")
    assert not client.is_model_ready("camel_plain")  # inflection is not in the server's environment
    assert "inflection" in _reason(client, "camel_plain")
    assert "an in-process instance runs in the server's Python" in _reason(client, "camel_inproc")
    reason = _reason(client, "camel_corrupt")
    assert f"Failed to extract the Python execution environment {corrupt / 'env.tar.gz'}" in reason
    folders = [p for p in os.listdir(env_cache / "packed") if not p.endswith(".lock")]
    assert len(folders) == 1  # one environment for both archives; nothing of the corrupt one is kept
    assert server.log().count("unpacked the Python execution environment") == 1
    client.close()
    server.stop()

    again = start_server([repo], ["--exit-on-error=false"])  # a restart reuses the cached environment
    client = grpcclient.InferenceServerClient(again.url)
    camel, prefix = _camel(client, "camel")
    assert camel == "DeviceType" and prefix.startswith(str(env_cache / "packed"))
    assert "unpacked the Python execution environment" not in again.log()
    client.close()


def test_requirements_environment(tmp_path: Path, env_cache: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    for name in ("req_a", "req_b"):
        model = write_model(repo, name, CONFIG.format(name=name, params=_param("TRIREME_REQUIREMENTS", "true")), MODEL)
        (model / "1" / "requirements.txt").write_text(f"{EXTRA}\n")
    unknown = write_model(
        repo, "req_unknown", CONFIG.format(name="req_unknown", params=_param("TRIREME_REQUIREMENTS", "true")), MODEL
    )
    (unknown / "1" / "requirements.txt").write_text("trireme-no-such-package-x7q==0.0.1\n")
    old = write_model(
        repo, "old_numpy", CONFIG.format(name="old_numpy", params=_param("TRIREME_REQUIREMENTS", "true")), MODEL
    )
    (old / "1" / "requirements.txt").write_text(f"{EXTRA}\nnumpy<2\n")
    server = start_server([repo], ["--exit-on-error=false"], wait=False)
    server.wait_ready(600)  # first builds download from the registry
    client = grpcclient.InferenceServerClient(server.url)
    camel, prefix_a = _camel(client, "req_a")
    assert camel == "DeviceType" and prefix_a.startswith(str(env_cache / "requirements"))
    assert _camel(client, "req_b")[1] == prefix_a  # same file content: one environment
    assert not client.is_model_ready("old_numpy")
    reason = _reason(client, "old_numpy")
    assert "has numpy 1." in reason and f"the environment's numpy must be {np.__version__.split('.')[0]}.x" in reason
    reason = _reason(client, "req_unknown")
    assert "failed to build the Python environment of" in reason and "trireme-no-such-package-x7q" in reason
    assert server.log().count("built the Python environment of") == 2  # req_a/req_b once, old_numpy once
    client.close()
    server.stop()

    (repo / "req_b" / "1" / "requirements.txt").write_text(f"{EXTRA}\n# changed\n")  # a changed file: a new build
    again = start_server([repo], ["--exit-on-error=false"], wait=False)
    again.wait_ready(600)
    client = grpcclient.InferenceServerClient(again.url)
    assert _camel(client, "req_a")[1] == prefix_a  # unchanged: reused across the restart
    assert _camel(client, "req_b")[1] != prefix_a
    assert again.log().count("built the Python environment of") == 1
    client.close()


def test_unreachable_registry_fails_only_that_model(
    tmp_path: Path,
    env_cache: Path,
    start_server,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # nothing cached to fall back on
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    repo = tmp_path / "repo"
    model = write_model(
        repo, "needs_net", CONFIG.format(name="needs_net", params=_param("TRIREME_REQUIREMENTS", "true")), MODEL
    )
    (model / "1" / "requirements.txt").write_text(f"{EXTRA}\n")
    write_model(
        repo,
        "plain",
        CONFIG.format(name="plain", params=""),
        MODEL.replace("import inflection\n", "").replace("inflection.camelize(w.decode())", "w.decode().title()"),
    )
    server = start_server([repo], ["--exit-on-error=false"], wait=False)
    server.wait_ready(300)
    client = grpcclient.InferenceServerClient(server.url)
    assert _camel(client, "plain")[0] == "Device_Type"  # the other model serves
    assert not client.is_model_ready("needs_net")
    reason = _reason(client, "needs_net")
    assert "failed to build the Python environment of" in reason and "requirements.txt" in reason
    assert not (env_cache / "requirements").exists() or not [
        p for p in os.listdir(env_cache / "requirements") if not p.startswith(".") and not p.endswith(".lock")
    ]  # nothing half-built is kept
    client.close()
