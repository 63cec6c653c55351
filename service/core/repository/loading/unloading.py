"""How model versions leave: an unload (new requests refused at once, requests in flight finish, bounded by the
unload timeout), a replaced version's drain, the instances' finalize, and the server's stop. The part of
ModelRepository that takes versions down, kept beside it as a mixin."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from service.core.repository.agents.chain import RepoAgents
from service.core.repository.model_version import READY, UNAVAILABLE, UNLOADED, UNLOADING, ModelEntry, ModelVersion
from service.core.repository.storage.mirror import RemoteRepositories
from service.core.scheduling.scheduler import InstanceScheduler

log = logging.getLogger("trireme.repository")

FINALIZE_TIMEOUT_S = 10.0  # how long an idle instance's finalize() may take before it is killed


class Unloading:
    """Mixin of ModelRepository (which sets these attributes)."""

    options: Any  # RepositoryOptions
    agents: RepoAgents
    shared: dict[str, list[str]]
    models: dict[str, ModelEntry]
    storage: RemoteRepositories
    _leaving: set[ModelVersion]  # versions out of routing, draining (stopped by stop() too)

    async def unload(self, name: str) -> None:
        """Unload every version of a model: new requests are refused at once, in-flight ones finish first.

        Unloading a model that is not loaded (or not known) does nothing, as in Triton.
        """
        entry = self.models.get(name)
        if entry is None:
            await asyncio.gather(*(self.unload(key) for key in self.shared.get(name, [])))
            return
        async with entry.lock:
            leaving = [mv for mv in entry.versions.values() if mv.state == READY]
            for mv in leaving:
                mv.state = UNLOADING
            entry.state = UNLOADING if leaving else entry.state
            await self.agents.run(self.agents.unload_begin, entry.model_dir)
            await asyncio.gather(*(self._retire(mv) for mv in leaving))
            await self.agents.run(self.agents.unload_end, entry.model_dir)
            for mv in entry.versions.values():
                mv.state, mv.reason = UNAVAILABLE, UNLOADED
            entry.state = UNAVAILABLE if entry.versions else ""
            entry.seen = None

    async def remove(self, name: str) -> None:
        """The model's directory is gone (poll mode): unload it and forget it."""
        await self.unload(name)
        entry = self.models.get(name)
        if entry is not None and not entry.lock.locked():
            del self.models[name]

    async def _retire(self, mv: ModelVersion) -> None:
        """Drain a version that is out of routing (bounded by the unload timeout), then finalize its instances."""
        self._leaving.add(mv)
        timeout = self.options.unload_timeout_s
        try:
            drained = mv.scheduler is None or await mv.scheduler.drain(timeout)
            if not drained:
                log.warning(
                    "'%s' version %d still had requests in flight after %g s; stopping it anyway",
                    mv.name,
                    mv.version,
                    timeout,
                )
            await self._stop_version(
                mv,
                f"model '{mv.name}' version {mv.version} was unloaded before the request finished "
                f"(unload timeout {timeout:g} s)",
                FINALIZE_TIMEOUT_S if drained else 1.0,  # busy past the timeout: stop it now
            )
        finally:
            self._leaving.discard(mv)
        if mv.state == UNLOADING:
            mv.state, mv.reason = UNAVAILABLE, UNLOADED
        log.info("successfully unloaded '%s' version %d", mv.name, mv.version, extra={"model": mv.name})

    async def _stop_version(self, mv: ModelVersion, reason: str = "", timeout_s: float = FINALIZE_TIMEOUT_S) -> None:
        if mv.scheduler is not None:
            if isinstance(mv.scheduler, InstanceScheduler):
                mv.scheduler.leave_rate_limiter()
            await mv.scheduler.stop()
        if mv.pool is not None:
            await mv.pool.stop(timeout_s, reason)

    async def stop(self) -> None:
        """Unload everything."""
        mvs = {mv for e in self.models.values() for mv in e.versions.values()} | self._leaving
        await asyncio.gather(*(self._stop_version(mv) for mv in mvs), return_exceptions=True)
        await self.agents.run(self.agents.unload_all)
        self.storage.close()
