"""The inference façade both frontends call: infer, stream submission, metadata, config, readiness, stats."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from protos import model_config_pb2 as mc
from service import __version__
from service.core.observability.llm_metrics import LlmMetrics
from service.core.observability.log_settings import LogSettings
from service.core.observability.otel_export import OtelExporter
from service.core.observability.stats import ModelStats
from service.core.observability.trace_settings import OtelSettings, TraceSettings
from service.core.observability.tracer import Tracer
from service.core.pipeline.admission import Admission
from service.core.pipeline.cache_gate import CacheGate
from service.core.pipeline.callbacks import Classifier, admitted, traced
from service.core.pipeline.shm_holds import ShmHolds
from service.core.pipeline.validation import check_model_name, validate_request
from service.core.repository.override import ModelFileDirs
from service.core.repository.reports import model_statistics, repository_index
from service.core.repository.repository import READY, ModelRepository, ModelVersion
from service.core.scheduling.ensemble_graph import step_model_names
from service.errors import ErrorCode, ServiceError
from service.types import IndexEntry, InferRequest, InferResponse, ModelMetadata, ResponseCallback, TensorMetadata

SERVER_NAME = "triton"  # clients (and perf_analyzer) expect Triton's name
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",
    "trace",
]


class Engine:
    """Everything a frontend may ask of the server, with no knowledge of gRPC or HTTP."""

    def __init__(
        self,
        repository: ModelRepository,
        shm_registry: Any = None,
        strict_readiness: bool = True,
        admission: Admission | None = None,
    ) -> None:
        self.repository = repository
        self.model_files = ModelFileDirs()  # files sent with load requests
        # in-flight bounds; None when no bound is configured (no bookkeeping on the hot path then)
        self.admission = admission if admission is not None and admission.enabled else None
        self.shm_registry = shm_registry
        # shm regions held by requests between prepare() and their final response
        self.shm_holds = ShmHolds(shm_registry, repository)
        self.strict_readiness = strict_readiness
        self.live = True
        self.accepting = True
        self.model_control_mode = "none"  # "none" | "poll" | "explicit" (set by the server)
        self.log_settings = LogSettings()
        self.classifier = Classifier()
        self.cache_gate: CacheGate | None = None  # set by enable_response_cache (--cache-config)
        self.tracer = Tracer(TraceSettings(), known_model=lambda name: name in repository.models)
        self.llm_metrics = LlmMetrics()  # token metrics the OpenAI front end records

    def configure_tracing(self, settings: TraceSettings, otel: OtelSettings) -> None:
        """Trace requests as --trace-config says (tracing is off until then)."""
        self.tracer = Tracer(settings, otel, known_model=self.tracer.known_model, make_exporter=OtelExporter)

    def enable_response_cache(self, budget_bytes: int) -> None:
        """Answer repeated requests of models with `response_cache { enable: true }` from a local cache."""
        from service.core.pipeline.response_cache import ResponseCache

        self.cache_gate = CacheGate(ResponseCache(budget_bytes), self.shm_holds.input_bytes)

    def enable_redis_cache(self, settings: Any) -> None:
        """The same cache in a Redis server (--cache-config redis,...; a RedisSettings), shared by replicas."""
        from service.core.pipeline.redis_cache import RedisResponseCache

        cache = RedisResponseCache(settings)
        cache.check()
        self.cache_gate = CacheGate(cache, self.shm_holds.input_bytes)

    # ---- model control ----------------------------------------------------------------------------------
    def _require_explicit(self) -> None:
        if self.model_control_mode != "explicit":
            raise ServiceError(
                ErrorCode.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled"
            )

    async def load_model(self, name: str, config_json: str = "", files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model in explicit mode; `config_json` overrides its config.pbtxt, and `files`
        ({"file:<version>/<name>": content}, with a config) stand in for its repository folder.

        A reload keeps the serving version until the new one is READY; if the new one fails, the old one keeps
        serving and the error is returned (and shown in the repository index).
        """
        self._require_explicit()
        check_model_name(name)
        sent_dir = ""
        if files:
            sent_dir = await asyncio.get_running_loop().run_in_executor(
                None, self.model_files.write, name, config_json, files
            )
        try:
            await self._load(name, config_json, sent_dir)
        except BaseException:
            entry = self.repository.models.get(name)
            if sent_dir and not (entry and any(mv.model_dir == sent_dir for mv in entry.versions.values())):
                self.model_files.discard(sent_dir)  # nothing serves from it
                raise
            self.model_files.commit(name, sent_dir)
            raise
        self.model_files.commit(name, sent_dir)

    async def _load(self, name: str, config_json: str, sent_dir: str) -> None:
        override = None
        if config_json:
            from service.core.repository.model_config import from_json

            try:
                override = from_json(config_json)
            except ValueError as e:
                raise ServiceError(ErrorCode.INVALID_ARG, f"failed to load '{name}': invalid 'config': {e}") from None
        config_error, errors = await self.repository.load(name, override, sent_dir=sent_dir)
        if config_error:
            raise ServiceError(ErrorCode.INVALID_ARG, f"failed to load '{name}', {config_error}")
        if errors:
            raise ServiceError(
                ErrorCode.INVALID_ARG, f"load failed for model '{name}': " + "".join(f"{e};\n" for e in errors)
            )

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload every version of a model in explicit mode; with `unload_dependents`, an ensemble's composing
        models too (as Triton's unload_dependents).

        New requests are refused at once; requests already accepted finish (bounded by the unload timeout),
        then the instances are finalized. Unloading a model that is not loaded succeeds, as in Triton.
        """
        self._require_explicit()
        check_model_name(name, is_path=False)
        steps: list[str] = []
        entry = self.repository.models.get(name)
        if unload_dependents and entry is not None:
            for mv in entry.versions.values():
                if mv.config.platform == "ensemble":
                    steps += [s for s in step_model_names(mv.config) if s not in steps]
        await self.repository.unload(name)
        for step in steps:
            await self.repository.unload(step)

    async def load_model_at(self, name: str, model_dir: str) -> None:
        """Load the model in `model_dir` under `name` (Triton's registered repository with a name mapping, used
        by SageMaker's multi-model endpoint); ALREADY_EXISTS when `name` is known already."""
        self._require_explicit()
        check_model_name(name)
        if name in self.repository.models:
            raise ServiceError(ErrorCode.ALREADY_EXISTS, f"model '{name}' already exists")
        config_error, errors = await self.repository.load(name, None, model_dir)
        if config_error or errors:
            await self.forget_model(name)
            detail = config_error or "".join(f"{e};\n" for e in errors)
            raise ServiceError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': {detail}")

    async def forget_model(self, name: str) -> None:
        """Unload a model loaded by load_model_at and drop it from the repository (unregistering its folder)."""
        await self.repository.remove(name)

    # ---- health and metadata ----------------------------------------------------------------------------
    def server_ready(self) -> bool:
        """Ready when accepting and (strict) every model version that should be loaded is READY."""
        if not self.live or not self.accepting:
            return False
        if not self.strict_readiness:
            return True
        for entry in self.repository.models.values():
            if entry.error and entry.state != "":
                return False
            for mv in entry.versions.values():
                if mv.reason != "unloaded" and not mv.ready:
                    return False
        return True

    def server_metadata(self) -> tuple[str, str, list[str]]:
        """(name, version, extensions)."""
        return SERVER_NAME, __version__, list(EXTENSIONS)

    async def model_ready(self, name: str, version: str = "") -> bool:
        """True if that version (or some version) is ready; NOT_FOUND for unknown models.

        Ready also needs every instance's own readiness check to agree (a Python model's optional
        is_model_ready(), asked on each probe with a 5 s limit, as Triton does); inference is not affected."""
        entry = self.repository.entry(name)
        if entry is None:
            raise ServiceError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        try:
            mv = self.repository.get(name, version)
        except ServiceError as e:
            if e.code == ErrorCode.INVALID_ARG:
                raise
            return False
        if not mv.ready:
            return False
        workers = list(mv.pool.workers) if mv.pool is not None else []
        checks = [w.check_ready() for w in workers if w.readiness.has_fn]
        return all(await asyncio.gather(*checks)) if checks else True

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """Inputs/outputs with batch dims, versions, platform."""
        mv = self.repository.get(name, version)
        config = mv.config
        batch = [-1] if config.max_batch_size > 0 else []
        entry = self.repository.models[name]
        versions = [version] if version else [str(v) for v, m in sorted(entry.versions.items()) if m.state == READY]

        def meta(t: Any) -> TensorMetadata:
            dt = mc.DataType.Name(t.data_type)[5:]
            return TensorMetadata(t.name, "BYTES" if dt == "STRING" else dt, batch + list(t.dims))

        return ModelMetadata(
            name,
            versions,
            config.platform or config.backend,
            [meta(t) for t in config.input],
            [meta(t) for t in config.output],
        )

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the version a request targets uses the decoupled transaction policy (False if it is unknown)."""
        try:
            return self.repository.get(name, version).decoupled
        except ServiceError:
            return False

    def model_location(self, name: str, version: str = "") -> tuple[str, int]:
        """(model folder, version number) of the version a request targets (the OpenAI front end reads the
        model's chat template and LoRA list there)."""
        mv = self.repository.get(name, version)
        return mv.model_dir, mv.version

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        """The normalized config."""
        return self.repository.get(name, version).config

    def statistics(self, name: str = "", version: str = "") -> list[tuple[str, str, ModelStats]]:
        """(name, version, stats) for one model/version or every READY one."""
        return model_statistics(self.repository, name, version)

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        """One row per (model, version) known, or just the name for never-loaded models."""
        return repository_index(self.repository, ready_only)

    # ---- inference ----------------------------------------------------------------------------------------
    def prepare(self, request: InferRequest) -> ModelVersion:
        """Find the model version, resolve shared-memory references and validate; raises ServiceError."""
        if not self.accepting:
            raise ServiceError(ErrorCode.UNAVAILABLE, "Server is not accepting new inference requests (shutting down)")
        if request.trace is not None:
            request.trace.stamp("REQUEST_START")
        mv = self.repository.get(request.model_name, request.model_version)
        request.model_version = str(mv.version)
        held = self.shm_holds.resolve(request)
        try:
            assert mv.signature is not None
            validate_request(request, mv.signature)
            if held:
                self.shm_holds.check_bytes(request)
        except BaseException:
            self.release_shm(request)
            raise
        request.arrival_ns = time.monotonic_ns()
        if request.stamps is not None:
            request.stamps.append(("prepared", request.arrival_ns))
        return mv

    def release_shm(self, request: InferRequest) -> None:
        """Drop the shm region references `request` holds (idempotent)."""
        self.shm_holds.release(request)

    def client_shm(self) -> Any:
        """The registry of client shared-memory regions; UNSUPPORTED while --allow-client-shm is false."""
        if self.shm_registry is None:
            raise ServiceError(
                ErrorCode.UNSUPPORTED,
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.",
            )
        return self.shm_registry

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request to completion (non-decoupled models)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferResponse] = loop.create_future()

        def on_response(response: InferResponse) -> None:
            if response.final and not future.done():
                future.set_result(response)

        mv = self.start_single(request, on_response)
        assert mv.scheduler is not None
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled = True
            mv.scheduler.cancel(request)
            raise

    def start_single(self, request: InferRequest, on_response: ResponseCallback) -> ModelVersion:
        """Start a ModelInfer request (answered once, through on_response); decoupled models are refused."""
        mv = self.prepare(request)
        if mv.decoupled:
            raise ServiceError(
                ErrorCode.UNSUPPORTED,
                "ModelInfer RPC doesn't support models with decoupled transaction policy",
            )
        request.single_response = True
        self._enqueue(mv, request, on_response)
        if request.stamps is not None:
            request.stamps.append(("enqueued", time.monotonic_ns()))
        return mv

    def trace_setting(self, model_name: str = "", updates: dict[str, list[str] | None] | None = None) -> dict:
        """Get (and with `updates`, change) the global or a model's trace settings (trace extension)."""
        return self.tracer.setting(model_name, updates)

    def submit(self, request: InferRequest, on_response: ResponseCallback) -> ModelVersion:
        """Start a request whose responses (one, or many for decoupled models) go to on_response."""
        mv = self.prepare(request)
        self._enqueue(mv, request, on_response)
        return mv

    def _enqueue(self, mv: ModelVersion, request: InferRequest, on_response: ResponseCallback) -> None:
        """Hand a prepared request to its scheduler, holding its shm regions until the final response."""
        gate = self.cache_gate
        if gate is not None and gate.applies_to(mv):
            hit, key = gate.lookup(mv, request)
            if hit is not None:  # answered from the cache: the model does not run
                self.release_shm(request)
                if request.trace is not None:
                    on_response = traced(request, mv, on_response)
                asyncio.get_running_loop().call_soon(on_response, hit)
                return
            if key is not None:
                on_response = gate.storing(mv, key, on_response)
        for o in request.outputs:  # a loop, not any(<generator>): this runs per request
            if o.classification:
                on_response = self.classifier.wrap(mv, request, on_response)
                break
        admission = self.admission
        if admission is not None:
            admission.enter(mv)  # raises UNAVAILABLE above a bound
            on_response = admitted(admission, mv, on_response)
        if request.trace is not None:
            on_response = traced(request, mv, on_response)
        request.on_response = on_response
        self.shm_holds.hold_until_final(request)
        assert mv.scheduler is not None
        try:
            mv.scheduler.enqueue(request)
        except BaseException:
            self.release_shm(request)
            if admission is not None:
                admission.leave(mv)
            raise

    def cancel(self, request: InferRequest, mv: ModelVersion) -> None:
        """The client gave up on a submitted request."""
        request.cancelled = True
        if mv.scheduler is not None:
            mv.scheduler.cancel(request)
