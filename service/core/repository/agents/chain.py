"""Finding repository agents and running their actions in Triton's order.

LOAD runs each agent of `model_repository_agents` in order, each seeing the previous one's location; the first
failure stops the chain and fails the load. After the load, LOAD_COMPLETE (or LOAD_FAIL) runs in reverse order.
An unload runs UNLOAD in order, then UNLOAD_COMPLETE in reverse order. A reload replaces the model's chain once
the new versions serve (the old chain is unloaded then); a failed reload leaves the serving chain in place.

Agents are found as <--repoagent-directory>/<name>/agent.py (a class `TritonRepoAgent` with
`model_action(action, model)`, or a module-level `model_action`), else built in (`checksum`); one instance per
agent for the whole server, as Triton shares an agent's library among models.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
from typing import Any

from protos import model_config_pb2 as mc
from service.core.repository import model_config as cfg
from service.core.repository.agents.checksum import ChecksumAgent
from service.core.repository.agents.model import (
    LOAD,
    LOAD_COMPLETE,
    LOAD_FAIL,
    UNLOAD,
    UNLOAD_COMPLETE,
    AgentModel,
)
from service.errors import ErrorCode, ServiceError

log = logging.getLogger("trireme.repoagent")

BUILT_IN: dict[str, type] = {"checksum": ChecksumAgent}

_Chain = list[tuple[Any, AgentModel]]


class RepoAgents:
    """The server's agents and, per model folder, the chain of the load that serves."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._agents: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._serving: dict[str, _Chain] = {}
        self._pending: dict[str, _Chain] = {}

    def _agent(self, name: str) -> Any:
        path = os.path.join(self.directory, name, "agent.py")
        with self._lock:
            if path in self._agents:
                return self._agents[path]
            if os.path.isfile(path):
                agent = _load_agent_file(name, path)
            elif name in BUILT_IN:
                agent = BUILT_IN[name]()
            else:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f"unable to find 'libtritonrepoagent_{name}.so' (or '{name}/agent.py') for repo agent "
                    f"'{name}', searched: {self.directory}",
                )
            self._agents[path] = agent
            return agent

    # ---- load ------------------------------------------------------------------------------------------------
    def load(self, model_name: str, model_dir: str, config: mc.ModelConfig) -> str:
        """Run LOAD of the config's agents (blocking); the folder to load the model from. ServiceError: an agent
        failed (or is missing), the load fails with its message."""
        chain: _Chain = []
        location = model_dir
        config_json = cfg.to_json(config)
        try:
            for spec in config.model_repository_agents.agents:
                agent = self._agent(spec.name)
                model = AgentModel(model_name, location, dict(spec.parameters), config_json)
                chain.append((agent, model))
                _invoke(agent, LOAD, model)
                location = model.new_location or location
        except BaseException:
            for _, model in chain:
                model.release()
            raise
        if chain:
            self._pending[model_dir] = chain
        return location

    def finish_load(self, model_dir: str, ok: bool, replace: bool = True) -> None:
        """LOAD_COMPLETE / LOAD_FAIL in reverse order; a completed chain replaces the one that served before
        (replace=False: nothing new started from it, e.g. an unchanged model: it is unloaded at once)."""
        chain = self._pending.pop(model_dir, None)
        if chain is None:
            return
        for agent, model in reversed(chain):
            _invoke_quietly(agent, LOAD_COMPLETE if ok else LOAD_FAIL, model)
        if not ok:
            for _, model in chain:
                model.release()
            return
        if not replace:
            _unload_begin(chain)
            _unload_end(chain)
            return
        previous = self._serving.pop(model_dir, None)
        self._serving[model_dir] = chain
        if previous:
            _unload_begin(previous)
            _unload_end(previous)

    def unload_begin(self, model_dir: str) -> None:
        """UNLOAD in order (before the model's versions stop)."""
        _unload_begin(self._serving.get(model_dir, []))

    def unload_end(self, model_dir: str) -> None:
        """UNLOAD_COMPLETE in reverse order (after they stopped); the agents' folders are removed."""
        _unload_end(self._serving.pop(model_dir, []))

    def unload_all(self) -> None:
        """Server shutdown: every serving chain is unloaded."""
        for name in list(self._serving):
            self.unload_begin(name)
            self.unload_end(name)

    async def run(self, fn: Any, *args: Any) -> Any:
        """An action off the event loop (agents may read and write files)."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _unload_begin(chain: _Chain) -> None:
    for agent, model in chain:
        _invoke_quietly(agent, UNLOAD, model)


def _unload_end(chain: _Chain) -> None:
    for agent, model in reversed(chain):
        _invoke_quietly(agent, UNLOAD_COMPLETE, model)
    for _, model in chain:
        model.release()


def _invoke(agent: Any, action: str, model: AgentModel) -> None:
    try:
        agent.model_action(action, model)
    except ServiceError:
        raise
    except Exception as e:
        raise ServiceError(ErrorCode.INTERNAL, f"repository agent failed on {action}: {e}") from None


def _invoke_quietly(agent: Any, action: str, model: AgentModel) -> None:
    """Actions after the load has its outcome: an error is logged, it changes nothing (as in Triton)."""
    try:
        _invoke(agent, action, model)
    except ServiceError as e:
        log.error("repository agent action %s for '%s' failed: %s", action, model.name, e.message)


def _load_agent_file(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"trireme_repoagent_{name}", path)
    if spec is None or spec.loader is None:
        raise ServiceError(ErrorCode.INVALID_ARG, f"repo agent '{name}': cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ServiceError(ErrorCode.INVALID_ARG, f"repo agent '{name}': {path} failed to import: {e}") from None
    if hasattr(module, "TritonRepoAgent"):
        return module.TritonRepoAgent()
    if hasattr(module, "model_action"):
        return module
    raise ServiceError(
        ErrorCode.INVALID_ARG, f"repo agent '{name}': {path} defines neither TritonRepoAgent nor model_action"
    )
