"""tritonserver.Options: the server's configuration, with Triton's field names and defaults, turned into the
command line Trireme's own server parses (one reader of configuration: service/config/flags.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trireme.tritonserver._enums import InstanceGroupKind, LogFormat, ModelControlMode, RateLimitMode
from trireme.tritonserver._errors import InvalidArgumentError

_MODES = {ModelControlMode.NONE: "none", ModelControlMode.POLL: "poll", ModelControlMode.EXPLICIT: "explicit"}


@dataclass
class RateLimiterResource:
    """A rate-limiter resource (accepted for compatibility; Trireme has no rate limiter)."""

    name: str
    count: int
    device: int


@dataclass
class ModelLoadDeviceLimit:
    """A device memory limit for model loading (accepted for compatibility)."""

    kind: InstanceGroupKind
    device: int
    fraction: float


@dataclass
class Options:
    """Server options (Triton's fields and defaults; see docs/python-api.md for the ones Trireme ignores)."""

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True
    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[ModelLoadDeviceLimit] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)

    def repositories(self) -> list[str]:
        """The model repositories as a list."""
        if isinstance(self.model_repository, str):
            return [self.model_repository] if self.model_repository else []
        return list(self.model_repository)

    def to_flags(self, extra_repositories: list[str] | None = None) -> list[str]:
        """The `trireme serve` flags these options mean (InvalidArgumentError for a value out of range)."""
        repositories = self.repositories() + list(extra_repositories or [])
        if not repositories:
            raise InvalidArgumentError("Model repository must be specified.")
        try:
            mode = _MODES[ModelControlMode(self.model_control_mode)]
        except ValueError:
            raise InvalidArgumentError(f"invalid model control mode: {self.model_control_mode!r}") from None
        if self.exit_timeout < 0 or self.log_verbose < 0 or self.metrics_interval <= 0:
            raise InvalidArgumentError("exit_timeout and log_verbose must be >= 0, metrics_interval > 0")
        flags = [f"--model-repository={r}" for r in repositories]
        flags += [
            f"--model-control-mode={mode}",
            f"--id={self.server_id}",
            f"--strict-model-config={str(self.strict_model_config).lower()}",
            f"--exit-on-error={str(self.exit_on_error).lower()}",
            f"--strict-readiness={str(self.strict_readiness).lower()}",
            f"--exit-timeout-secs={int(self.exit_timeout)}",
            f"--log-verbose={int(self.log_verbose)}",
            f"--allow-metrics={str(self.metrics).lower()}",
            f"--allow-gpu-metrics={str(self.gpu_metrics).lower()}",
            f"--allow-cpu-metrics={str(self.cpu_metrics).lower()}",
            f"--metrics-interval-ms={int(self.metrics_interval)}",
        ]
        if mode == "explicit":
            flags += [f"--load-model={m}" for m in self.startup_models]
        if os.path.isdir(self.backend_directory):
            flags.append(f"--backend-directory={self.backend_directory}")
        for kind, settings in self.cache_config.items():
            flags.append(f"--cache-config={kind}," + ",".join(f"{k}={v}" for k, v in settings.items()))
        for backend, settings in self.backend_configuration.items():
            flags += [f"--backend-config={backend},{k}={v}" for k, v in settings.items()]
        for name, settings in self.host_policies.items():
            flags += [f"--host-policy={name},{k}={v}" for k, v in settings.items()]
        for settings in self.metrics_configuration.values():
            flags += [f"--metrics-config={k}={v}" for k, v in settings.items()]
        return flags
