"""The parser registry and the per-family hooks render and derender ask instead of naming families."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from render_service import parsers
from render_service.parsers import held, registry
from render_service.parsers.hermes import HermesState, HermesToolParser
from render_service.parsers.protocols import ParserState, RequestAdjustment, ToolParser
from render_service.parsers.qwen3 import Qwen3ReasoningParser


@pytest.fixture(scope="module")
def tok(qwen3_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


def test_names_and_aliases_resolve_to_their_classes() -> None:
    assert {"qwen3", "deepseek_r1"} <= set(parsers.reasoning_parser_names())
    assert {"hermes", "qwen3_json"} <= set(parsers.tool_parser_names())
    assert parsers.tool_parser_class("qwen3_json") is HermesToolParser
    assert HermesToolParser.name == "hermes"  # the canonical name, not the alias
    assert parsers.reasoning_parser_class("qwen3") is Qwen3ReasoningParser
    with pytest.raises(ValueError, match="unknown tool parser"):
        parsers.tool_parser_class("nope")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        parsers.reasoning_parser_class("nope")


def test_a_name_cannot_be_registered_twice() -> None:
    class Other(HermesToolParser):
        pass

    with pytest.raises(ValueError, match="registered twice"):
        registry.register_tool_parser("hermes")(Other)
    assert parsers.tool_parser_class("hermes") is HermesToolParser


def test_json_tool_choice_paths_serve_parsers_without_a_structural_tag() -> None:
    class JsonPaths(ToolParser):  # no structural tag model: vLLM would use its JSON paths
        state_type = HermesState

        def feed(self, st: Any, text: str, tool_id: Any) -> None:
            return None

        def remaining_args(self, st: Any) -> str:
            return ""

        def extract_tool_calls(self, model_output: str) -> tuple[bool, list[Any], str | None]:
            return False, [], model_output

    assert JsonPaths.supports_required_and_named  # required/named then take forced.py's paths
    for name in ("pythonic", "llama4_pythonic", "granite4"):
        assert parsers.tool_parser_class(name).supports_required_and_named
    for name in ("hermes", "llama3_json", "llama4_json"):
        assert not parsers.tool_parser_class(name).supports_required_and_named


def test_families_answer_for_their_render_side_effects() -> None:
    req = RequestAdjustment(has_tools=True, tool_choice="auto", skip_special_tokens=None)
    assert parsers.adjust_request(None, "hermes", req).skip_special_tokens is False
    req = RequestAdjustment(has_tools=True, tool_choice="none", skip_special_tokens=True)
    assert parsers.adjust_request("deepseek_r1", "hermes", req).skip_special_tokens is True
    req = RequestAdjustment(has_tools=False, tool_choice="none", skip_special_tokens=True)
    assert parsers.adjust_request("qwen3", None, req).skip_special_tokens is False
    assert parsers.thinking_enabled("qwen3", {"enable_thinking": False}) is False
    assert parsers.thinking_enabled("deepseek_r1", {"enable_thinking": False}) is True
    assert parsers.thinking_enabled(None, None) is True
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    tag = HermesToolParser.structural_tag(tools, [True], "auto")
    assert tag is not None and tag["triggers"] == ["<tool_call>"]
    assert [t["begin"] for t in tag["tags"]] == [
        '<tool_call>\n{"name": "f", "arguments": ',
        '<tool_call>{"name": "f", "arguments": ',
    ]


def test_prompt_ends_reasoning_is_the_parsers_check(tok: Any) -> None:
    think, end, start = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<|im_start|>"))
    open_prompt = [start, *tok.encode("assistant\n"), think]
    closed = [*open_prompt, *tok.encode("x"), end]
    assert not parsers.prompt_ends_reasoning(tok, "qwen3", open_prompt, {})
    assert parsers.prompt_ends_reasoning(tok, "qwen3", closed, {})
    assert parsers.prompt_ends_reasoning(tok, "qwen3", [start], {"enable_thinking": False})
    assert parsers.prompt_ends_reasoning(tok, "deepseek_r1", closed, {})
    assert not parsers.prompt_ends_reasoning(tok, "deepseek_r1", open_prompt, {"enable_thinking": False})


def test_states_are_tagged_with_family_and_version(tok: Any) -> None:
    parser = parsers.get_parser(tok, "qwen3", "hermes", enable_auto_tools=True)
    assert parser is not None
    state = parsers.new_parsed_stream(parser, [tok.convert_tokens_to_ids("<|im_start|>")])
    obj = json.loads(json.dumps(state.to_obj()))
    assert obj[0] == parsers.chat.STATE_VERSION
    reasoning_obj, tool_obj = obj[2][6], obj[2][7]  # after the tag and the five flags
    assert reasoning_obj[0] == "qwen3/2" and tool_obj[0] == "hermes/3"
    assert parsers.load_parsed_stream(parser, obj).to_obj() == obj

    stale = json.loads(json.dumps(obj))
    stale[2][7][0] = "hermes/1"
    with pytest.raises(ValueError, match="unsupported parser state"):
        parsers.load_parsed_stream(parser, stale)
    swapped = json.loads(json.dumps(obj))
    swapped[2][6], swapped[2][7] = swapped[2][7], swapped[2][6]
    with pytest.raises(ValueError, match="unsupported parser state"):
        parsers.load_parsed_stream(parser, swapped)
    reasoning_only = parsers.get_parser(tok, "qwen3", None, enable_auto_tools=True)
    assert reasoning_only is not None
    with pytest.raises(ValueError, match="does not match"):
        parsers.load_parsed_stream(reasoning_only, obj)


def test_every_registered_state_is_an_array_like_tagged_struct() -> None:
    for name in parsers.reasoning_parser_names():
        cls: Any = parsers.reasoning_parser_class(name)
        _check_state_type(cls.state_type)
    for name in parsers.tool_parser_names():
        _check_state_type(parsers.tool_parser_class(name).state_type)


def _check_state_type(state_type: type[ParserState]) -> None:
    config = state_type.__struct_config__
    assert config.array_like and isinstance(config.tag, str) and "/" in config.tag, state_type
    fresh = state_type()
    # Held text (`parsers.held.HeldText` fields) needs the held hooks, as `to_obj`/`load_state` pass them.
    obj = msgspec.to_builtins(fresh, enc_hook=held.encode_hook())
    assert msgspec.convert(obj, state_type, dec_hook=held.decode_hook) == fresh
