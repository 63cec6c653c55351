"""Model files sent with a load request (`file:<version>/<name>` parameters plus `config`), as Triton's core takes
them: written into a directory of their own that stands in for the model's repository folder until a later load
without files (which reads the repository again).

Triton's checks and messages: files need a `config`; a file path must stay inside the model's directory, and a
folder on its way must not be a file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

from google.protobuf import text_format

from service.core.repository.model_config import from_json
from service.errors import ErrorCode, ServiceError

FILE_PREFIX = "file:"


class ModelFileDirs:
    """The directories made for load requests that carried files: one per model at a time, all under one
    temporary root that is removed with the server."""

    def __init__(self) -> None:
        self._root: tempfile.TemporaryDirectory[str] | None = None
        self._current: dict[str, str] = {}  # model -> the directory it serves from now
        self._lock = threading.Lock()

    def write(self, name: str, config_json: str, files: dict[str, bytes]) -> str:
        """A new directory holding config.pbtxt (from `config`) and the files (blocking; ServiceError for what
        Triton refuses). Nothing of a refused request is left behind."""
        if not config_json:
            raise ServiceError(
                ErrorCode.INVALID_ARG, "Load parameter 'config' must be specified for model file override"
            )
        try:
            config = from_json(config_json)
        except ValueError as e:
            raise ServiceError(ErrorCode.INVALID_ARG, f"failed to load '{name}': invalid 'config': {e}") from None
        with self._lock:
            if self._root is None:
                self._root = tempfile.TemporaryDirectory(prefix="trireme-model-files-")
            root = self._root.name
        directory = os.path.realpath(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
        try:
            with open(os.path.join(directory, "config.pbtxt"), "w") as f:
                f.write(text_format.MessageToString(config))
            for key in sorted(files):  # in one order whatever order the request's map gave
                _write_file(directory, key, files[key])
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return directory

    def commit(self, name: str, directory: str) -> None:
        """`directory` serves `name` now: the one it served from before is removed."""
        with self._lock:
            previous = self._current.pop(name, None)
            if directory:
                self._current[name] = directory
        if previous and previous != directory:
            shutil.rmtree(previous, ignore_errors=True)

    def discard(self, directory: str) -> None:
        """A directory whose load failed (the model keeps serving from where it did)."""
        shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        """Remove every directory (server shutdown)."""
        with self._lock:
            root, self._root = self._root, None
            self._current.clear()
        if root is not None:
            root.cleanup()


def _write_file(directory: str, key: str, data: bytes) -> None:
    relative = key[len(FILE_PREFIX) :]
    path = os.path.realpath(os.path.join(directory, relative))  # symlinks and '..' resolved, as Triton does
    if not relative or not path.startswith(directory + os.sep):
        raise ServiceError(
            ErrorCode.INVALID_ARG,
            f"Invalid file parameter '{key}' with normalized path '{path}' must stay within model directory.",
        )
    parent = os.path.dirname(path)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise ServiceError(
            ErrorCode.INVALID_ARG, f"Invalid file parameter '{key}', directory has been created as a file"
        )
    try:
        os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:  # e.g. a folder of that name holds other sent files
        raise ServiceError(ErrorCode.INVALID_ARG, f"Invalid file parameter '{key}': {e.strerror}") from None
