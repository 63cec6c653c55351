"""The model repository: scan directories, load, reload and unload model versions, track their states.

A (re)load never takes a serving version down before its replacement is READY: new versions start, warm up and
are swapped in at once; versions that leave are drained (requests already accepted finish there) and then
finalized. A version whose files and config are unchanged is kept; one whose config differs only in its
instance groups is updated in place (only the instances that differ start or stop). A reload that fails leaves
the serving version in place and reports the error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from protos import model_config_pb2 as mc
from service.config.groups.repository_flags import LoadingOptions
from service.config.host_policy import HostPolicy
from service.core.observability.summaries import SummaryWindow
from service.core.repository.agents.chain import RepoAgents
from service.core.repository.instance_plan import update_instances
from service.core.repository.loading.namespaces import ambiguous, scan_namespaced
from service.core.repository.loading.plan import plan_load
from service.core.repository.loading.preparation import ConfigPreparation
from service.core.repository.loading.slots import LoadSlots
from service.core.repository.loading.unloading import Unloading
from service.core.repository.model_version import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADING,
    ModelEntry,
    ModelVersion,
)
from service.core.repository.signature import parse_version
from service.core.repository.snapshots import ModelFiles, snapshot
from service.core.repository.storage.mirror import RemoteRepositories
from service.core.repository.versions import build_signature, scan_repositories
from service.core.repository.warmup import run_warmup
from service.core.scheduling.ensemble import LoadBarrier
from service.core.scheduling.ensemble_graph import step_model_names
from service.core.scheduling.scheduler import Scheduler
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool
from service.ipc.devices import visible_gpu_count

log = logging.getLogger("trireme.repository")


@dataclass(slots=True)
class RepositoryOptions:
    """Server options that change how models are loaded."""

    auto_complete: bool = True
    model_config_name: str = ""
    gpu_count: int = field(default_factory=visible_gpu_count)  # KIND_AUTO -> KIND_GPU when > 0
    log_verbose: int = 0
    arena_bytes: int = 256 << 20
    arena_growth_bytes: int = 64 << 20
    arena_reserve: bool = False  # reserve each arena's pages when created (/dev/shm is tight: repository/shm_plan.py)
    summaries: bool = False  # keep latency samples for Triton's summary metrics (--metrics-config)
    unload_timeout_s: float = 30.0  # how long an unload (or a replaced version) waits for in-flight requests
    backend_directory: str = ""  # --backend-directory: where Python-based backends are found (DIR/<name>/model.py)
    host_policies: dict[str, HostPolicy] = field(default_factory=dict)  # --host-policy, by name
    loading: LoadingOptions = field(default_factory=LoadingOptions)  # load threads and retries, namespacing, agents
    # called with every worker process started (BLS server: routes the worker's BLS messages)
    attach_worker: Callable[[Any], None] | None = None


SchedulerFactory = Callable[[ModelVersion, "InstancePool | None"], Scheduler]


class ModelRepository(ConfigPreparation, Unloading):
    """Owns every model entry; loads, reloads and unloads versions (configs and specs: loading/preparation.py;
    unloading and draining: loading/unloading.py)."""

    def __init__(self, paths: list[str], options: RepositoryOptions, scheduler_factory: SchedulerFactory) -> None:
        self.paths = paths
        self.storage = RemoteRepositories(paths)  # s3:// gs:// as://: local copies (storage/); local paths as given
        self.options = options
        self.scheduler_factory = scheduler_factory
        self.models: dict[str, ModelEntry] = {}
        self.load_barrier = LoadBarrier()  # ensembles load after the models their steps use
        self._leaving: set[ModelVersion] = set()  # versions out of routing, draining (stopped by stop() too)
        self.slots = LoadSlots(options.loading.load_thread_count, options.loading.load_retry_count)
        self.agents = RepoAgents(options.loading.repoagent_directory)  # model_repository_agents
        self.shared: dict[str, list[str]] = {}  # --model-namespacing: name -> keys of the models sharing it

    def scan(self) -> dict[str, str]:
        """Model key -> model directory across all repositories (blocking); remote ones are synced first. The key
        is the model's name, or with --model-namespacing, its folder when several repositories hold that name
        (loading/namespaces.py)."""
        self.storage.sync()
        paths = self.storage.local_paths
        if not self.options.loading.namespacing:
            return scan_repositories(paths)
        found, self.shared = scan_namespaced(paths)
        return found

    def entry(self, name: str) -> ModelEntry | None:
        """The model of that name (None: unknown); Triton's ambiguity error for a name several namespaces hold."""
        found = self.models.get(name)
        if found is None and name in self.shared:
            raise ambiguous(name, self.shared[name])
        return found

    async def load_all(self, only: list[str] | None = None) -> None:
        """Scan and load every model (or only the named ones), concurrently."""
        found = await asyncio.get_running_loop().run_in_executor(None, self.scan)
        for name, path in found.items():
            self.models.setdefault(name, ModelEntry(os.path.basename(path), path))
        names = [n for n in found if only is None or self.models[n].name in only]
        for n in names:  # LOADING before any load starts, so an ensemble loading beside them waits for them
            entry = self.models[n]
            if not any(mv.state == READY for mv in entry.versions.values()):
                entry.state = LOADING
        await asyncio.gather(*(self.load(n, found_path=found[n]) for n in names))

    # ---- load / reload ----------------------------------------------------------------------------------
    async def load(
        self, name: str, config_override: mc.ModelConfig | None = None, found_path: str = "", sent_dir: str = ""
    ) -> tuple[str, list[str]]:
        """(Re)load a model: returns (config error, version errors), "" and [] when it all went well.

        Errors are also logged and recorded for RepositoryIndex. `sent_dir`: a directory of files the load
        request carried, which the model serves from instead of its repository folder; a later load without one
        reads the repository again.

        Versions that serve keep serving until their replacement is READY, and keep serving if it fails.
        """
        entry = self.models.get(name)
        if entry is None:
            if not (found_path or sent_dir):
                found = await self._poll_storage(name, self.scan)
                if name not in found and name in self.shared:  # load every model of that name
                    return await self._load_shared(name, config_override)
                if name not in found:
                    raise ServiceError(
                        ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository"
                    )
                found_path = found[name]
            # a namespaced key is the model's folder (--model-namespacing): the model's name is the folder's
            entry_name = os.path.basename(name) if os.sep in name else name
            entry = self.models.setdefault(name, ModelEntry(entry_name, found_path or sent_dir))
        elif not (found_path or sent_dir or entry.from_request) and self.storage.mirrors:  # its remote folder's news
            await self._poll_storage(name, partial(self.storage.sync, entry.model_dir))
        async with entry.lock:
            if sent_dir:
                entry.model_dir, entry.from_request = sent_dir, True
            elif entry.from_request:  # a load without files reads the repository again
                entry.model_dir, entry.from_request = await self._repository_path(name), False
            try:
                return await self._load_locked(entry, config_override)
            finally:
                self.load_barrier.notify()

    async def _repository_path(self, name: str) -> str:
        found = await self._poll_storage(name, self.scan)
        if name not in found:
            raise ServiceError(ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository")
        return found[name]

    async def _load_shared(self, name: str, override: mc.ModelConfig | None) -> tuple[str, list[str]]:
        results = await asyncio.gather(*(self.load(key, override, key) for key in self.shared[name]))
        return "; ".join(c for c, _ in results if c), [e for _, errors in results for e in errors]

    async def _poll_storage(self, name: str, poll: Callable[[], Any]) -> Any:
        """Run a scan or sync for a load request; a remote repository's failure names the model and the URL."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, poll)
        except ServiceError as e:
            if not self.storage.mirrors:
                raise
            raise ServiceError(
                ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository: {e.message}"
            ) from None

    async def _load_locked(self, entry: ModelEntry, override: mc.ModelConfig | None) -> tuple[str, list[str]]:
        loop = asyncio.get_running_loop()
        files = await loop.run_in_executor(None, snapshot, entry.model_dir)
        entry.seen = files
        serving = {v: mv for v, mv in entry.versions.items() if mv.state == READY}
        if not serving:
            entry.state = LOADING
        try:
            config, chosen = await self._prepare_config(entry, override)
        except ServiceError as e:
            log.error("failed to load '%s': %s", entry.name, e.message, extra={"model": entry.name})
            await self.agents.run(self.agents.finish_load, entry.model_dir, False)
            if serving:  # the serving versions stay; the error shows on them
                entry.state = READY
                for mv in serving.values():
                    mv.reason = f"reload failed, still serving the previous version: {e.message}"
            else:
                entry.error, entry.state = e.message, UNAVAILABLE
            return e.message, []
        entry.error = ""
        if config.platform == "ensemble":
            await self.load_barrier.wait(
                entry.name,
                step_model_names(config),
                lambda n: n in self.models and (self.models[n].state == LOADING or self.models[n].lock.locked()),
            )
        plan = plan_load(entry, config, chosen, serving, files)
        for v in plan.start:
            if v not in serving:  # a new version shows LOADING while it starts
                entry.versions[v] = ModelVersion(entry.name, v, entry.load_dir, config)
        started = await asyncio.gather(*(self._start_version(entry, config, v, files) for v in plan.start))
        updated = await asyncio.gather(
            *(
                update_instances(mv, config, partial(self._instance_specs, mv, config), self.options.unload_timeout_s)
                for mv in plan.update.values()
            )
        )
        errors = [e for e in updated if e]
        # the switch: one assignment, so a request sees either the old set of versions or the new one
        versions = {v: mv for v, mv in entry.versions.items() if v not in chosen and mv.state != READY}
        versions.update(plan.keep)
        versions.update(plan.update)
        for mv in [*plan.keep.values(), *plan.update.values()]:
            if not mv.reason.startswith("update failed"):
                mv.reason = ""
        replaced = []
        for mv in started:
            old = serving.get(mv.version)
            if mv.state == READY:
                versions[mv.version] = mv
                if old is not None:
                    replaced.append(old)
            else:
                errors.append(f"version {mv.version} is at UNAVAILABLE state: {mv.reason}")
                if old is not None:
                    old.reason = f"reload failed, still serving the previous version: {mv.reason}"
                versions[mv.version] = old if old is not None else mv
        for mv in plan.leave:
            mv.state = UNLOADING
            versions[mv.version] = mv
        for mv in replaced:
            mv.state = UNLOADING
        entry.versions = dict(sorted(versions.items()))
        entry.model_files = files.model_level
        entry.state = READY if any(mv.state == READY for mv in versions.values()) else UNAVAILABLE
        self.load_barrier.notify()
        if not errors:
            log.info("successfully loaded '%s'", entry.name, extra={"model": entry.name})
        await asyncio.gather(*(self._retire(mv) for mv in [*replaced, *plan.leave]))
        ok = all(mv.state == READY for mv in started)
        await self.agents.run(self.agents.finish_load, entry.model_dir, ok, bool(started))
        return "", errors

    async def _start_version(
        self, entry: ModelEntry, config: mc.ModelConfig, version: int, files: ModelFiles
    ) -> ModelVersion:
        what = f"'{entry.name}' version {version}"
        return await self.slots.run(partial(self._create_version, entry, config, version, files), what)

    async def _create_version(
        self, entry: ModelEntry, config: mc.ModelConfig, version: int, files: ModelFiles
    ) -> ModelVersion:
        log.info("loading: %s:%d", entry.name, version, extra={"model": entry.name})
        mv = ModelVersion(entry.name, version, entry.load_dir, config, files=files.versions.get(version, ()))
        mv.signature = build_signature(config)
        mv.stats.decoupled = mv.decoupled
        if self.options.summaries:
            mv.stats.summaries = SummaryWindow()
        started = time.monotonic()
        try:
            pool = None
            mv.exec_env = await self._exec_env(config, mv.model_dir, version)
            if config.platform != "ensemble":
                pool = InstancePool(self._instance_specs(mv, config))
                await pool.start()
                if config.model_warmup:
                    try:
                        await run_warmup(config, mv.model_dir, str(version), pool)
                    except BaseException:
                        await pool.stop()
                        raise
            mv.pool = pool
            try:
                mv.scheduler = self.scheduler_factory(mv, pool)
            except BaseException:
                if pool is not None:
                    await pool.stop()
                raise
            mv.state = READY
            mv.stats.load_duration_s = time.monotonic() - started
        except ServiceError as e:
            mv.state, mv.reason = UNAVAILABLE, e.message
            log.error("failed to load '%s' version %d: %s", entry.name, version, e.message, extra={"model": entry.name})
        except Exception as e:
            mv.state, mv.reason = UNAVAILABLE, f"{type(e).__name__}: {e}"
            log.exception("failed to load '%s' version %d", entry.name, version)
        return mv

    # ---- lookup -----------------------------------------------------------------------------------------
    def ready_versions(self) -> list[tuple[dict[str, str], ModelVersion]]:
        """(labels, model version) of every READY version, sorted by model name and version (metrics scrapes)."""
        out = []
        for entry in sorted(self.models.values(), key=lambda e: e.name):
            for v, mv in sorted(entry.versions.items()):
                if mv.state == READY:
                    out.append(({"model": entry.name, "version": str(v)}, mv))
        return out

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version a request targets; Triton's NOT_FOUND / UNAVAILABLE errors otherwise."""
        entry = self.models.get(name)
        if entry is None and name in self.shared:
            raise ambiguous(name, self.shared[name])
        if entry is None or (not entry.versions and not entry.error):
            raise ServiceError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if version:
            v = parse_version(version)
            mv = entry.versions.get(v)
            if mv is None:
                raise ServiceError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' version {v} is not found")
            if mv.state != READY:
                raise ServiceError(
                    ErrorCode.UNAVAILABLE,
                    f"Request for unknown model: '{name}' version {v} is not at ready state",
                )
            return mv
        best: ModelVersion | None = None  # the highest READY version (a plain loop: this runs per request)
        for mv in entry.versions.values():
            if mv.state == READY and (best is None or mv.version > best.version):
                best = mv
        if best is None:
            raise ServiceError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' has no available versions")
        return best
