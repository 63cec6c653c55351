"""Tool-call parsers (`--tool-call-parser llama3|mistral`): generated text -> OpenAI `tool_calls`.

* llama3: `<|python_tag|>` (optional) then one or more JSON objects `{"name": ..., "arguments"|"parameters": {...}}`
  separated by `;` (Llama 3.1-3.3's JSON tool calling).
* mistral: `[TOOL_CALLS]` (optional) then a JSON array of `{"name": ..., "arguments": {...}}` (Mistral Instruct).

Text that does not parse is content, as the model wrote it. Parsing is capped: text longer than
`--max-tool-call-parse-bytes` is never parsed (it is content), so a long generation cannot make the server parse
megabytes of JSON. When streaming, text that may be a tool call (it starts with a marker) is held back until the
generation ends and then sent as one `tool_calls` delta per call (name and complete arguments); any other text
streams as content at once. Arguments are not streamed piece by piece.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Any

_ALNUM = string.ascii_letters + string.digits


@dataclass(slots=True)
class ToolCall:
    """One parsed call; `arguments` is a JSON string, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def as_json(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI tool_call object (with `index` in streamed deltas)."""
        out: dict[str, Any] = {} if index is None else {"index": index}
        out.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        return out


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class ToolParser:
    """Base: the marker logic and the byte cap; subclasses parse the text after the marker."""

    token = ""  # the special token that starts a tool call
    opening = ""  # the JSON character a tool call may start with instead

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buffer: list[str] = []
        self._size = 0
        self._state = "undecided"  # then "tool" (held back) or "content" (streamed)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a complete generation; no calls when it is not a (well-formed) tool call."""
        stripped = text.lstrip()
        if len(text.encode()) > self.max_bytes or not self._starts_call(stripped):
            return text, []
        try:
            calls = self._calls(stripped.removeprefix(self.token).strip())
        except (ValueError, TypeError, KeyError, AttributeError):
            return text, []
        return ("", calls) if calls else (text, [])

    def _starts_call(self, text: str) -> bool:
        return text.startswith(self.token) or text.startswith(self.opening)

    def _calls(self, body: str) -> list[ToolCall]:
        raise NotImplementedError

    # ---- streaming -----------------------------------------------------------------------------------------
    def feed(self, delta: str) -> str:
        """Content that can be sent now (text that cannot be a tool call); the rest is held back."""
        if self._state == "content":
            return delta
        self._buffer.append(delta)
        self._size += len(delta.encode())
        if self._state == "undecided":
            head = "".join(self._buffer).lstrip()
            if not head:
                return ""
            if self._starts_call(head):
                self._state = "tool"
            elif not self.token.startswith(head):  # not even a prefix of the marker: plain content
                return self._release()
        if self._size > self.max_bytes:  # too long to parse: it is content after all
            return self._release()
        return ""

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the generation: (held-back content, calls)."""
        if self._state == "content" or not self._buffer:
            return "", []
        text = "".join(self._buffer)
        self._buffer, self._state = [], "content"
        return self.parse(text)

    def _release(self) -> str:
        text = "".join(self._buffer)
        self._buffer, self._state = [], "content"
        return text


class Llama3Parser(ToolParser):
    token = "<|python_tag|>"
    opening = "{"

    def _calls(self, body: str) -> list[ToolCall]:
        decoder = json.JSONDecoder()
        calls, pos = [], 0
        while pos < len(body):
            obj, end = decoder.raw_decode(body, pos)
            args = obj["arguments"] if "arguments" in obj else obj["parameters"]
            calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", str(obj["name"]), _arguments(args)))
            pos = end
            while pos < len(body) and body[pos] in "; \n\t\r":
                pos += 1
        return calls


class MistralParser(ToolParser):
    token = "[TOOL_CALLS]"
    opening = "["
    _ARRAY = re.compile(r"\[\s*\{.*\}\s*\]", re.DOTALL)

    def _calls(self, body: str) -> list[ToolCall]:
        try:
            items = json.loads(body)
        except ValueError:
            m = self._ARRAY.search(body)
            if m is None:
                raise
            items = json.loads(m.group(0))
        if isinstance(items, dict):
            items = [items]
        # Mistral's tool call ids are 9 alphanumeric characters
        return [
            ToolCall("".join(secrets.choice(_ALNUM) for _ in range(9)), str(i["name"]), _arguments(i["arguments"]))
            for i in items
        ]


PARSERS: dict[str, type[ToolParser]] = {"llama3": Llama3Parser, "mistral": MistralParser}
