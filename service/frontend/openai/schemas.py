"""The request bodies of the OpenAI API this front end serves, as msgspec Structs: decoding validates them.

Unknown fields are ignored (clients send newer fields); fields of the wrong type or out of range, and messages
of the wrong shape (unknown role, missing content) are 400 with msgspec's message naming the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from service.frontend.openai.errors import bad_request

T = TypeVar("T")

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
Probability = Annotated[float, msgspec.Meta(ge=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
ChoiceCount = Annotated[int, msgspec.Meta(ge=1, le=128)]


class _Base(msgspec.Struct, omit_defaults=True, kw_only=True):
    pass


class ContentPart(_Base):
    """One part of a multi-part message content (only text parts can be served)."""

    type: str
    text: str | None = None


Content = str | list[ContentPart]


class FunctionCall(_Base):
    name: str
    arguments: str = ""


class ToolCall(_Base):
    function: FunctionCall
    id: str = ""
    type: str = "function"


class SystemMessage(_Base, tag_field="role", tag="system"):
    content: Content
    name: str | None = None


class DeveloperMessage(_Base, tag_field="role", tag="developer"):
    content: Content
    name: str | None = None


class UserMessage(_Base, tag_field="role", tag="user"):
    content: Content
    name: str | None = None


class AssistantMessage(_Base, tag_field="role", tag="assistant"):
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Base, tag_field="role", tag="tool"):
    content: Content
    tool_call_id: str


class FunctionMessage(_Base, tag_field="role", tag="function"):
    name: str
    content: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage


class FunctionDefinition(_Base):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Base):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(_Base):
    name: str


class NamedToolChoice(_Base):
    function: NamedFunction
    type: Literal["function"] = "function"


class StreamOptions(_Base):
    include_usage: bool = False


class _Sampling(_Base):
    """Fields chat and text completions share."""

    model: str
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: ChoiceCount | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling, kw_only=True):
    """POST /v1/completions."""

    prompt: str | list[Any]
    echo: bool = False
    suffix: str | None = None
    best_of: PositiveInt | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None


class EmbeddingRequest(_Base):
    """POST /v1/embeddings."""

    model: str
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None


_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def decode(body: bytes, kind: type[T]) -> T:
    """The body as `kind`; 400 for malformed JSON or a field of the wrong shape (naming the field)."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        text = str(e)
        m = _PATH.search(text)
        raise bad_request(f"Invalid request: {text}", m.group(1) if m else None) from None
    except msgspec.DecodeError as e:
        raise bad_request(f"Invalid JSON body: {e}") from None


def message_text(content: Content | None) -> str:
    """A message content as one string (text parts joined by newlines); 400 for non-text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad_request(f"Only text content parts are supported, got a part of type '{part.type}'", "messages")
        texts.append(part.text)
    return "\n".join(texts)
