"""Instance specs of a model version (one per `instance_group` instance) and instance-count update plans."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from protos import model_config_pb2 as mc
from service.config.host_policy import HostPolicy, default_policy_name
from service.core.repository import model_config as cfg
from service.errors import ErrorCode, ServiceError
from service.instances.mode import MODE_KEY, instance_mode
from service.instances.process import InstanceSpec
from service.ipc.launch import PLACEMENT_ENV, placement_env

log = logging.getLogger("trireme.repository")

KIND_NAMES = {
    mc.ModelInstanceGroup.KIND_CPU: "CPU",
    mc.ModelInstanceGroup.KIND_GPU: "GPU",
    mc.ModelInstanceGroup.KIND_MODEL: "MODEL",
    mc.ModelInstanceGroup.KIND_AUTO: "AUTO",
}


def instance_specs(
    config: mc.ModelConfig,
    name: str,
    version: int,
    model_dir: str,
    gpu_count: int,
    arena_bytes: int,
    log_verbose: int,
    attach: Callable[[Any], None] | None,
    arena_growth_bytes: int = 64 << 20,
    arena_reserve: bool = False,
    backend_dir: str = "",
    host_policies: Mapping[str, HostPolicy] | None = None,
) -> list[InstanceSpec]:
    """One InstanceSpec per instance the config's instance groups ask for; ServiceError for impossible groups.

    Each instance runs where its host policy (--host-policy) says: the one its group names, else the default
    name of its device (cpu, gpu_<id>, model) when one is defined; a named policy that is not defined fails.
    """
    policies = host_policies or {}
    config_json = cfg.to_json(config)
    try:
        mode = instance_mode(config.parameters)
    except ValueError as e:
        raise ServiceError(ErrorCode.INVALID_ARG, f"model '{name}': {e}") from None
    in_process = mode != "process"
    if in_process and config.backend != "python":
        raise ServiceError(
            ErrorCode.INVALID_ARG,
            f"model '{name}': {MODE_KEY}={mode} is supported for the python backend only, not '{config.backend}'",
        )
    specs = []
    for group in config.instance_group:
        kind = KIND_NAMES.get(group.kind, "CPU")
        if kind == "GPU" and not group.gpus:
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"instance group {group.name} of model {name} has kind KIND_GPU but no GPUs are available",
            )
        for gpu in group.gpus if kind == "GPU" else []:
            if not 0 <= gpu < gpu_count:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f"instance group {group.name} of model {name} specifies invalid or unsupported gpu id "
                    f"{gpu}. GPUs with at least the minimum required CUDA compute compatibility of 6.0 are: "
                    + ", ".join(str(g) for g in range(gpu_count)),
                )
        if kind in ("CPU", "MODEL") and group.gpus:
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"instance group {group.name} of model {name} has kind KIND_{kind} but specifies one or more GPUs",
            )
        if group.host_policy and group.host_policy not in policies:
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"instance group {group.name} of model {name} names host policy '{group.host_policy}', which no "
                f"--host-policy defines (defined: {', '.join(sorted(policies)) or 'none'})",
            )
        devices = list(group.gpus) if kind == "GPU" else [0]
        for device in devices:
            policy = policies.get(group.host_policy or default_policy_name(kind, device))
            env = placement_env(policy.cores(), policy.numa_node if policy.bind_memory else None) if policy else {}
            if env and in_process:
                log.warning("model '%s': in-process instances run in the server, not pinned by host policies", name)
            for k in range(group.count):
                specs.append(
                    InstanceSpec(
                        backend=config.backend,
                        backend_dir=backend_dir,
                        model_name=name,
                        model_version=str(version),
                        model_dir=model_dir,
                        version_dir=os.path.join(model_dir, str(version)),
                        config_json=config_json,
                        instance_name=f"{group.name}_{k}" if kind != "GPU" else f"{group.name}_{device}_{k}",
                        instance_kind=kind,
                        group_name=group.name,
                        device_id=device,
                        arena_bytes=arena_bytes,
                        arena_growth_bytes=arena_growth_bytes,
                        arena_reserve=arena_reserve,
                        log_verbose=log_verbose,
                        attach=attach,
                        in_process=in_process,
                        inline=mode == "in_process_inline",
                        env=dict(env),
                    )
                )
    return specs


def _key(spec: InstanceSpec) -> tuple[str, str, int, str]:
    return (spec.instance_name, spec.instance_kind, spec.device_id, spec.env.get(PLACEMENT_ENV, ""))


def instance_diff(old: list[InstanceSpec], new: list[InstanceSpec]) -> tuple[list[InstanceSpec], list[InstanceSpec]]:
    """(specs to start, running specs to stop): instances whose name, kind and device stay are kept as they are."""
    old_keys = {_key(s) for s in old}
    new_keys = {_key(s) for s in new}
    return [s for s in new if _key(s) not in old_keys], [s for s in old if _key(s) not in new_keys]


def without_instances(config: mc.ModelConfig) -> mc.ModelConfig:
    """A copy without the fields an in-place update may change (instance groups, version policy)."""
    out = mc.ModelConfig()
    out.CopyFrom(config)
    out.ClearField("instance_group")
    out.ClearField("version_policy")
    return out


async def update_instances(
    mv: Any, config: mc.ModelConfig, make_specs: Callable[[], list[InstanceSpec]], timeout_s: float
) -> str:
    """Instance-count update of a serving version (a repository ModelVersion): start the instances the new
    config adds, hand them to the scheduler, then retire the ones it drops (they finish what they run first).

    Returns "" or the error; on error nothing changed and the version keeps its instances.
    """
    pool, scheduler = mv.pool, mv.scheduler
    try:
        add, drop = instance_diff(pool.specs, make_specs())
        added = await pool.add(add) if add else []
    except ServiceError as e:
        log.error("failed to update '%s' version %d: %s", mv.name, mv.version, e.message)
        mv.reason = f"update failed, still serving the previous instances: {e.message}"
        return f"version {mv.version} is at UNAVAILABLE state: {e.message}"
    limiter = getattr(scheduler, "limiter", None)
    if limiter is not None:  # the new config's rate_limiter settings, for the new instances and the kept ones
        for w in pool.workers:
            limiter.add_worker(scheduler, config, w)
    for w in added:
        scheduler.add_worker(w)
    leaving = [w for w in pool.workers if any(w.spec is s for s in drop)]
    await asyncio.gather(*(scheduler.release_worker(w, timeout_s) for w in leaving))
    mv.config = config
    log.info("updated '%s' version %d: %d instance(s) started, %d stopping", mv.name, mv.version, len(add), len(drop))
    reason = f"instance of model '{mv.name}' version {mv.version} was removed while the request was running"
    await pool.remove(leaving, reason, timeout_s)
    return ""
