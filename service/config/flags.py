"""ServerConfig: the only reader of the command line (Triton's flag names) and environment."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field

from service.config.access import GrpcSettings, RestrictedApi, add_security_flags, check_restricted, grpc_settings
from service.config.cache_config import CacheSettings, parse_cache_settings
from service.config.cli_checks import add_cli_flags, reject_unknown
from service.config.endpoint_flags import (
    add_frontend_flags,
    add_http_flags,
    add_metrics_flags,
    add_placement_flags,
    default_frontend_processes,
)
from service.config.groups.cloud import (
    SageMakerOptions,
    VertexAiOptions,
    add_cloud_flags,
    check_ports,
    cloud_options,
    vertex_environment,
)
from service.config.groups.grpc_flags import add_grpc_flags, apply_grpc_flags
from service.config.groups.log_flags import add_log_flags
from service.config.groups.rate_limit import ResourceLimit, add_rate_limit_flags, rate_limit_settings
from service.config.groups.repository_flags import LoadingOptions, add_repository_flags, loading_options
from service.config.groups.trace_flags import add_trace_flags, trace_entries
from service.config.host_policy import HostPolicy, parse_host_policies
from service.config.ignored_flags import add_ignored_flags
from service.config.openai import OpenAIOptions, add_openai_flags, openai_options
from service.config.tls import TlsSettings, tls_settings
from service.config.values import parse_bool

log = logging.getLogger("trireme.config")

# service/example_models (this file is service/config/flags.py)
EXAMPLE_REPOSITORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "example_models")


def parse_cache_config(entries: list[str]) -> int | None:
    """Byte budget of a `--cache-config local,size=N` cache; None without one (ValueError when malformed)."""
    cache = parse_cache_settings(entries)
    return cache.size if cache is not None and cache.kind == "local" else None


@dataclass(slots=True)
class ServerConfig:
    """Everything the server needs to start."""

    model_repositories: list[str] = field(default_factory=list)
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    auto_complete: bool = True
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    exit_on_error: bool = True
    strict_readiness: bool = True
    log_verbose: int = 0
    exit_timeout_secs: int = 30
    server_id: str = "triton"
    allow_client_shm: bool = False  # Triton 2.69+: off unless --allow-client-shm=true
    model_config_name: str = ""
    arena_bytes: int = 256 << 20
    arena_growth_bytes: int = 64 << 20  # python,shm-growth-byte-size: how much an arena grows by when full
    using_example_repository: bool = False
    cache_bytes: int | None = None  # --cache-config local,size=N: the response cache's byte budget
    grpc: GrpcSettings = field(default_factory=GrpcSettings)
    http_restricted: list[RestrictedApi] = field(default_factory=list)
    http_tls: TlsSettings = field(default_factory=lambda: TlsSettings("http"))
    max_inflight_requests: int = 0  # server-wide bound on requests in flight (0: none)
    max_inflight_requests_per_model: int = 0  # the same bound for each model version (0: none)
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 << 20
    http_header_forward_pattern: str = ""
    reuse_http_port: bool = False
    trace_config: list[str] = field(default_factory=list)  # --trace-config entries, validated at parse time
    repository_poll_secs: float = 15.0  # poll mode: seconds between repository scans
    model_unload_timeout_secs: float = 30.0  # how long an unload waits for the model's in-flight requests

    allow_metrics: bool = True
    metrics_address: str = ""  # "" = the --http-address (Triton's default), else 0.0.0.0
    metrics_port: int = 8002
    metrics_interval_ms: int = 2000
    metrics_config: list[str] = field(default_factory=list)  # --metrics-config key=value entries
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)  # --openai-port and friends (docs/openai.md)

    backend_directory: str = ""  # --backend-directory: Python-based backends, DIR/<name>/model.py
    host_policies: dict[str, HostPolicy] = field(default_factory=dict)  # --host-policy, by name
    frontend_processes: int = 1  # --frontend-processes: N >= 2 front-end processes over one core process
    argv: list[str] = field(default_factory=list)  # the flags as given (front-end processes parse the same)
    sagemaker: SageMakerOptions = field(default_factory=SageMakerOptions)  # --allow-sagemaker (docs/sagemaker.md)
    vertex_ai: VertexAiOptions = field(default_factory=VertexAiOptions)  # --allow-vertex-ai (docs/vertex_ai.md)
    log_file: str = ""  # --log-file ("": stderr)
    log_severities: tuple[bool, bool, bool] = (True, True, True)  # --log-info, --log-warning, --log-error
    log_format: str = ""  # --log-format: default | ISO8601 | json ("": Python's layout; docs/logging.md)
    loading: LoadingOptions = field(default_factory=LoadingOptions)  # load threads/retries, namespacing, agents
    cache: CacheSettings | None = None  # --cache-config: the local or redis response cache
    rate_limit: bool = False  # --rate-limit=execution_count
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)  # --rate-limit-resource entries


def build_parser() -> argparse.ArgumentParser:
    """Flags with Triton's names; `--flag=value` and `--flag value` both work. Every flag carries help text."""
    p = argparse.ArgumentParser(
        prog="trireme serve",
        usage="trireme serve [--model-repository DIR ...] [--grpc-port PORT] [options]",
        description="Trireme: a Triton-compatible inference server. Flags keep Triton's names and meanings; "
        "the value in parentheses is Trireme's default. Both --flag value and --flag=value work.",
    )
    p.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        default=[],
        dest="model_repository",
        metavar="DIR",
        help="a model repository to serve: a folder, or s3://, gs://, as:// (docs/cloud-repositories.md); repeatable "
        "(default: the embedded example repository)",
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        default=8001,
        metavar="PORT",
        help="port of the gRPC service; 0 picks a free one (8001)",
    )
    p.add_argument(
        "--grpc-address", default="0.0.0.0", metavar="ADDR", help="address the gRPC service binds to (0.0.0.0)"
    )
    p.add_argument(
        "--strict-model-config",
        type=parse_bool,
        default=None,
        metavar="BOOL",
        help="older Triton name: true disables auto-completion of config.pbtxt (false)",
    )
    p.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="do not fill missing config.pbtxt fields from the model; every config must be complete (off)",
    )
    p.add_argument(
        "--model-control-mode",
        choices=["none", "poll", "explicit"],
        default="none",
        help="none: load everything at start, no load/unload RPCs; explicit: only --load-model at start, "
        "then the repository API loads and unloads; poll: load everything, then follow repository changes (none)",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode=explicit: a model to load at start; repeatable; '*' loads all (none)",
    )
    p.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="SECS",
        help="with --model-control-mode=poll: seconds between scans of the model repositories for added, removed "
        "and changed models; 0 disables polling (15)",
    )
    p.add_argument(
        "--model-unload-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECS",
        help="Trireme only: how long an unload (or a reload replacing a version) waits for requests already "
        "accepted to finish; requests still running then fail (30)",
    )
    p.add_argument(
        "--exit-on-error",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="exit when a model fails to load at start; false serves the others (true)",
    )
    p.add_argument(
        "--strict-readiness",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="server ready only when every model is ready; false: ready once the server is up (true)",
    )
    p.add_argument("--log-verbose", type=int, default=0, metavar="N", help="verbose logging level; 0 is off (0)")
    p.add_argument(
        "--exit-timeout-secs",
        type=int,
        default=30,
        metavar="SECS",
        help="on SIGINT/SIGTERM, how long in-flight requests may finish before the server stops (30)",
    )
    p.add_argument("--id", default="triton", metavar="ID", help="server id reported by ServerMetadata (triton)")
    p.add_argument(
        "--allow-client-shm",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="allow clients to register and use system/CUDA shared-memory regions; as in Triton 2.69+, off "
        "unless set, and registering then answers with an error naming this flag (false)",
    )
    p.add_argument(
        "--model-config-name",
        default="",
        metavar="NAME",
        help="read <model>/configs/NAME.pbtxt instead of config.pbtxt where it exists (config.pbtxt)",
    )
    p.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="BACKEND,KEY=VALUE",
        help="backend setting; python,shm-default-byte-size=N sets each worker's shared-memory arena "
        "(256 MiB), python,shm-growth-byte-size=N the step an arena grows by when a tensor does not fit "
        "(64 MiB); other settings are ignored",
    )
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="CACHE,KEY=VALUE",
        help="the response cache: local,size=BYTES (in memory) or redis,host=H / redis,port=P (and Triton's "
        "other redis keys), repeatable; models opt in with response_cache { enable: true } (off)",
    )
    p.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="older Triton spelling of --cache-config local,size=BYTES (off)",
    )
    add_security_flags(p)
    add_http_flags(p)
    add_trace_flags(p)
    add_metrics_flags(p)
    add_placement_flags(p)
    add_frontend_flags(p)
    add_openai_flags(p)
    add_repository_flags(p)
    add_cli_flags(p)
    add_cloud_flags(p)
    add_log_flags(p)
    add_grpc_flags(p)
    add_rate_limit_flags(p)
    add_ignored_flags(p)
    return p


def parse_args(argv: list[str]) -> ServerConfig:
    """ServerConfig from argv (without the program name). Triton flags Trireme does not implement warn once
    each; any other unknown option stops here (exit 1) naming it and the closest known flag."""
    if argv and argv[0] == "serve":
        argv = argv[1:]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    reject_unknown(parser, unknown)
    for flag in getattr(args, "ignored_flags", None) or []:
        log.warning("ignoring unsupported option '%s'", flag)
    config = ServerConfig(
        model_repositories=list(args.model_repository),
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        model_control_mode=args.model_control_mode,
        load_models=list(args.load_model),
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        log_verbose=args.log_verbose,
        exit_timeout_secs=args.exit_timeout_secs,
        server_id=args.id,
        allow_client_shm=args.allow_client_shm,
        model_config_name=args.model_config_name,
        grpc=grpc_settings(args),
        http_restricted=list(args.http_restricted_api),
        http_tls=tls_settings(args, "http"),
        max_inflight_requests=max(0, args.max_inflight_requests),
        max_inflight_requests_per_model=max(0, args.max_inflight_requests_per_model),
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        http_header_forward_pattern=args.http_header_forward_pattern,
        reuse_http_port=args.reuse_http_port,
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        metrics_interval_ms=args.metrics_interval_ms,
        metrics_config=list(args.metrics_config),
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
    )
    if config.load_models and config.model_control_mode != "explicit":
        raise SystemExit("Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
    if "*" in config.load_models and len(config.load_models) > 1:
        raise SystemExit("Error: '--load-model=*' must be the only '--load-model' given.")
    config.repository_poll_secs = args.repository_poll_secs
    config.openai = openai_options(args, config.http_address, config.http_max_input_size)
    config.model_unload_timeout_secs = args.model_unload_timeout_secs
    check_restricted(config.grpc.restricted, "--grpc-restricted-protocol")
    check_restricted(config.http_restricted, "--http-restricted-api")
    if args.disable_auto_complete_config or args.strict_model_config is True:
        config.auto_complete = False
    for entry in args.backend_config:
        backend, _, setting = entry.partition(",")
        key, _, value = setting.partition("=")
        if backend == "python" and key == "shm-default-byte-size" and value.isdigit():
            config.arena_bytes = max(1 << 20, int(value))
        if backend == "python" and key == "shm-growth-byte-size" and value.isdigit():
            config.arena_growth_bytes = max(1 << 16, int(value))
    try:
        config.cache = parse_cache_settings(list(args.cache_config))
        config.cache_bytes = config.cache.size if config.cache is not None and config.cache.kind == "local" else None
    except ValueError as e:
        parser.error(f"--cache-config: {e}")
    if config.cache_bytes is None and args.response_cache_byte_size:
        config.cache_bytes = args.response_cache_byte_size
    config.trace_config = trace_entries(args, parser)
    config.backend_directory = args.backend_directory
    if config.backend_directory and not os.path.isdir(config.backend_directory):
        log.warning(
            "--backend-directory '%s' is not a directory: only built-in backends are available", args.backend_directory
        )
    try:
        config.host_policies = parse_host_policies(list(args.host_policy))
    except ValueError as e:
        parser.error(f"--host-policy: {e}")
    for policy in config.host_policies.values():
        memory = f", memory on NUMA node {policy.numa_node}" if policy.bind_memory else ""
        if policy.numa_node is not None and not policy.bind_memory:
            memory = " (this machine reports no NUMA nodes: memory is not bound)"
        cores = ",".join(map(str, policy.cores())) or "any"
        log.info("host policy '%s': cores %s%s", policy.name, cores, memory)
    n = args.frontend_processes if args.frontend_processes is not None else default_frontend_processes()
    if n < 1:
        parser.error(f"--frontend-processes must be 1 or more, got {n}")
    config.frontend_processes = n
    config.argv = list(argv)
    _cloud(parser, args, argv, config)
    config.log_file, config.log_format = args.log_file, args.log_format
    config.log_severities = (args.log_info, args.log_warning, args.log_error)
    apply_grpc_flags(config.grpc, args)
    config.loading = loading_options(args, parser)
    try:
        config.rate_limit, config.rate_limit_resources = rate_limit_settings(args)
    except ValueError as e:
        parser.error(str(e))
    if not config.model_repositories:
        config.model_repositories = [EXAMPLE_REPOSITORY]
        config.using_example_repository = True
    return config


def _cloud(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], config: ServerConfig) -> None:
    """SageMaker and Vertex AI (service/config/groups/cloud.py); in a Vertex AI container (AIP_MODE=PREDICTION) HTTP is
    off unless --allow-http says otherwise and AIP_STORAGE_URI is the repository when none is given, as Triton."""
    try:
        config.sagemaker, config.vertex_ai = cloud_options(args, config.http_address)
    except ValueError as e:
        parser.error(str(e))
    if vertex_environment():
        if not any(a.startswith("--allow-http") for a in argv):
            config.allow_http = False
        if not config.model_repositories and os.environ.get("AIP_STORAGE_URI"):
            config.model_repositories = [os.environ["AIP_STORAGE_URI"]]
    if not (config.sagemaker.enabled or config.vertex_ai.enabled):
        return
    endpoints = [("GRPC", config.grpc_address, config.grpc_port)]
    if config.allow_http:
        endpoints.append(("HTTP", config.http_address, config.http_port))
    if config.allow_metrics:
        endpoints.append(("Metrics", config.metrics_address or config.http_address, config.metrics_port))
    if config.vertex_ai.enabled:
        endpoints.append(("Vertex AI", config.vertex_ai.address, config.vertex_ai.port))
    try:
        check_ports(endpoints, config.sagemaker)
    except ValueError as e:
        parser.error(str(e))
