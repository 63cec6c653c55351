"""Flags of the OpenAI-compatible front end (Triton's python/openai frontend names; docs/openai.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# --openai-restricted-api groups and what each one covers (docs/openai.md)
OPENAI_API_GROUPS = ("inference", "embedding", "model-repository", "model-management", "metrics", "health")
TOOL_CALL_PARSERS = ("llama3", "mistral")


@dataclass(slots=True, frozen=True)
class OpenAIRestriction:
    """Requests to `groups` must carry HTTP header `key` with `value` (else 401)."""

    groups: frozenset[str]
    key: str
    value: str


@dataclass(slots=True)
class OpenAIOptions:
    """What the OpenAI front end takes from the command line; port None: the front end is off."""

    port: int | None = None
    address: str = "0.0.0.0"
    tokenizer: str = ""  # a local folder with tokenizer_config.json (chat_template) or chat_template.jinja
    chat_template: str = ""  # a Jinja file (or inline template) overriding every other template
    default_max_tokens: int = 16
    lora_separator: str = ""
    tool_call_parser: str = ""
    max_tool_call_parse_bytes: int = 1 << 20
    max_input_size: int = 64 << 20  # request body bytes (the --http-max-input-size value)
    restricted: list[OpenAIRestriction] = field(default_factory=list)


def add_openai_flags(p: argparse.ArgumentParser) -> None:
    """The OpenAI front end's flags (Triton's frontend names where they exist)."""
    g = p.add_argument_group("OpenAI-compatible front end (docs/openai.md)")
    g.add_argument(
        "--openai-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the OpenAI-compatible API (/v1/...) on this port, next to KServe HTTP/gRPC; 0 picks one (off)",
    )
    g.add_argument(
        "--openai-address", default="", metavar="ADDR", help="address the OpenAI API binds to (the --http-address)"
    )
    g.add_argument(
        "--tokenizer",
        default="",
        metavar="DIR",
        help="local tokenizer folder whose tokenizer_config.json (or chat_template.jinja) gives the chat template; "
        "nothing is downloaded (a built-in 'role: content' template)",
    )
    g.add_argument(
        "--chat-template", default="", metavar="FILE", help="Jinja chat template overriding every other one (none)"
    )
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=16,
        metavar="N",
        help="max_tokens sent to the model when a request sets none (16)",
    )
    g.add_argument(
        "--lora-separator",
        default="",
        metavar="SEP",
        help="model names '<model><SEP><lora>' select a LoRA adapter of the model (off)",
    )
    g.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default="",
        help="parse tool calls out of the generated text (llama3, mistral) (off)",
    )
    g.add_argument(
        "--max-tool-call-parse-bytes",
        type=int,
        default=1 << 20,
        metavar="BYTES",
        help="generated text longer than this is not parsed for tool calls and is sent as content (1048576)",
    )
    g.add_argument(
        "--openai-restricted-api",
        nargs=3,
        action="append",
        default=[],
        metavar=("APIS", "KEY", "VALUE"),
        help="requests to the comma-separated API groups must carry header KEY: VALUE (else 401); groups: "
        + ", ".join(OPENAI_API_GROUPS),
    )


def openai_options(args: argparse.Namespace, address: str, max_input_size: int) -> OpenAIOptions:
    """OpenAIOptions from parsed flags; SystemExit on an unknown or twice-restricted group."""
    restricted: list[OpenAIRestriction] = []
    seen: set[str] = set()
    for apis, key, value in args.openai_restricted_api:
        groups = frozenset(a.strip() for a in apis.split(",") if a.strip())
        unknown = sorted(groups - set(OPENAI_API_GROUPS))
        if unknown or not groups:
            raise SystemExit(
                f"--openai-restricted-api: unknown API group(s) '{apis}'; allowed: {', '.join(OPENAI_API_GROUPS)}"
            )
        if seen & groups:
            raise SystemExit(
                f"--openai-restricted-api: API group(s) {', '.join(sorted(seen & groups))} restricted more than once"
            )
        seen |= groups
        restricted.append(OpenAIRestriction(groups, key.strip().lower(), value))
    if args.default_max_tokens < 1:
        raise SystemExit("--default-max-tokens must be at least 1")
    return OpenAIOptions(
        port=args.openai_port,
        address=args.openai_address or address,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        default_max_tokens=args.default_max_tokens,
        lora_separator=args.lora_separator,
        tool_call_parser=args.tool_call_parser or "",
        max_tool_call_parse_bytes=max(0, args.max_tool_call_parse_bytes),
        max_input_size=max_input_size,
        restricted=restricted,
    )
