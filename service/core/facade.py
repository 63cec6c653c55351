"""The façade surface the gRPC and HTTP front ends use: `Engine` (core/engine.py) satisfies it in one process,
`RemoteEngine` (service/remote/client.py) in a front-end process (--frontend-processes N >= 2)."""

from __future__ import annotations

from typing import Any, Protocol

from protos import model_config_pb2 as mc
from service.core.engine import IndexEntry, ModelMetadata
from service.core.observability.log_settings import LogValue
from service.core.observability.stats import ModelStats
from service.core.observability.tracer import Tracer
from service.types import InferRequest, InferResponse, ResponseCallback


class Submitted(Protocol):
    """What a front end reads of the model version a submitted request went to."""

    @property
    def streams(self) -> bool: ...

    @property
    def decoupled(self) -> bool: ...


class LogSettingsApi(Protocol):
    """The log settings extension."""

    def update(self, changes: dict[str, LogValue]) -> None: ...

    def as_dict(self) -> dict[str, LogValue]: ...


class Facade(Protocol):
    """Everything the gRPC and HTTP front ends ask of the server."""

    @property
    def live(self) -> bool: ...

    @property
    def tracer(self) -> Tracer: ...

    @property
    def shm_registry(self) -> Any: ...

    @property
    def log_settings(self) -> LogSettingsApi: ...

    def server_ready(self) -> bool: ...

    def server_metadata(self) -> tuple[str, str, list[str]]: ...

    async def model_ready(self, name: str, version: str = "") -> bool: ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig: ...

    def is_decoupled(self, name: str, version: str = "") -> bool: ...

    def statistics(self, name: str = "", version: str = "") -> list[tuple[str, str, ModelStats]]: ...

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]: ...

    def trace_setting(self, model_name: str = "", updates: dict[str, list[str] | None] | None = None) -> dict: ...

    def client_shm(self) -> Any: ...

    async def load_model(self, name: str, config_json: str = "", files: dict[str, bytes] | None = None) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def submit(self, request: InferRequest, on_response: ResponseCallback) -> Submitted: ...

    def cancel(self, request: InferRequest, mv: Any) -> None: ...
