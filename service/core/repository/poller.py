"""Poll mode: rescan the model repositories every `--repository-poll-secs` and load, reload or remove models.

A model is looked at again when its files change: the snapshot of a model directory is the (path, size,
modification time) of every file in it, split into the files outside version folders (config, labels) and
each version folder's own. Python byte-code caches and hidden files (editor swap files) are ignored, so
loading a model does not make it look changed. A load that failed is not retried until the files change again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from service.errors import ServiceError

if TYPE_CHECKING:
    from service.core.repository.repository import ModelRepository

log = logging.getLogger("trireme.poller")

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


class RepositoryPoller:
    """The background task of poll mode; owned by the server (`start`/`stop`)."""

    def __init__(self, repository: ModelRepository, interval_s: float) -> None:
        self.repository = repository
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin polling every interval_s seconds."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop polling (a poll in progress is cancelled between model loads)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except ServiceError as e:
                log.error("repository poll failed: %s", e.message)
            except Exception:
                log.exception("repository poll failed")

    async def poll_once(self) -> None:
        """Compare the repositories with what is loaded and apply the differences."""
        repo = self.repository
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, repo.scan)
        snaps = await loop.run_in_executor(None, lambda: {n: snapshot(p) for n, p in found.items()})
        removed = [n for n in repo.models if n not in found]
        changed = [n for n in found if n not in repo.models or repo.models[n].seen != snaps[n]]
        for name in removed:
            log.info("model directory '%s' was removed: unloading it", name)
        await asyncio.gather(*(repo.remove(n) for n in removed))
        for name in changed:
            log.info("model directory '%s' changed: loading it", name)
        await asyncio.gather(*(repo.load(n, found_path=found[n]) for n in changed))
