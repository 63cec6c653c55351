"""The parts of per-model Python environments a test server cannot reach here: a Python of another minor version
(this machine has one), the parameter forms, and pip's registry settings handed to uv."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy
import pytest

from protos import model_config_pb2 as mc
from service.instances.envs.probe import compatibility_error
from service.instances.envs.request import EnvRequest, env_request
from service.instances.envs.uvbuild import pip_registry_args

OURS = ".".join(str(n) for n in sys.version_info[:3])


def test_versions_the_worker_accepts() -> None:
    assert compatibility_error({"python": OURS, "numpy": numpy.__version__}, "env") == ""
    other = f"{sys.version_info[0]}.{sys.version_info[1] - 1}.9"
    message = compatibility_error({"python": other, "numpy": numpy.__version__}, "/m/env.tar.gz")
    assert f"has Python {other}" in message and f"must be {sys.version_info[0]}.{sys.version_info[1]}.x" in message
    assert "has no usable numpy (ModuleNotFoundError" in compatibility_error(
        {"python": OURS, "numpy_error": "ModuleNotFoundError('numpy')"}, "env"
    )
    old = "1.26.4" if numpy.__version__.startswith("2") else "2.0.0"
    assert f"has numpy {old}" in compatibility_error({"python": OURS, "numpy": old}, "env")


def _params(**values: str) -> dict[str, mc.ModelParameter]:
    return {k: mc.ModelParameter(string_value=v) for k, v in values.items()}


def test_env_request_forms(tmp_path: Path) -> None:
    model, version = str(tmp_path / "m"), str(tmp_path / "m" / "1")
    assert env_request({}, model, version) is None
    assert env_request(_params(EXECUTION_ENV_PATH="$$TRITON_MODEL_DIRECTORY/e.tar.gz"), model, version) == EnvRequest(
        "path", f"{model}/e.tar.gz"
    )
    assert env_request(_params(TRIREME_REQUIREMENTS="false"), model, version) is None
    assert env_request(_params(TRIREME_REQUIREMENTS="true"), model, version) == EnvRequest(
        "requirements", f"{model}/requirements.txt"
    )
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "requirements.txt").write_text("x\n")
    assert env_request(_params(TRIREME_REQUIREMENTS="true"), model, version) == EnvRequest(
        "requirements", f"{version}/requirements.txt"
    )
    both = _params(EXECUTION_ENV_PATH="/e", TRIREME_REQUIREMENTS="true")
    assert env_request(both, model, version) == EnvRequest("path", "/e")


def test_pip_registry_becomes_uv_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\nextra-index-url = file:///a file:///b\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels")
    args = pip_registry_args()
    assert args[:2] == ["--index-url", "https://mirror.example/simple"]
    assert args[-2:] == ["--find-links", "/wheels"]
    assert "file:///a" in args and "file:///b" in args
    monkeypatch.setenv("UV_INDEX_URL", "https://uv.example/simple")  # uv's own settings: nothing translated
    assert pip_registry_args() == []
