"""Kimi K2 (`kimi_k2` reasoning and tool parsers): vLLM 0.33's `KimiK2Parser` engine config and hooks.

    <think>...</think>
    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Tokyo"}<|tool_call_end|>
    <|tool_calls_section_end|>

Run by the shared engine port (`engine.py`) as vLLM runs it: a reasoning adapter and a tool adapter,
each with its own engine. Kimi's quirks, kept:

- the header before `<|tool_call_argument_begin|>` is the tool-call id, verbatim (`functions.NAME:N`,
  the longest `.+:\\d+` prefix of the stripped header); the name is its part before `:` without
  `functions.`; a header that does not parse gives no call (unless the arguments carry a
  `"name": "..."`);
- the name goes out with the first argument text, in the same delta; the arguments stream as JSON
  text (a top-level closing brace is held until more text or the end confirms it); batch arguments
  are the stripped text (or "{}");
- text after `<|tool_calls_section_end|>` is dropped (the engine stays in a tool state);
- `thinking` / `enable_thinking` in the chat template kwargs (default: thinking) choose the config:
  without thinking there are no reasoning terminals, the output is all content, and `<think>` /
  `</think>` are dropped as special tokens;
- render: the reasoning parser sets `skip_special_tokens=False`; the tool parser does when the request
  has tools and `tool_choice` is not "none"; required/named/strict tools get xgrammar's builtin `kimi`
  structural tag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import ToolCallDelta, ToolIdFn, json_schema_format
from render_service.parsers.engine import (
    CONTENT,
    REASONING,
    REASONING_END,
    TOOL_ARGS,
    TOOL_BETWEEN,
    TOOL_END,
    TOOL_NAME,
    TOOL_PREAMBLE,
    TOOL_START,
    EngineConfig,
    EngineParser,
    EngineReasoningAdapter,
    EngineState,
    EngineToolAdapter,
)
from render_service.parsers.protocols import RequestAdjustment
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_SECTION_START = "<|tool_calls_section_begin|>"
TOOL_SECTION_END = "<|tool_calls_section_end|>"
TOOL_CALL_START = "<|tool_call_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"
TOOL_ARG_START = "<|tool_call_argument_begin|>"

_TOOL_ID_RE = re.compile(r"(?P<id>.+:\d+)")


@cache
def kimi_k2_config(thinking: bool = True) -> EngineConfig:
    reasoning_terminals = {"THINK_START": THINK_START, "THINK_END": THINK_END} if thinking else {}
    reasoning_transitions = (
        {
            (REASONING, "THINK_START"): (REASONING, ()),
            (REASONING, "THINK_END"): (CONTENT, (REASONING_END,)),
            (CONTENT, "THINK_END"): (CONTENT, ()),
        }
        if thinking
        else {}
    )
    tool_terminals = {
        "TOOL_SECTION_START": TOOL_SECTION_START,
        "TOOL_SECTION_END": TOOL_SECTION_END,
        "TOOL_START": TOOL_CALL_START,
        "TOOL_END": TOOL_CALL_END,
        "ARG_START": TOOL_ARG_START,
    }
    return EngineConfig(
        name="kimi_k2",
        initial_state=REASONING if thinking else CONTENT,
        wait_for_reasoning=thinking,
        terminals={**reasoning_terminals, **tool_terminals},
        token_id_terminals={**reasoning_terminals, **tool_terminals},
        transitions={
            **reasoning_transitions,
            (REASONING, "TOOL_SECTION_START"): (TOOL_PREAMBLE, (REASONING_END,)),
            (CONTENT, "TOOL_SECTION_START"): (TOOL_PREAMBLE, ()),
            (TOOL_PREAMBLE, "TOOL_START"): (TOOL_NAME, (TOOL_START,)),
            (TOOL_NAME, "ARG_START"): (TOOL_ARGS, ()),
            (TOOL_ARGS, "TOOL_END"): (TOOL_BETWEEN, (TOOL_END,)),
            (TOOL_ARGS, "TOOL_SECTION_END"): (TOOL_PREAMBLE, (TOOL_END,)),
            (TOOL_BETWEEN, "TOOL_START"): (TOOL_NAME, (TOOL_START,)),
            (TOOL_PREAMBLE, "TOOL_SECTION_END"): (TOOL_PREAMBLE, ()),
            (TOOL_BETWEEN, "TOOL_SECTION_END"): (TOOL_PREAMBLE, ()),
        },
        tool_args_json=True,
        strip_trailing_reasoning_whitespace=True,
        drop_whitespace_only_content_before_tools=True,
        strip_content_whitespace_with_tools=False,
    )


def _thinking(template_kwargs: Mapping[str, Any]) -> bool:
    thinking = template_kwargs.get("thinking")
    enable_thinking = template_kwargs.get("enable_thinking")
    if thinking is None and enable_thinking is None:
        return True
    return bool(thinking) or bool(enable_thinking)


def _id_and_name(header: str | None) -> tuple[str | None, str | None]:
    if header is None:
        return None, None
    m = _TOOL_ID_RE.match(header.strip())
    if not m:
        return None, None
    tool_id = m.group("id").strip()
    return tool_id, tool_id.split(":")[0].removeprefix("functions.")


class KimiK2Engine(EngineParser):
    def __init__(self, info: TokenizerInfo, thinking: bool) -> None:
        super().__init__(info, kimi_k2_config(thinking))
        self.thinking = thinking
        self.section_start_id = info.token_to_id(TOOL_SECTION_START)

    def _emit_name_delta(
        self, st: EngineState, index: int, calls: list[ToolCallDelta], name: str | None, tool_id: ToolIdFn
    ) -> None:
        call_id, tool_name = _id_and_name(name)
        if not tool_name:
            if 0 <= index < len(st.slots):
                st.slots[index].name = ""
            return
        st.slots[index].id = call_id or ""
        super()._emit_name_delta(st, index, calls, tool_name, tool_id)

    def _handle_tool_end(self, st: EngineState, index: int, calls: list[ToolCallDelta], tool_id: ToolIdFn) -> None:
        if 0 <= index < len(st.slots) and not st.slots[index].name_sent:
            call_id, tool_name = _id_and_name(st.slots[index].name)
            if tool_name:
                st.slots[index].id = call_id or ""
                st.slots[index].name = tool_name
        super()._handle_tool_end(st, index, calls, tool_id)

    def _handle_arg_chunk(
        self, st: EngineState, index: int, value: str, calls: list[ToolCallDelta], tool_id: ToolIdFn
    ) -> None:
        sent_before = 0 <= index < len(st.slots) and st.slots[index].name_sent
        super()._handle_arg_chunk(st, index, value, calls, tool_id)
        if value and not sent_before and 0 <= index < len(st.slots) and st.slots[index].name_sent:
            calls.append(ToolCallDelta(index=index, arguments=value))

    def _extract_args_json(self, raw: str, name: str) -> str:
        return raw.strip() or "{}"

    def extract_content_ids(self, input_ids: Sequence[int]) -> Sequence[int]:
        if not self.thinking:
            return input_ids
        end_id = self.t.end_id
        if end_id is not None and end_id in input_ids:
            last = len(input_ids) - 1 - list(input_ids)[::-1].index(end_id)
            return input_ids[last + 1 :]
        section = self.section_start_id
        if section is not None and section in input_ids:
            last = len(input_ids) - 1 - list(input_ids)[::-1].index(section)
            return input_ids[last:]
        return []

    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        if not self.thinking:
            return None, model_output
        return super().extract_reasoning(model_output)


@register_reasoning_parser("kimi_k2")
class KimiK2ReasoningParser(EngineReasoningAdapter):
    version = 1

    @classmethod
    def make_engine(cls, info: TokenizerInfo, thinking: bool) -> EngineParser:
        return KimiK2Engine(info, thinking)

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _thinking(template_kwargs)


@register_tool_parser("kimi_k2")
class KimiK2ToolParser(EngineToolAdapter):
    version = 1
    structural_tag_model = "kimi"

    @classmethod
    def make_engine(cls, info: TokenizerInfo, thinking: bool) -> EngineParser:
        return KimiK2Engine(info, thinking)

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _thinking(template_kwargs)

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # KimiK2ToolParser.adjust_request replaces the engine adapter's (no unconditional False)
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """xgrammar's builtin `kimi` structural tag `format`, dumped."""
        tags = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            tags.append(
                {
                    "type": "tag",
                    "begin": f"{TOOL_CALL_START}functions.{function['name']}:",
                    "content": {
                        "type": "sequence",
                        "elements": [
                            {"type": "regex", "pattern": "\\d+"},
                            {"type": "const_string", "value": TOOL_ARG_START},
                            json_schema_format(schema),
                        ],
                    },
                    "end": TOOL_CALL_END,
                }
            )
        section_begin = {"type": "const_string", "value": TOOL_SECTION_START}
        section_end = {"type": "const_string", "value": TOOL_SECTION_END}
        if choice == "forced":
            return {"type": "sequence", "elements": [section_begin, tags[0], section_end]}
        calls = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": False,
        }
        if choice == "required":
            return {"type": "sequence", "elements": [section_begin, calls, section_end]}
        excludes = [THINK_START, THINK_END, TOOL_CALL_START]
        if not tags:
            return {"type": "any_text", "excludes": excludes}
        return {
            "type": "triggered_tags",
            "triggers": [TOOL_SECTION_START],
            "tags": [{"type": "tag", "begin": TOOL_SECTION_START, "content": calls, "end": TOOL_SECTION_END}],
            "at_least_one": False,
            "stop_after_first": False,
            "excludes": excludes,
        }
