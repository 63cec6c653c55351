"""The OpenAI front end's pure parts: tool-call parsers (llama3, mistral, the byte cap, streaming hold-back),
chat templates from a tokenizer folder or the model folder, and flag parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.config.flags import parse_args
from service.frontend.openai.errors import OpenAIError
from service.frontend.openai.limits import Limits
from service.frontend.openai.template import ChatTemplates, default_render
from service.frontend.openai.tools import Llama3Parser, MistralParser


def _calls(calls: list) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_llama3_parses_one_or_more_calls() -> None:
    parser = Llama3Parser(1 << 20)
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": "z"}}'
    content, calls = parser.parse(text)
    assert content == "" and _calls(calls) == [("a", {"x": 1}), ("b", {"y": "z"})]
    assert all(c.id.startswith("call_") for c in calls)
    assert _calls(parser.parse('{"name": "a", "parameters": {}}')[1]) == [("a", {})]
    assert parser.parse("plain text") == ("plain text", [])
    assert parser.parse('{"not": "a call"}') == ('{"not": "a call"}', [])  # no name: content


def test_mistral_parses_the_array_and_ids() -> None:
    parser = MistralParser(1 << 20)
    content, calls = parser.parse('[TOOL_CALLS] [{"name": "f", "arguments": {"q": "é"}}]')
    assert content == "" and _calls(calls) == [("f", {"q": "é"})]
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    assert parser.parse("[1] a list, not a call") == ("[1] a list, not a call", [])


def test_the_byte_cap_leaves_long_text_unparsed() -> None:
    call = '{"name": "f", "parameters": {"pad": "' + "x" * 100 + '"}}'
    assert Llama3Parser(50).parse(call) == (call, [])
    assert _calls(Llama3Parser(1000).parse(call)[1])[0][0] == "f"


def test_streaming_holds_back_calls_and_streams_content() -> None:
    parser = Llama3Parser(1 << 20)
    pieces = ["<|python", "_tag|>", '{"name": "f", ', '"parameters": {"a": 1}}']
    assert [parser.feed(p) for p in pieces] == ["", "", "", ""]
    content, calls = parser.finish()
    assert content == "" and _calls(calls) == [("f", {"a": 1})]
    plain = Llama3Parser(1 << 20)
    assert [plain.feed(p) for p in ["Hello", " world"]] == ["Hello", " world"]
    assert plain.finish() == ("", [])
    capped = Llama3Parser(10)
    assert capped.feed('{"name": "f", ') == '{"name": "f", '  # over the cap: released as content
    assert capped.feed("more") == "more"


def test_templates_from_tokenizer_and_model_folder(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": {"content": "<s>"},
                "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}",
            }
        )
    )
    model = tmp_path / "model"
    (model / "1").mkdir(parents=True)
    templates = ChatTemplates(str(tok))
    messages = [{"role": "user", "content": "hi"}]
    assert (
        templates.render(templates.for_model(str(model), str(model / "1")), messages, None) == "<s>[user]hi[assistant]"
    )
    (model / "1" / "chat_template.jinja").write_text("{{ messages | length }} {{ tools | tojson }}")
    fresh = ChatTemplates(str(tok))  # templates are read once per model version folder
    rendered = fresh.render(fresh.for_model(str(model), str(model / "1")), messages, [{"name": "é"}])
    assert rendered == '1 [{"name": "é"}]'
    assert default_render(messages) == "user: hi\nassistant:"


def test_template_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        ChatTemplates(str(tmp_path / "missing"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ raise_exception('no') }}"}))
    templates = ChatTemplates(str(tmp_path))
    with pytest.raises(OpenAIError, match="no"):
        templates.render(templates.tokenizer, [], None)


def test_openai_flags() -> None:
    config = parse_args([])
    assert config.openai.port is None  # off unless set
    config = parse_args(
        [
            "--openai-port",
            "9000",
            "--tool-call-parser",
            "mistral",
            "--openai-restricted-api",
            "inference,health",
            "K",
            "v",
        ]
    )
    assert config.openai.port == 9000 and config.openai.tool_call_parser == "mistral"
    assert config.openai.restricted[0].groups == {"inference", "health"} and config.openai.restricted[0].key == "k"
    with pytest.raises(SystemExit):
        parse_args(["--openai-restricted-api", "bogus", "k", "v"])
    with pytest.raises(SystemExit):
        parse_args(["--openai-restricted-api", "inference", "a", "b", "--openai-restricted-api", "inference", "c", "d"])


def test_limits_stop_strings_and_max_tokens() -> None:
    limits = Limits(["STOP", "END"], None)
    assert limits.feed("hello S") == ("hello ", False)  # "S" may begin "STOP": held back
    assert limits.feed("TO") == ("", False)
    assert limits.feed("P and more") == ("", True)  # "STOP" complete: nothing after it
    limits = Limits(["STOP"], None)
    assert limits.feed("a ST") == ("a ", False)
    assert limits.feed("AY") == ("STAY", False)  # not a stop after all: released
    assert limits.flush() == ""
    counted = Limits([], 2)
    assert counted.feed("a") == ("a", False) and counted.feed("b") == ("b", True)
    held = Limits(["XY"], 2)
    assert held.feed("aX") == ("a", False) and held.feed("b") == ("Xb", True)  # max_tokens releases what is held


def test_no_repository_serves_the_example_repository() -> None:
    config = parse_args(["--openai-port", "0"])
    assert config.using_example_repository
    assert Path(config.model_repositories[0], "mock_llm", "config.pbtxt").is_file()
