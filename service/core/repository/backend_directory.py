"""Which code runs a model's backend: a built-in backend (the one table, BACKENDS in worker/backends/base.py) or a
Python-based backend from `--backend-directory DIR`, as in Triton: DIR/<name>/model.py, a TritonPythonModel that
serves every model whose config says `backend: "<name>"` (its version folders hold only that backend's files).
"""

from __future__ import annotations

import os

from service.errors import ErrorCode, ServiceError
from service.worker.backends.base import BACKENDS

PYTHON_BASED_RUNTIME = "model.py"  # what Triton's ModelConfig shows as `runtime` for a Python-based backend


def backend_folder(backend: str, directory: str) -> str:
    """ "" for a built-in backend, the absolute DIR/<backend> of a Python-based one; ServiceError when neither.

    Built-in backends win over a folder of the same name (Triton's backend directory ships python/,
    onnxruntime/, ... folders that hold shared libraries, never a model.py to use instead).
    """
    if backend in BACKENDS:
        return ""
    plain = backend not in ("", ".", "..") and os.path.basename(backend) == backend
    if directory and plain:
        folder = os.path.abspath(os.path.join(directory, backend))
        if os.path.isfile(os.path.join(folder, PYTHON_BASED_RUNTIME)):
            return folder
    if not plain:
        where = "a backend name is a folder name"
    elif directory:
        where = f"there is no {os.path.join(directory, backend, PYTHON_BASED_RUNTIME)}"
    else:
        where = "no --backend-directory is set"
    raise ServiceError(
        ErrorCode.INVALID_ARG,
        f"unable to find backend library for backend '{backend}', try specifying runtime on the model "
        f"configuration. (Trireme: built-in backends are {', '.join(sorted(BACKENDS))}; any other backend is "
        f"a Python-based backend, DIR/{backend}/model.py under --backend-directory=DIR: {where})",
    )
