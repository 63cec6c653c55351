"""The model repository: scan directories, load model versions (config, workers, scheduler), track states."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protos import model_config_pb2 as mc
from service.core import model_config as cfg
from service.core.autocomplete import run_auto_complete
from service.core.ensemble import LoadBarrier
from service.core.ensemble_graph import step_model_names
from service.core.scheduler import Scheduler
from service.core.stats import ModelStats
from service.core.summaries import SummaryWindow
from service.core.validation import ModelSignature, parse_version, tensor_spec
from service.core.warmup import run_warmup
from service.errors import ErrorCode, ServiceError
from service.workers.backend import visible_gpu_count
from service.workers.pool import InstancePool
from service.workers.process import InstanceSpec

log = logging.getLogger("trireme.repository")

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
KIND_NAMES = {
    mc.ModelInstanceGroup.KIND_CPU: "CPU",
    mc.ModelInstanceGroup.KIND_GPU: "GPU",
    mc.ModelInstanceGroup.KIND_MODEL: "MODEL",
    mc.ModelInstanceGroup.KIND_AUTO: "AUTO",
}


@dataclass(slots=True, eq=False)
class ModelVersion:
    """One loaded (or failed) version of a model."""

    name: str
    version: int
    model_dir: str
    config: mc.ModelConfig
    state: str = LOADING
    reason: str = ""
    signature: ModelSignature | None = None
    pool: InstancePool | None = None
    scheduler: Scheduler | None = None
    stats: ModelStats = field(default_factory=ModelStats)

    @property
    def decoupled(self) -> bool:
        """Whether the model uses the decoupled transaction policy."""
        return self.config.model_transaction_policy.decoupled

    @property
    def streams(self) -> bool:
        """Whether a request may get 0..N responses: decoupled, or an ensemble with a decoupled step."""
        return self.decoupled or bool(getattr(self.scheduler, "streams", False))

    @property
    def ready(self) -> bool:
        """READY and every instance alive."""
        return self.state == READY and (self.scheduler is None or self.scheduler.ready)


@dataclass(slots=True, eq=False)
class ModelEntry:
    """A model directory and the versions loaded from it."""

    name: str
    model_dir: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: str = ""  # a load error that happened before any version existed (config errors)
    state: str = ""  # "" = never loaded


@dataclass(slots=True)
class RepositoryOptions:
    """Server options that change how models are loaded."""

    auto_complete: bool = True
    model_config_name: str = ""
    gpu_count: int = field(default_factory=visible_gpu_count)  # KIND_AUTO -> KIND_GPU when > 0
    log_verbose: int = 0
    arena_bytes: int = 256 << 20
    # called with every worker process started (BLS server: routes the worker's BLS messages)
    attach_worker: Callable[[Any], None] | None = None
    summaries: bool = False  # keep latency samples for Triton's summary metrics (--metrics-config)


SchedulerFactory = Callable[[ModelVersion, "InstancePool | None"], Scheduler]


def numeric_versions(model_dir: str) -> list[int]:
    """Version sub-directories: numeric names not starting with '0', ascending."""
    out = []
    for entry in os.listdir(model_dir):
        if entry.isdigit() and not entry.startswith("0") and os.path.isdir(os.path.join(model_dir, entry)):
            out.append(int(entry))
    return sorted(out)


def select_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """Apply version_policy to the available versions."""
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        return available
    if policy == "specific":
        return [v for v in config.version_policy.specific.versions if v in available]
    n = max(1, config.version_policy.latest.num_versions)
    return available[-n:]


def build_signature(config: mc.ModelConfig) -> ModelSignature:
    """What requests are validated against."""

    def dims(t: Any) -> list[int]:
        return list(t.dims)

    inputs = {t.name: tensor_spec(t.name, mc.DataType.Name(t.data_type), dims(t), t.optional) for t in config.input}
    outputs = {t.name: tensor_spec(t.name, mc.DataType.Name(t.data_type), dims(t)) for t in config.output}
    required = tuple(t.name for t in config.input if not t.optional)
    internal = frozenset(
        [c.name for c in config.sequence_batching.control_input]
        + [s.input_name for s in config.sequence_batching.state]
    )
    return ModelSignature(config.name, config.max_batch_size, inputs, outputs, required, internal)


class ModelRepository:
    """Owns every model entry; loads and unloads versions."""

    def __init__(self, paths: list[str], options: RepositoryOptions, scheduler_factory: SchedulerFactory) -> None:
        self.paths = paths
        self.options = options
        self.scheduler_factory = scheduler_factory
        self.models: dict[str, ModelEntry] = {}
        self._lock = asyncio.Lock()
        self.load_barrier = LoadBarrier()  # ensembles load after the models their steps use

    def scan(self) -> dict[str, str]:
        """Model name -> model directory across all repositories (names must be unique)."""
        found: dict[str, str] = {}
        for root in self.paths:
            if not os.path.isdir(root):
                raise ServiceError(ErrorCode.INVALID_ARG, f"model repository path '{root}' is not a directory")
            for name in sorted(os.listdir(root)):
                path = os.path.join(root, name)
                if not os.path.isdir(path) or name.startswith("."):
                    continue
                if name in found:
                    raise ServiceError(
                        ErrorCode.INVALID_ARG,
                        f"model '{name}' appears in two repositories: '{found[name]}' and '{path}'",
                    )
                found[name] = path
        return found

    async def load_all(self, only: list[str] | None = None) -> None:
        """Scan and load every model (or only the named ones), concurrently."""
        found = await asyncio.get_running_loop().run_in_executor(None, self.scan)
        for name, path in found.items():
            self.models.setdefault(name, ModelEntry(name, path))
        names = [n for n in found if only is None or n in only]
        await asyncio.gather(*(self.load(n) for n in names))

    async def load(self, name: str, config_override: mc.ModelConfig | None = None) -> None:
        """(Re)load a model's versions; failures are recorded in the entry (RepositoryIndex shows them)."""
        entry = self.models.get(name)
        if entry is None:
            found = await asyncio.get_running_loop().run_in_executor(None, self.scan)
            if name not in found:
                raise ServiceError(
                    ErrorCode.NOT_FOUND, f"failed to load '{name}', failed to poll from model repository"
                )
            entry = self.models[name] = ModelEntry(name, found[name])
        old = dict(entry.versions)
        entry.state = LOADING
        try:
            config, versions = await self._prepare_config(entry, config_override)
        except ServiceError as e:
            entry.error, entry.state = e.message, UNAVAILABLE
            log.error("failed to load model '%s': %s", name, e.message)
            self.load_barrier.notify()
            return
        entry.error = ""
        if config.platform == "ensemble":
            await self.load_barrier.wait(
                name, step_model_names(config), lambda n: n in self.models and self.models[n].state == LOADING
            )
        loaded = await asyncio.gather(*(self._load_version(entry, config, v) for v in versions))
        entry.versions = {mv.version: mv for mv in loaded}
        entry.state = READY if any(mv.state == READY for mv in loaded) else UNAVAILABLE
        self.load_barrier.notify()
        for mv in old.values():
            await self._stop_version(mv)

    async def _prepare_config(
        self, entry: ModelEntry, override: mc.ModelConfig | None
    ) -> tuple[mc.ModelConfig, list[int]]:
        loop = asyncio.get_running_loop()
        versions = await loop.run_in_executor(None, numeric_versions, entry.model_dir)
        if override is not None:
            config, path, exists = override, os.path.join(entry.model_dir, "config.pbtxt"), True
        else:
            config, path, exists = await loop.run_in_executor(
                None, cfg.read_config, entry.model_dir, self.options.model_config_name
            )
        cfg.fill_backend(config, entry.model_dir, versions)
        if self.options.auto_complete and config.backend and versions:
            config = await run_auto_complete(
                config, entry.model_dir, os.path.join(entry.model_dir, str(versions[-1])), exists
            )
        elif not exists:
            raise cfg.config_error(path, "model configuration file is missing and auto-complete is disabled")
        cfg.normalize(config, entry.name, self.options.gpu_count)
        cfg.validate(config, entry.name, path)
        if config.platform == "ensemble":
            return config, [1] if not versions else select_versions(config, versions)
        chosen = select_versions(config, versions)
        if not chosen:
            raise cfg.config_error(path, f"no version is available for model '{entry.name}' under its version policy")
        return config, chosen

    async def _load_version(self, entry: ModelEntry, config: mc.ModelConfig, version: int) -> ModelVersion:
        mv = ModelVersion(entry.name, version, entry.model_dir, config)
        mv.signature = build_signature(config)
        mv.stats.decoupled = mv.decoupled
        if self.options.summaries:
            mv.stats.summaries = SummaryWindow()
        started = time.monotonic()
        try:
            pool = None
            if config.platform != "ensemble":
                pool = InstancePool(self._instance_specs(mv))
                await pool.start()
                if config.model_warmup:
                    try:
                        await run_warmup(config, mv.model_dir, str(version), pool)
                    except BaseException:
                        await pool.stop()
                        raise
            mv.pool = pool
            mv.scheduler = self.scheduler_factory(mv, pool)
            mv.state = READY
            mv.stats.load_duration_s = time.monotonic() - started
            log.info("loaded model '%s' version %d", entry.name, version)
        except ServiceError as e:
            mv.state, mv.reason = UNAVAILABLE, e.message
            log.error("failed to load model '%s' version %d: %s", entry.name, version, e.message)
        except Exception as e:
            mv.state, mv.reason = UNAVAILABLE, f"{type(e).__name__}: {e}"
            log.exception("failed to load model '%s' version %d", entry.name, version)
        return mv

    def _instance_specs(self, mv: ModelVersion) -> list[InstanceSpec]:
        config = mv.config
        config_json = cfg.to_json(config)
        specs = []
        for group in config.instance_group:
            kind = KIND_NAMES.get(group.kind, "CPU")
            if kind == "GPU" and not group.gpus:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f"instance group {group.name} of model {mv.name} has kind KIND_GPU but no GPUs are available",
                )
            for gpu in group.gpus if kind == "GPU" else []:
                if not 0 <= gpu < self.options.gpu_count:
                    raise ServiceError(
                        ErrorCode.INVALID_ARG,
                        f"instance group {group.name} of model {mv.name} specifies invalid or unsupported gpu id "
                        f"{gpu}. GPUs with at least the minimum required CUDA compute compatibility of 6.0 are: "
                        + ", ".join(str(g) for g in range(self.options.gpu_count)),
                    )
            if kind in ("CPU", "MODEL") and group.gpus:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f"instance group {group.name} of model {mv.name} has kind KIND_{kind} but specifies one or "
                    "more GPUs",
                )
            devices = list(group.gpus) if kind == "GPU" else [0]
            for device in devices:
                for k in range(group.count):
                    specs.append(
                        InstanceSpec(
                            backend=config.backend,
                            model_name=mv.name,
                            model_version=str(mv.version),
                            model_dir=mv.model_dir,
                            version_dir=os.path.join(mv.model_dir, str(mv.version)),
                            config_json=config_json,
                            instance_name=f"{group.name}_{k}" if kind != "GPU" else f"{group.name}_{device}_{k}",
                            instance_kind=kind,
                            device_id=device,
                            arena_bytes=self.options.arena_bytes,
                            log_verbose=self.options.log_verbose,
                            attach=self.options.attach_worker,
                        )
                    )
        return specs

    async def unload(self, name: str) -> None:
        """Unload every version of a model (in-flight requests finish first)."""
        entry = self.models.get(name)
        if entry is None or not entry.versions:
            raise ServiceError(ErrorCode.INVALID_ARG, f"failed to unload '{name}', model has not been served")
        versions, entry.versions = entry.versions, {}
        entry.state = UNAVAILABLE
        for mv in versions.values():
            mv.state = UNLOADING
            await self._stop_version(mv)
        entry.versions = {
            v: ModelVersion(name, v, entry.model_dir, mv.config, UNAVAILABLE, "unloaded") for v, mv in versions.items()
        }

    async def _stop_version(self, mv: ModelVersion) -> None:
        if mv.scheduler is not None:
            await mv.scheduler.stop()
        if mv.pool is not None:
            await mv.pool.stop()

    async def stop(self) -> None:
        """Unload everything."""
        await asyncio.gather(
            *(self._stop_version(mv) for e in self.models.values() for mv in e.versions.values()),
            return_exceptions=True,
        )

    # ---- lookup -----------------------------------------------------------------------------------------
    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version a request targets; Triton's NOT_FOUND / UNAVAILABLE errors otherwise."""
        entry = self.models.get(name)
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
        ready = [mv for mv in entry.versions.values() if mv.state == READY]
        if not ready:
            raise ServiceError(ErrorCode.UNAVAILABLE, f"Request for unknown model: '{name}' has no available versions")
        return max(ready, key=lambda mv: mv.version)
