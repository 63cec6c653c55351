"""What scheduling sees of the layers above it: a model version and the engine an ensemble submits its steps to.

Scheduling sits below the repository (which builds schedulers) and the engine (which feeds them), so it names
them by these protocols instead of importing them; `ModelVersion` and `Engine` satisfy them.
"""

from __future__ import annotations

from typing import Any, Protocol

from protos import model_config_pb2 as mc
from service.core.observability.stats import ModelStats
from service.types import InferRequest, ResponseCallback


class ModelView(Protocol):
    """A loaded model version (service.core.repository.repository.ModelVersion)."""

    name: str
    model_dir: str
    config: mc.ModelConfig
    stats: ModelStats

    @property
    def streams(self) -> bool: ...
    @property
    def ready(self) -> bool: ...


class ModelLookup(Protocol):
    """The repository's `get`."""

    def get(self, name: str, version: str = "") -> ModelView: ...


class StepRunner(Protocol):
    """What an ensemble submits its steps to (service.core.engine.Engine)."""

    @property
    def repository(self) -> ModelLookup: ...
    def submit(self, request: InferRequest, on_response: ResponseCallback) -> ModelView: ...
    def cancel(self, request: InferRequest, mv: Any) -> None: ...
