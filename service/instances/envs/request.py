"""What a model's config asks for: EXECUTION_ENV_PATH (as Triton) or a requirements file (Trireme's own)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_PATH_KEY = "EXECUTION_ENV_PATH"  # Triton's python backend parameter
REQUIREMENTS_KEY = "TRIREME_REQUIREMENTS"  # "true" (requirements.txt beside model.py) or a path
MODEL_DIR_VAR = "$$TRITON_MODEL_DIRECTORY"
REQUIREMENTS_FILE = "requirements.txt"


@dataclass(frozen=True, slots=True)
class EnvRequest:
    """An environment a model asks for: kind "path" (archive or directory) or "requirements" (a file)."""

    kind: str
    path: str


def _value(parameters: Mapping[str, Any], key: str) -> str:
    p = parameters.get(key)
    return str(getattr(p, "string_value", "") or "").strip() if p is not None else ""


def expand(value: str, model_dir: str) -> str:
    """$$TRITON_MODEL_DIRECTORY replaced by the model's folder (Triton's only substitution)."""
    return value.replace(MODEL_DIR_VAR, model_dir)


def env_request(parameters: Mapping[str, Any], model_dir: str, version_dir: str) -> EnvRequest | None:
    """The environment the config's `parameters` ask for, None for the server's own.

    EXECUTION_ENV_PATH wins over TRIREME_REQUIREMENTS. TRIREME_REQUIREMENTS "true" (or "1", "yes") means the
    requirements.txt beside model.py (the version folder), else the one in the model's folder.
    """
    path = _value(parameters, ENV_PATH_KEY)
    if path:
        return EnvRequest("path", expand(path, model_dir))
    req = _value(parameters, REQUIREMENTS_KEY)
    if not req or req.lower() in ("false", "0", "no", "off"):
        return None
    if req.lower() in ("true", "1", "yes", "on"):
        beside = os.path.join(version_dir, REQUIREMENTS_FILE)
        return EnvRequest(
            "requirements", beside if os.path.exists(beside) else os.path.join(model_dir, REQUIREMENTS_FILE)
        )
    return EnvRequest("requirements", expand(req, model_dir))
