"""tritonfrontend's KServeHttp, KServeGrpc and Metrics (Triton's option names and defaults), and OpenAI (a
Trireme extension: Triton ships its OpenAI front end as a separate application)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from service.config.access import GrpcSettings
from service.config.openai import OpenAIOptions
from service.config.tls import TlsSettings
from service.frontend.grpc.server import build_grpc_server
from service.frontend.http.server import HttpFrontend, HttpOptions
from service.frontend.metrics import MetricsService
from service.frontend.openai.server import OpenAIFrontend
from trireme._core.runtime import CoreRuntime
from trireme.tritonfrontend._frontend import Frontend
from trireme.tritonserver._errors import InvalidArgumentError


def _check(options: Any, **bounds: tuple[int, int | None]) -> None:
    """Range checks (Triton declares them with pydantic Field(ge=, le=, gt=))."""
    for name, (low, high) in bounds.items():
        value = getattr(options, name)
        if not isinstance(value, int) or value < low or (high is not None and value > high):
            upper = f" and <= {high}" if high is not None else ""
            raise InvalidArgumentError(
                f"{type(options).__qualname__}.{name} must be an int >= {low}{upper}, not {value!r}"
            )


class KServeHttp(Frontend):
    """The KServe v2 HTTP/REST front end."""

    _kind = "HTTP service"

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8000
        reuse_port: bool = False
        thread_count: int = 8
        header_forward_pattern: str = ""

        def __post_init__(self) -> None:
            _check(self, port=(0, 65535), thread_count=(1, None))

    async def _start(self, runtime: CoreRuntime) -> tuple[Any, int]:
        o = self.options
        http = HttpFrontend(
            runtime.engine,
            HttpOptions(
                address=o.address,
                port=o.port,
                header_forward_pattern=o.header_forward_pattern,
                reuse_port=o.reuse_port,
                shutdown_timeout_s=runtime.config.exit_timeout_secs,
            ),
        )
        return http, await http.start()

    async def _stop(self, listener: Any) -> None:
        await listener.stop()


class Grpc_compression_level(IntEnum):
    NONE = 0
    LOW = 1
    MED = 2
    HIGH = 3
    COUNT = 4


class KServeGrpc(Frontend):
    """The KServe v2 gRPC front end."""

    _kind = "GRPC service"
    Grpc_compression_level = Grpc_compression_level

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8001
        reuse_port: bool = False
        use_ssl: bool = False
        server_cert: str = ""
        server_key: str = ""
        root_cert: str = ""
        use_mutual_auth: bool = False
        keepalive_time_ms: int = 7_200_000
        keepalive_timeout_ms: int = 20_000
        keepalive_permit_without_calls: bool = False
        http2_max_pings_without_data: int = 2
        http2_min_recv_ping_interval_without_data_ms: int = 300_000
        http2_max_ping_strikes: int = 2
        max_connection_age_ms: int = 0
        max_connection_age_grace_ms: int = 0
        infer_compression_level: int | Grpc_compression_level = Grpc_compression_level.NONE
        infer_thread_count: int = 2
        infer_allocation_pool_size: int = 8
        max_response_pool_size: int = 2_147_483_647
        forward_header_pattern: str = ""

        def __post_init__(self) -> None:
            if isinstance(self.infer_compression_level, Grpc_compression_level):
                self.infer_compression_level = self.infer_compression_level.value
            unbounded = (0, None)
            _check(
                self,
                port=(0, 65535),
                keepalive_time_ms=unbounded,
                keepalive_timeout_ms=unbounded,
                http2_max_pings_without_data=unbounded,
                http2_min_recv_ping_interval_without_data_ms=unbounded,
                http2_max_ping_strikes=unbounded,
                max_connection_age_ms=unbounded,
                max_connection_age_grace_ms=unbounded,
                infer_thread_count=unbounded,
                infer_allocation_pool_size=unbounded,
                max_response_pool_size=unbounded,
            )

        def settings(self) -> GrpcSettings:
            """The gRPC front end's settings (what the --grpc-* flags give the command)."""
            channel = {
                "grpc.keepalive_time_ms": self.keepalive_time_ms,
                "grpc.keepalive_timeout_ms": self.keepalive_timeout_ms,
                "grpc.keepalive_permit_without_calls": int(self.keepalive_permit_without_calls),
                "grpc.http2.max_pings_without_data": self.http2_max_pings_without_data,
                "grpc.http2.min_ping_interval_without_data_ms": self.http2_min_recv_ping_interval_without_data_ms,
                "grpc.http2.max_ping_strikes": self.http2_max_ping_strikes,
            }
            if self.max_connection_age_ms:  # 0: no maximum age
                channel["grpc.max_connection_age_ms"] = self.max_connection_age_ms
            if self.max_connection_age_grace_ms:
                channel["grpc.max_connection_age_grace_ms"] = self.max_connection_age_grace_ms
            tls = TlsSettings(
                "grpc", self.use_ssl, self.use_mutual_auth, self.server_cert, self.server_key, self.root_cert
            )
            return GrpcSettings(tls=tls, channel_args=channel)

    async def _start(self, runtime: CoreRuntime) -> tuple[Any, int]:
        o = self.options
        server, port = build_grpc_server(runtime.engine, f"{o.address}:{o.port}", o.settings(), o.reuse_port)
        await server.start()
        return server, port

    async def _stop(self, listener: Any) -> None:
        await listener.stop(grace=self._runtime.config.exit_timeout_secs)


class Metrics(Frontend):
    """The Prometheus metrics endpoint (GET /metrics)."""

    _kind = "Metrics service"

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8002
        thread_count: int = 1

        def __post_init__(self) -> None:
            _check(self, port=(0, 65535), thread_count=(1, None))

    async def _start(self, runtime: CoreRuntime) -> tuple[Any, int]:
        core = runtime.core
        assert core is not None
        if not runtime.config.allow_metrics:
            raise InvalidArgumentError("metrics are disabled (tritonserver.Options.metrics is False)")
        service = MetricsService(core._collectors(), core.sampler, runtime.config.metrics_interval_ms)
        return service, await service.start(self.options.address, self.options.port)

    async def _stop(self, listener: Any) -> None:
        await listener.stop()


class OpenAI(Frontend):
    """Trireme's OpenAI-compatible API (/v1/completions, /v1/chat/completions, ...; docs/openai.md)."""

    _kind = "OpenAI-compatible API"

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 9000
        tokenizer: str = ""
        chat_template: str = ""
        default_max_tokens: int = 16

        def __post_init__(self) -> None:
            _check(self, port=(0, 65535), default_max_tokens=(1, None))

    async def _start(self, runtime: CoreRuntime) -> tuple[Any, int]:
        core = runtime.core
        assert core is not None
        o = self.options
        options = OpenAIOptions(
            port=o.port,
            address=o.address,
            tokenizer=o.tokenizer,
            chat_template=o.chat_template,
            default_max_tokens=o.default_max_tokens,
        )
        collectors = core._collectors() if runtime.config.allow_metrics else None
        try:
            frontend = OpenAIFrontend(runtime.engine, options, collectors)
        except ValueError as e:
            raise InvalidArgumentError(f"OpenAI front end: {e}") from None
        return frontend, await frontend.start()

    async def _stop(self, listener: Any) -> None:
        await listener.stop()
