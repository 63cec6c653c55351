"""Model-directory snapshots: what poll mode compares to decide a model changed.

The snapshot of a model directory is the (path, size, modification time) of every file in it, split into the
files outside version folders (config, labels) and each version folder's own. Python byte-code caches and hidden
files (editor swap files) are ignored, so loading a model does not make it look changed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

FileList = tuple[tuple[str, int, int], ...]
CONFIG_FILES = ("config.pbtxt", "configs")  # judged by comparing the parsed configs, not their bytes


def _ignored(name: str) -> bool:
    return name.startswith(".") or name == "__pycache__" or name.endswith(("~", ".pyc"))


def _files(root: str, skip: frozenset[str] = frozenset()) -> FileList:
    """(relative path, size, mtime_ns) of every file under root, sorted."""
    out = []
    for directory, dirs, names in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        dirs[:] = [d for d in dirs if not _ignored(d) and not (rel_dir == "." and d in skip)]
        for name in names:
            if _ignored(name) or (rel_dir == "." and name in skip):
                continue
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                out.append((os.path.normpath(os.path.join(rel_dir, name)), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


@dataclass(slots=True, frozen=True)
class ModelFiles:
    """What a model directory holds, for change detection."""

    model_level: FileList = ()  # files outside version folders, config files excluded
    versions: dict[int, FileList] = field(default_factory=dict)
    config: FileList = ()  # the config files themselves (a change here means: parse and compare)


def snapshot(model_dir: str) -> ModelFiles:
    """The ModelFiles of a model directory (blocking: call from an executor)."""
    versions: dict[int, FileList] = {}
    skip = set(CONFIG_FILES)
    try:
        entries = os.listdir(model_dir)
    except OSError:
        return ModelFiles()
    for entry in entries:
        path = os.path.join(model_dir, entry)
        if entry.isdigit() and os.path.isdir(path):
            skip.add(entry)
            if not entry.startswith("0"):
                versions[int(entry)] = _files(path)
    config: list[tuple[str, int, int]] = []
    with contextlib.suppress(OSError):
        st = os.stat(os.path.join(model_dir, "config.pbtxt"))
        config.append(("config.pbtxt", st.st_size, st.st_mtime_ns))
    config += [(os.path.join("configs", f), n, t) for f, n, t in _files(os.path.join(model_dir, "configs"))]
    return ModelFiles(_files(model_dir, frozenset(skip)), versions, tuple(config))
