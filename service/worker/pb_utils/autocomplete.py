"""pb_utils.ModelConfig: what auto_complete_config receives and edits."""

from __future__ import annotations

import json
from typing import Any


class ModelConfig:
    """The config handed to auto_complete_config; edits build the completed config."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._model_config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        )

    def as_dict(self) -> dict[str, Any]:
        """The config as a dict."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size unless the config already has a larger non-zero one."""
        current = int(self._model_config.get("max_batch_size", 0))
        if current != 0 and current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._model_config.get('name', '')}' specified max_batch_size "
                f"{max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Enable dynamic batching (not allowed with sequence batching or ensembles)."""
        cfg = self._model_config
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in cfg:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    "function for model '" + cfg.get("name", "") + "' tries to set scheduling_choice as "
                    "'dynamic_batching'"
                )
        cfg.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: set[str]) -> None:
        extra = set(tensor) - allowed
        if extra:
            raise ValueError(
                f"{kind} '{tensor.get('name', '')}' in auto-complete-config has unexpected keys {sorted(extra)}"
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config must have 'name'")
        entries = self._model_config.setdefault(kind, [])
        for entry in entries:
            if entry.get("name") == tensor["name"]:
                for key in ("data_type", "dims"):
                    if (
                        key in tensor
                        and key in entry
                        and entry[key] not in ("TYPE_INVALID", [])
                        and entry[key] != tensor[key]
                    ):
                        raise ValueError(
                            f"unable to load model '{self._model_config.get('name', '')}', configuration expects "
                            f"{key} {entry[key]} for {kind} '{tensor['name']}', model provides {tensor[key]}"
                        )
                entry.update(tensor)
                return
        entries.append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        """Add (or merge) an input entry: name, data_type, dims[, optional]."""
        self._add_tensor("input", input, {"name", "data_type", "dims", "optional"})

    def add_output(self, output: dict[str, Any]) -> None:
        """Add (or merge) an output entry: name, data_type, dims."""
        self._add_tensor("output", output, {"name", "data_type", "dims"})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set model_transaction_policy, e.g. {"decoupled": True}."""
        self._model_config["model_transaction_policy"] = dict(transaction_policy_dict)
