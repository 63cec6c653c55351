"""What every OpenAI handler shares: the engine, the options, templates, and model name resolution (LoRA)."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from service.config.openai import OpenAIOptions
from service.core.engine import Engine
from service.errors import ErrorCode, ServiceError
from service.frontend.openai.convert import Contract
from service.frontend.openai.errors import bad_request, model_not_found
from service.frontend.openai.template import ChatTemplates, Template
from service.frontend.openai.tools import PARSERS, ToolParser

LORA_FILE = "multi_lora.json"  # {lora name: adapter path}, in the model's version folder (as Triton reads it)


@dataclass(slots=True)
class Target:
    """The model an OpenAI `model` name resolves to."""

    name: str  # as the client wrote it (echoed in responses)
    model: str  # the model in the repository
    lora: str | None
    contract: Contract
    model_dir: str
    version: int


@dataclass
class Context:
    engine: Engine
    options: OpenAIOptions
    templates: ChatTemplates
    created: int = field(default_factory=lambda: int(time.time()))

    def target(self, name: str) -> Target:
        """Resolve `name` (`model` or `model<sep>lora`); 404 for an unknown model, 400 for an unknown LoRA."""
        model, lora = name, None
        sep = self.options.lora_separator
        if sep and sep in name:
            model, _, lora = name.partition(sep)
        try:
            meta = self.engine.model_metadata(model)
            model_dir, version = self.engine.model_location(model)
        except ServiceError as e:
            if e.code == ErrorCode.NOT_FOUND:
                raise model_not_found(name) from None
            raise
        if lora is not None:
            known = lora_names(model_dir, version)
            if known is not None and lora not in known:
                raise bad_request(f"Unknown LoRA: {lora}; for model: {model}", "model")
        return Target(name, model, lora, Contract(meta), model_dir, version)

    def template(self, target: Target) -> Template | None:
        """The chat template of the target's model."""
        return self.templates.for_model(target.model_dir, os.path.join(target.model_dir, str(target.version)))

    def tool_parser(self) -> ToolParser | None:
        """A fresh parser for one choice (None without --tool-call-parser)."""
        kind = PARSERS.get(self.options.tool_call_parser)
        return kind(self.options.max_tool_call_parse_bytes) if kind is not None else None

    def model_ids(self) -> list[str]:
        """Every READY model, and `model<sep>lora` for its LoRA adapters when --lora-separator is set."""
        ids: list[str] = []
        for row in self.engine.repository_index(ready_only=True):
            if row.name in ids:
                continue
            ids.append(row.name)
            if self.options.lora_separator:
                model_dir, version = self.engine.model_location(row.name)
                ids += [f"{row.name}{self.options.lora_separator}{n}" for n in lora_names(model_dir, version) or []]
        return ids

    def model_json(self, model_id: str) -> dict[str, Any]:
        """OpenAI's Model object."""
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "trireme"}


def lora_names(model_dir: str, version: int) -> list[str] | None:
    """The LoRA adapters listed in the version's multi_lora.json (None when it has none)."""
    path = os.path.join(model_dir, str(version), LORA_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return [str(k) for k in value] if isinstance(value, dict) else None


def request_id(prefix: str) -> str:
    """A response id as OpenAI forms them."""
    return f"{prefix}-{uuid.uuid4().hex}"
