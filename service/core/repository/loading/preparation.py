"""How a model's config is prepared for a load (agents, backend, auto-complete, checks) and what its instances
run with (instance specs, the Python execution environment): the part of ModelRepository that turns a model
folder into a config and instance specs, kept beside it as a mixin."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from protos import model_config_pb2 as mc
from service.core.repository import model_config as cfg
from service.core.repository.agents.chain import RepoAgents
from service.core.repository.autocomplete import run_auto_complete
from service.core.repository.backend_directory import PYTHON_BASED_RUNTIME, backend_folder
from service.core.repository.instance_plan import instance_specs
from service.core.repository.loading.namespaces import resolve_steps
from service.core.repository.model_version import ModelEntry, ModelVersion
from service.core.repository.versions import numeric_versions, select_versions
from service.instances.envs.prepare import ExecEnv, apply_env, prepare_env


class ConfigPreparation:
    """Mixin of ModelRepository (which sets these attributes)."""

    options: Any  # RepositoryOptions
    agents: RepoAgents
    shared: dict[str, list[str]]

    def _backend_dir(self, config: mc.ModelConfig) -> str:
        """The folder of the model's Python-based backend, "" for a built-in one; ServiceError when unknown."""
        if config.platform == "ensemble" or not config.backend:
            return ""
        return backend_folder(config.backend, self.options.backend_directory)

    async def _exec_env(self, config: mc.ModelConfig, model_dir: str, version: int) -> ExecEnv | None:
        """The Python execution environment of a Python-based model's version (unpacked or built off the loop)."""
        if config.backend != "python" and not self._backend_dir(config):
            return None
        version_dir = os.path.join(model_dir, str(version))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, prepare_env, config.parameters, model_dir, version_dir)

    def _instance_specs(self, mv: ModelVersion, config: mc.ModelConfig) -> list[Any]:
        o = self.options
        specs = instance_specs(
            config,
            mv.name,
            mv.version,
            mv.model_dir,
            o.gpu_count,
            o.arena_bytes,
            o.log_verbose,
            o.attach_worker,
            arena_growth_bytes=o.arena_growth_bytes,
            arena_reserve=o.arena_reserve,
            backend_dir=self._backend_dir(config),
            host_policies=o.host_policies,
        )
        return apply_env(specs, mv.exec_env, mv.name)

    async def _prepare_config(
        self, entry: ModelEntry, override: mc.ModelConfig | None
    ) -> tuple[mc.ModelConfig, list[int]]:
        loop = asyncio.get_running_loop()
        if override is not None:
            config, path, exists = override, os.path.join(entry.model_dir, "config.pbtxt"), True
        else:
            config, path, exists = await loop.run_in_executor(
                None, cfg.read_config, entry.model_dir, self.options.model_config_name
            )
        # repository agents see the config as written, and may move the model (entry.load_dir)
        entry.location = await self.agents.run(self.agents.load, entry.name, entry.model_dir, config)
        versions = await loop.run_in_executor(None, numeric_versions, entry.load_dir)
        cfg.fill_backend(config, entry.load_dir, versions)
        backend_dir = self._backend_dir(config)
        if backend_dir:
            config.runtime = PYTHON_BASED_RUNTIME
        if self.options.auto_complete and config.backend and versions:
            config = await run_auto_complete(
                config,
                entry.load_dir,
                os.path.join(entry.load_dir, str(versions[-1])),
                exists,
                backend_dir,
                await self._exec_env(config, entry.load_dir, versions[-1]),
            )
        elif not exists:
            raise cfg.config_error(path, "model configuration file is missing and auto-complete is disabled")
        cfg.normalize(config, entry.name, self.options.gpu_count)
        cfg.validate(config, entry.name, path)
        if config.platform == "ensemble":
            resolve_steps(config, entry.model_dir, self.shared)
            return config, [1] if not versions else select_versions(config, versions)
        chosen = select_versions(config, versions)
        if not chosen:
            raise cfg.config_error(path, f"no version is available for model '{entry.name}' under its version policy")
        return config, chosen
