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

from service.core.repository.repository import ModelRepository
from service.core.repository.snapshots import snapshot
from service.errors import ServiceError

log = logging.getLogger("trireme.poller")


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
