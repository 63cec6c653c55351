"""AgentModel: what an agent's `model_action(action, model)` gets (Triton's TRITONREPOAGENT_AgentModel calls)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

# Triton's TRITONREPOAGENT_ActionType values, as the strings agents receive
LOAD, LOAD_COMPLETE, LOAD_FAIL = "LOAD", "LOAD_COMPLETE", "LOAD_FAIL"
UNLOAD, UNLOAD_COMPLETE = "UNLOAD", "UNLOAD_COMPLETE"


@dataclass(slots=True, eq=False)
class AgentModel:
    """One model as one agent sees it, for the whole life of a load (LOAD ... UNLOAD_COMPLETE).

    `location`: the model's folder this agent reads (the previous agent's output, else the repository's);
    `parameters`: the agent's parameters from config.pbtxt; `config`: the model's config as Triton's JSON;
    `state`: anything the agent keeps between actions (TRITONREPOAGENT_ModelSetState).
    """

    name: str
    location: str
    parameters: dict[str, str]
    config_json: str
    state: Any = None
    artifact_type: str = "FILESYSTEM"  # TRITONREPOAGENT_ARTIFACT_FILESYSTEM: a local folder
    _mutable: str = ""
    _new_location: str = ""
    _owned: list[str] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        """The model's configuration (TRITONREPOAGENT_ModelConfig), a JSON object."""
        return dict(json.loads(self.config_json))

    def acquire_mutable_location(self) -> str:
        """A new empty folder the agent may fill (TRITONREPOAGENT_ModelRepositoryLocationAcquire); removed by
        the server after UNLOAD_COMPLETE or LOAD_FAIL."""
        if not self._mutable:
            self._mutable = tempfile.mkdtemp(prefix=f"trireme-repoagent-{self.name}-")
            self._owned.append(self._mutable)
        return self._mutable

    def set_location(self, path: str) -> None:
        """Load the model from `path` from now on (TRITONREPOAGENT_ModelRepositoryUpdate), e.g. the decrypted copy
        written into acquire_mutable_location()); later actions see it as `location`."""
        self._new_location = self.location = path

    @property
    def new_location(self) -> str:
        """The folder the next agent and the load use ("" = unchanged)."""
        return self._new_location

    def release(self) -> None:
        """Remove the folders acquire_mutable_location() made (TRITONREPOAGENT_ModelRepositoryLocationRelease)."""
        for path in self._owned:
            shutil.rmtree(path, ignore_errors=True)
        self._owned.clear()
        self._mutable = ""
