"""The config parameter that picks where a model's instances run: worker processes (default) or in-process."""

from __future__ import annotations

from typing import Any

MODE_KEY = "TRIREME_INSTANCE_MODE"
MODES = ("process", "in_process", "in_process_inline")


def instance_mode(parameters: Any) -> str:
    """The mode a model config's `parameters` map asks for ("process" when unset); ValueError if unknown."""
    if MODE_KEY not in parameters:
        return "process"
    value = parameters[MODE_KEY].string_value.strip().lower()
    if value not in MODES:
        raise ValueError(f"parameter '{MODE_KEY}' must be one of {', '.join(MODES)}, not '{value}'")
    return value
