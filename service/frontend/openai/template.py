"""Chat templates: messages -> the prompt string sent as `text_input`. Nothing is downloaded.

Where a model's template comes from, first match wins:
1. `--chat-template FILE` (a Jinja file) for every model;
2. the model's own: `chat_template.jinja` or `tokenizer_config.json` (key `chat_template`) in the model's version
   folder or model folder, i.e. the files of a Hugging Face tokenizer copied next to the model;
3. `--tokenizer DIR`: the same two files in a local tokenizer folder;
4. a built-in template: one `role: content` line per message, then `assistant:`.
Jinja templates render as Hugging Face's `apply_chat_template` does (sandboxed Jinja2, `messages`, `tools`,
`add_generation_prompt`, the special tokens, `raise_exception`, `tojson`); jinja2 comes with the `openai` extra.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

from service.frontend.openai.errors import bad_request

TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")


class Template:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, tokens: dict[str, str], origin: str) -> None:
        self.origin = origin
        self.tokens = tokens
        env = _environment()
        from jinja2 import TemplateError

        try:
            self._compiled = env.from_string(source)
        except TemplateError as e:
            raise ValueError(f"the chat template of {origin} does not compile: {e}") from None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            return self._compiled.render(messages=messages, tools=tools, add_generation_prompt=True, **self.tokens)
        except Exception as e:  # raise_exception(), or messages the template cannot take: the request's fault
            raise bad_request(f"the chat template ({self.origin}) failed: {e}", "messages") from None


def default_render(messages: list[dict[str, Any]]) -> str:
    """The built-in template."""
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def _environment() -> Any:
    try:
        from jinja2 import ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # depends on the install
        raise ValueError("Jinja chat templates need jinja2: pip install 'trireme[openai]'") from None

    def raise_exception(message: str) -> None:
        from jinja2 import TemplateError

        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_folder(folder: str) -> Template | None:
    """The template of a tokenizer (or model) folder, or None when it has none; ValueError when unreadable."""
    jinja_path = os.path.join(folder, "chat_template.jinja")
    config_path = os.path.join(folder, "tokenizer_config.json")
    config: dict[str, Any] = {}
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read {config_path}: {e}") from None
    tokens = {k: t for k, v in config.items() if k.endswith("_token") and (t := _token_text(v)) is not None}
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return Template(f.read(), tokens, jinja_path)
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    if isinstance(source, str):
        return Template(source, tokens, config_path)
    return None


class ChatTemplates:
    """The template of each model, found once per model folder."""

    def __init__(self, tokenizer: str = "", chat_template: str = "") -> None:
        self.override: Template | None = None
        self.tokenizer: Template | None = None
        if chat_template:
            try:
                with open(chat_template, encoding="utf-8") as f:
                    self.override = Template(f.read(), {}, chat_template)
            except OSError as e:
                raise ValueError(f"--chat-template: {e}") from None
        if tokenizer:
            if not os.path.isdir(tokenizer):
                raise ValueError(f"--tokenizer '{tokenizer}' is not a folder (only local tokenizers are read)")
            self.tokenizer = load_folder(tokenizer)
            if self.tokenizer is None:
                raise ValueError(f"--tokenizer '{tokenizer}' has no chat_template.jinja or tokenizer_config.json "
                                 "with a chat_template")  # fmt: skip
        self._models: dict[str, Template | None] = {}

    def for_model(self, model_dir: str, version_dir: str) -> Template | None:
        """The template a model uses (None: the built-in one)."""
        if self.override is not None:
            return self.override
        if version_dir not in self._models:
            found = None
            for folder in (version_dir, model_dir):
                if any(os.path.isfile(os.path.join(folder, f)) for f in TEMPLATE_FILES):
                    try:
                        found = load_folder(folder)
                    except ValueError as e:
                        raise bad_request(str(e)) from None
                    if found is not None:
                        break
            self._models[version_dir] = found
        return self._models[version_dir] or self.tokenizer

    def render(
        self, template: Template | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        """The prompt for `messages` (and `tools`, which the built-in template leaves out)."""
        if template is None:
            return default_render(messages)
        return template.render(messages, tools)
