"""A model version (its config, state, instances, scheduler and statistics) and a model directory's versions:
the records the repository keeps and every other part of the core reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from protos import model_config_pb2 as mc
from service.core.observability.stats import ModelStats
from service.core.repository.signature import ModelSignature
from service.core.repository.snapshots import ModelFiles
from service.core.scheduling.scheduler import Scheduler
from service.instances.pool import InstancePool

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
UNLOADED = "unloaded"


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
    files: tuple[Any, ...] = ()  # the version folder's files when it was loaded (change detection)
    exec_env: Any = None  # the Python execution environment its workers run in (instances/envs), None = ours

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
    seen: ModelFiles | None = None  # the files at the last load attempt (poll mode reloads when they change)
    model_files: tuple[Any, ...] = ()  # files outside version folders (labels, ...) of the serving versions
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one load / unload of this model at a time
    from_request: bool = False  # model_dir holds files a load request sent (ModelFileDirs), not a repository's
    location: str = ""  # where the current load reads the model from (a repository agent's folder), "" = model_dir

    @property
    def load_dir(self) -> str:
        """The folder versions are loaded from: a repository agent's location, else the model's folder."""
        return self.location or self.model_dir
