"""Wires the core and the frontends together, runs them on uvloop, and shuts down in order."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import uvloop

from service.config.flags import ServerConfig
from service.config.tls import ssl_context
from service.core.bls import BlsServer
from service.core.engine import Engine
from service.core.observability import model_logs
from service.core.observability.custom_metrics import CustomMetrics
from service.core.observability.log_output import reopen as reopen_log_file
from service.core.observability.metrics import CoreCollector, parse_metrics_config
from service.core.observability.system_metrics import SystemSampler
from service.core.observability.trace_settings import parse_trace_config
from service.core.pipeline.admission import Admission
from service.core.repository.poller import RepositoryPoller
from service.core.repository.repository import READY, ModelRepository, RepositoryOptions
from service.core.repository.shm_plan import plan_arenas
from service.core.scheduling.factory import make_scheduler
from service.core.scheduling.rate_limiter import RateLimiter
from service.errors import ServiceError
from service.examples import missing_example_lines
from service.frontend.grpc.server import build_grpc_server, server_credentials
from service.frontend.http.server import HttpFrontend, HttpOptions
from service.frontend.metrics import Collector, MetricsService
from service.frontend.metrics import render as render_metrics
from service.frontend.openai.server import OpenAIFrontend
from service.frontend.sagemaker.server import SageMakerFrontend
from service.frontend.vertex_ai.server import VertexAiFrontend
from service.ipc.arena import SEGMENT_PREFIX
from service.remote.supervisor import Frontends
from service.worker.pb_utils.hooks import runtime as pb_runtime
from shm.registry import SharedMemoryRegistry

log = logging.getLogger("trireme.server")


def remove_stale_segments() -> int:
    """Unlink /dev/shm segments left by Trireme processes that no longer exist (e.g. after kill -9)."""
    removed = 0
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    for name in names:
        if not name.startswith(SEGMENT_PREFIX):
            continue
        pid_text = name[len(SEGMENT_PREFIX) :].split("_", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # owner alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(os.path.join("/dev/shm", name))
            removed += 1
        except OSError:
            pass
    return removed


def model_table(engine: Engine) -> str:
    """Triton-style model status table."""
    rows = [
        (r.name, r.version or "-", r.state or "UNKNOWN" if not r.reason else f"{r.state}: {r.reason}")
        for r in engine.repository_index()
    ]
    headers = ("Model", "Version", "Status")
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(cells: tuple[str, ...]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + "|"

    return "\n".join([line, fmt(headers), line, *(fmt(r) for r in rows), line])


class Server:
    """The running server: repository, engine, gRPC front end."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        options = RepositoryOptions(
            auto_complete=config.auto_complete,
            model_config_name=config.model_config_name,
            log_verbose=config.log_verbose,
            arena_bytes=config.arena_bytes,
            unload_timeout_s=config.model_unload_timeout_secs,
            arena_growth_bytes=config.arena_growth_bytes,
            backend_directory=config.backend_directory,
            host_policies=config.host_policies,
            loading=config.loading,
        )
        self.metrics_config = parse_metrics_config(config.metrics_config)
        options.summaries = config.allow_metrics and self.metrics_config.summary_latencies
        self.bls = BlsServer()  # requests Python models send to other models
        self.custom_metrics = CustomMetrics()  # pb_utils.MetricFamily metrics of Python models
        bls_attach, metrics_attach = self.bls.attach, self.custom_metrics.attach

        def attach_worker(worker: Any) -> None:
            bls_attach(worker)
            metrics_attach(worker)
            model_logs.attach(worker, self.engine.log_settings)

        options.attach_worker = attach_worker
        limiter = RateLimiter(list(config.rate_limit_resources)) if config.rate_limit else None
        self.repository = ModelRepository(
            config.model_repositories, options, lambda mv, pool: make_scheduler(mv, pool, self.engine, limiter)
        )
        self.shm_registry = SharedMemoryRegistry() if config.allow_client_shm else None
        admission = Admission(config.max_inflight_requests, config.max_inflight_requests_per_model)
        self.engine = Engine(self.repository, self.shm_registry, config.strict_readiness, admission)
        self.engine.model_control_mode = config.model_control_mode
        if config.cache is not None and config.cache.redis is not None:
            self.engine.enable_redis_cache(config.cache.redis)
        elif config.cache_bytes:
            self.engine.enable_response_cache(config.cache_bytes)
        if config.trace_config:
            self.engine.configure_tracing(*parse_trace_config(config.trace_config))
        settings = self.engine.log_settings
        settings.log_verbose_level = config.log_verbose
        settings.log_info, settings.log_warning, settings.log_error = config.log_severities
        settings.apply()
        self.engine.log_settings.log_file = config.log_file
        self.engine.log_settings.log_format = config.log_format or "default"
        self.bls.engine = self.engine
        # pb_utils.Logger lines of in-process instances: the same settings as lines from worker processes
        pb_runtime.log = partial(model_logs.log_here, self.engine.log_settings)
        self.grpc_server: grpc.aio.Server | None = None
        self.grpc_port = 0
        self.http: HttpFrontend | None = None
        self.openai: OpenAIFrontend | None = None
        self.cloud: list[tuple[str, SageMakerFrontend | VertexAiFrontend]] = []  # SageMaker, Vertex AI
        self._sampler: SystemSampler | None = None
        self.poller: RepositoryPoller | None = None
        self.metrics: MetricsService | None = None
        self.metrics_address = ""
        self.frontends: Frontends | None = None  # --frontend-processes N >= 2
        self._stop = asyncio.Event()

    async def start(self) -> bool:
        """Load models and start listening; False when a model failed and exit-on-error is set."""
        # TLS files are checked before the models load: a wrong path fails at once, naming its flag (OSError)
        server_credentials(self.config.grpc)
        ssl_context(self.config.http_tls)
        if not await self.load_models():
            return False
        if self.config.allow_metrics:  # listening before the gRPC banner: whoever waits for it can scrape
            await self._start_metrics()
        if self.config.frontend_processes > 1:  # the front ends run in their own processes over this core
            self.frontends = Frontends(self.config, self.engine, self.config.argv)
            await self.frontends.start()
            self.grpc_port, http_port = self.frontends.grpc_port, self.frontends.http_port
        else:
            self.grpc_server, self.grpc_port = build_grpc_server(
                self.engine, f"{self.config.grpc_address}:{self.config.grpc_port}", self.config.grpc
            )
            await self.grpc_server.start()
            http_port = await self._start_http()
        openai_port = await self._start_openai()
        await self._start_cloud()
        if self.config.model_control_mode == "poll":
            if self.config.repository_poll_secs > 0:
                self.poller = RepositoryPoller(self.repository, self.config.repository_poll_secs)
                self.poller.start()
            else:
                log.warning("--repository-poll-secs is 0: the model repository is not polled")
        print(f"Started GRPCInferenceService at {self.config.grpc_address}:{self.grpc_port}", flush=True)
        if http_port:
            print(f"Started HTTPService at {self.config.http_address}:{http_port}", flush=True)
        if self.openai is not None:
            print(f"Started OpenAI-compatible API at {self.config.openai.address}:{openai_port}", flush=True)
        for name, endpoint in self.cloud:
            print(f"Started {name} HTTPService at {endpoint.options.address}:{endpoint.port}", flush=True)
        if self.metrics is not None:
            print(f"Started Metrics Service at {self.metrics_address}:{self.metrics.port}", flush=True)
        return True

    async def load_models(self) -> bool:
        """Scan the repositories and load the models the control mode asks for, starting no front end (start()
        and the Python API, trireme/, call it); False when a model failed and exit-on-error is set."""
        removed = remove_stale_segments()
        if removed:
            log.info("removed %d stale shared-memory segments of exited Trireme processes", removed)
        if self.config.using_example_repository:
            log.info("no --model-repository given: serving the embedded example repository")
            for line in missing_example_lines(self.config.model_repositories[0]):
                log.warning("%s", line)
        try:
            model_dirs = await asyncio.get_running_loop().run_in_executor(None, self.repository.scan)
            plan = plan_arenas(
                list(model_dirs.values()),
                self.config.arena_bytes,
                self.config.model_config_name,
                self.repository.options.gpu_count,
            )
        except ServiceError as e:
            log.error("cannot start: %s", e.message)
            return False
        self.repository.options.arena_bytes = plan.arena_bytes
        self.repository.options.arena_reserve = plan.reserve
        only = None
        if self.config.model_control_mode == "explicit":
            only = (
                []
                if not self.config.load_models
                else (None if self.config.load_models == ["*"] else self.config.load_models)
            )
        await self.repository.load_all(only)
        print(model_table(self.engine), flush=True)
        failed = [r for r in self.engine.repository_index() if r.state not in (READY, "")]
        if failed and self.config.exit_on_error:
            log.error(
                "exiting: %d model(s) failed to load (use --exit-on-error=false to serve the rest)",
                len(failed),
            )
            return False
        return True

    async def _start_http(self) -> int:
        """Bind the HTTP/REST front end (before any endpoint is announced); 0 when --allow-http=false."""
        if not self.config.allow_http:
            return 0
        options = HttpOptions(
            address=self.config.http_address,
            port=self.config.http_port,
            max_input_size=self.config.http_max_input_size,
            header_forward_pattern=self.config.http_header_forward_pattern,
            reuse_port=self.config.reuse_http_port,
            shutdown_timeout_s=self.config.exit_timeout_secs,
            restricted=list(self.config.http_restricted),
            ssl_context=ssl_context(self.config.http_tls),
        )
        self.http = HttpFrontend(self.engine, options)
        return await self.http.start()

    async def _start_openai(self) -> int:
        """The OpenAI-compatible API (--openai-port; off when not given)."""
        options = self.config.openai
        if options.port is None:
            return 0
        collectors = self._collectors() if self.config.allow_metrics else None
        try:
            self.openai = OpenAIFrontend(self.engine, options, collectors)
        except ValueError as e:  # an unreadable --tokenizer / --chat-template
            raise OSError(f"OpenAI front end: {e}") from None
        return await self.openai.start()

    async def _start_cloud(self) -> None:
        """SageMaker and Vertex AI (service/frontend/sagemaker, vertex_ai): in this process also with front-end
        processes (SageMaker's multi-model endpoint loads models; Vertex AI serves /metrics)."""
        config = self.config
        http = HttpOptions(
            max_input_size=config.http_max_input_size,
            shutdown_timeout_s=config.exit_timeout_secs,
            restricted=list(config.http_restricted),
        )
        if config.sagemaker.enabled:
            self.cloud.append(("Sagemaker", SageMakerFrontend(self.engine, config.sagemaker, http)))
        if config.vertex_ai.enabled:
            collectors = self._collectors() if config.allow_metrics else None
            metrics = (lambda: render_metrics(collectors)) if collectors is not None else None
            self.cloud.append(("Vertex AI", VertexAiFrontend(self.engine, config.vertex_ai, http, metrics)))
        for _, endpoint in self.cloud:
            await endpoint.start()

    @property
    def sampler(self) -> SystemSampler:
        """The CPU/GPU gauges (made on first use: it may open NVML)."""
        if self._sampler is None:
            config = self.config
            self._sampler = SystemSampler(
                cpu=config.allow_cpu_metrics, gpu=config.allow_gpu_metrics, gpu_count=self.repository.options.gpu_count
            )
        return self._sampler

    def _cache_failures(self) -> Callable[[], int] | None:
        """The Redis cache's failure count (trireme_cache_failures_total); None for the local cache or none."""
        gate = self.engine.cache_gate
        if gate is None or not hasattr(gate.cache, "check"):
            return None
        counters = gate.cache.counters
        return lambda: counters.failures

    def _collectors(self) -> list[Collector]:
        """What /metrics renders (the metrics port and the OpenAI port's /metrics alike)."""
        return [
            CoreCollector(
                self.repository.ready_versions,
                self.metrics_config,
                self.sampler,
                self.engine.cache_gate is not None,
                cache_failures=self._cache_failures(),
            ),
            self.custom_metrics,
            self.engine.llm_metrics,
        ]

    async def _start_metrics(self) -> None:
        """The Prometheus endpoint (--metrics-port), on this event loop."""
        config = self.config
        self.metrics_config.interval_ms = config.metrics_interval_ms
        self.metrics = MetricsService(self._collectors(), self.sampler, config.metrics_interval_ms)
        self.metrics_address = config.metrics_address or config.http_address or "0.0.0.0"
        try:
            await self.metrics.start(self.metrics_address, config.metrics_port)
        except OSError as e:
            raise OSError(
                e.errno,
                f"failed to start Metrics Service at {self.metrics_address}:{config.metrics_port}: {e.strerror} "
                "(pick another --metrics-port, or --allow-metrics=false)",
            ) from None

    def reopen_log(self) -> None:
        """SIGHUP with --log-file: reopen it, and have the front-end processes reopen theirs."""
        reopen_log_file()
        if self.frontends is not None:
            for proc in self.frontends.procs.values():
                if proc.returncode is None:
                    proc.send_signal(signal.SIGHUP)
        log.info("reopened the log file %s", self.config.log_file)

    def request_stop(self) -> None:
        """Begin an orderly shutdown (signal handler)."""
        self._stop.set()

    async def wait(self) -> None:
        """Block until a stop is requested."""
        await self._stop.wait()

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests up to the exit timeout, stop workers, release shm."""
        self.engine.accepting = False
        if self.poller is not None:
            await self.poller.stop()
        stopping = []
        if self.frontends is not None:
            stopping.append(self.frontends.stop())
        if self.grpc_server is not None:
            stopping.append(self.grpc_server.stop(grace=self.config.exit_timeout_secs))
        if self.http is not None:
            stopping.append(self.http.stop())
        if self.openai is not None:
            stopping.append(self.openai.stop())
        stopping.extend(endpoint.stop() for _, endpoint in self.cloud)
        if self.metrics is not None:
            stopping.append(self.metrics.stop())
        await asyncio.gather(*stopping)
        await self.repository.stop()
        self.engine.model_files.close()
        self.engine.tracer.close()
        if self.shm_registry is not None:
            self.shm_registry.close()
        self.engine.live = False


async def serve(config: ServerConfig) -> int:
    """Run until SIGINT/SIGTERM; returns the exit status."""
    server = Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_stop)
    if config.log_file:  # log rotation: SIGHUP reopens --log-file (here and in the front-end processes)
        loop.add_signal_handler(signal.SIGHUP, server.reopen_log)
    try:
        ok = await server.start()
        if ok:
            await server.wait()
            log.info("shutting down")
    except OSError as e:
        log.error("failed to start: %s", e)
        ok = False
    finally:
        await server.stop()
    return 0 if ok else 1


def run(config: ServerConfig) -> int:
    """Entry point used by __main__."""
    if sys.version_info >= (3, 12):
        return uvloop.run(serve(config))
    uvloop.install()
    return asyncio.run(serve(config))
