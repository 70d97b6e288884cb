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
  `"name": "..."`, then with an id of ours);
- the name goes out with the first argument text, in the same delta; the arguments stream as JSON
  text (a top-level closing brace is held until more text or the end confirms it); batch arguments
  are the stripped text (or "{}");
- text after `<|tool_calls_section_end|>` is dropped (the engine stays in a tool state);
- `thinking` / `enable_thinking` in the chat template kwargs (default: thinking) choose the config:
  without thinking there are no reasoning terminals and the output is all content;
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
    EV_REASONING_END,
    EV_TOOL_END,
    EV_TOOL_START,
    REASONING,
    TOOL_ARGS,
    TOOL_BETWEEN,
    TOOL_NAME,
    TOOL_PREAMBLE,
    Engine,
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    Slot,
    Transition,
    WholeCallsState,
    _name_from_args,
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
            (REASONING, "THINK_START"): Transition(REASONING),
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (CONTENT, "THINK_END"): Transition(CONTENT),
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
            (REASONING, "TOOL_SECTION_START"): Transition(TOOL_PREAMBLE, (EV_REASONING_END,)),
            (CONTENT, "TOOL_SECTION_START"): Transition(TOOL_PREAMBLE),
            (TOOL_PREAMBLE, "TOOL_START"): Transition(TOOL_NAME, (EV_TOOL_START,)),
            (TOOL_NAME, "ARG_START"): Transition(TOOL_ARGS),
            (TOOL_ARGS, "TOOL_END"): Transition(TOOL_BETWEEN, (EV_TOOL_END,)),
            (TOOL_ARGS, "TOOL_SECTION_END"): Transition(TOOL_PREAMBLE, (EV_TOOL_END,)),
            (TOOL_BETWEEN, "TOOL_START"): Transition(TOOL_NAME, (EV_TOOL_START,)),
            (TOOL_PREAMBLE, "TOOL_SECTION_END"): Transition(TOOL_PREAMBLE),
            (TOOL_BETWEEN, "TOOL_SECTION_END"): Transition(TOOL_PREAMBLE),
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


class KimiK2Engine(Engine):
    """The engine with `KimiK2Parser`'s hooks."""

    def __init__(self, thinking: bool, info: TokenizerInfo, **kwargs: Any) -> None:
        super().__init__(kimi_k2_config(thinking), info, **kwargs)
        self.thinking = thinking
        self.section_start_id = info.token_to_id(TOOL_SECTION_START)

    def _emit_name(
        self, st: EngineState, index: int, calls: list[ToolCallDelta], name: str | None, tool_id: ToolIdFn, tools: Any
    ) -> None:
        call_id, tool_name = _id_and_name(name)
        if not tool_name:
            if 0 <= index < st.nslots and st.slot is not None:
                st.slot.name = ""
            return
        self._slot(st, index).id = call_id or ""
        super()._emit_name(st, index, calls, tool_name, tool_id, tools)

    def _tool_end(self, st: EngineState, index: int, calls: list[ToolCallDelta], tool_id: ToolIdFn, tools: Any) -> None:
        if 0 <= index < st.nslots and st.slot is not None and not st.slot.name_sent:
            call_id, tool_name = _id_and_name(st.slot.name)
            if tool_name:
                st.slot.id = call_id or ""
                st.slot.name = tool_name
        super()._tool_end(st, index, calls, tool_id, tools)

    def _arg_chunk(
        self,
        st: EngineState,
        index: int,
        value: str,
        calls: list[ToolCallDelta],
        tool_id: ToolIdFn,
        tools: Any,
        *,
        elide: bool = False,
    ) -> None:
        sent_before = 0 <= index < st.nslots and st.slot is not None and st.slot.name_sent
        super()._arg_chunk(st, index, value, calls, tool_id, tools, elide=elide)
        if value and not sent_before and 0 <= index < st.nslots and st.slot is not None and st.slot.name_sent:
            calls.append(ToolCallDelta(index=index, arguments=value))
        if elide and st.slot is not None and st.slot.name_sent:
            # Streaming: with no argument converter, nothing reads a call's text once its name
            # is out (batch keeps it), so the state does not grow with the arguments.
            st.slot.args = ""

    def _extract_args_json(self, raw: str) -> str:
        return raw.strip() or "{}"

    def settle_slot(self, slot: Slot) -> Slot:
        """What batch's hooks make of a whole call (`_arg_chunk`, `_emit_name`, `_tool_end`): with
        argument text, the header is read at its first chunk (a header that does not parse is
        cleared, then a `"name"` in the arguments that parses as one is tried); at the call's end
        an unsent name is read from the header, else kept as it is (or taken from the arguments)."""
        header, raw = slot.name, slot.args
        if raw:
            call_id, name = _id_and_name(header)
            if not name:
                call_id, name = _id_and_name(_name_from_args(raw))
            if name:
                return Slot(name=name, args=raw, id=call_id or "")
            header = ""
        call_id, name = _id_and_name(header)
        if name:
            return Slot(name=name, args=raw, id=call_id or "")
        return Slot(name=header or _name_from_args(raw) or "", args=raw)

    def extract_content_ids(self, ids: Sequence[int]) -> Sequence[int]:
        if not self.thinking:
            return ids
        end_id = self.end_id
        if end_id is not None and end_id in ids:
            last = len(ids) - 1 - list(ids)[::-1].index(end_id)
            return ids[last + 1 :]
        section = self.section_start_id
        if section is not None and section in ids:
            last = len(ids) - 1 - list(ids)[::-1].index(section)
            return ids[last:]
        return []


class KimiK2ReasoningState(EngineState, tag="kimi_k2.reasoning/1"):
    pass


class KimiK2ToolState(WholeCallsState, tag="kimi_k2.tool/2"):
    pass


@register_reasoning_parser("kimi_k2")
class KimiK2ReasoningParser(EngineReasoningParser):
    version = 3  # the stream is batch's engine pass over the whole output (accumulates to it)
    state_type = KimiK2ReasoningState
    streams_whole_output = True

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        self.engine = KimiK2Engine(thinking_enabled, tokenizer, skip_tool_parsing=True)

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return kimi_k2_config(thinking)

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _thinking(template_kwargs)

    def _batch_is_raw(self) -> bool:
        return not self.thinking_enabled  # `extract` returns the output untouched

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        if not self.thinking_enabled:
            return None, model_output
        return super().extract(model_output, prompt_token_ids)


@register_tool_parser("kimi_k2")
class KimiK2ToolParser(EngineToolParser):
    version = 2  # each call sent whole: the stream accumulates to the batch answer
    calls_whole = True
    matches_by_text = True
    state_type = KimiK2ToolState
    structural_tag_model = "kimi"

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        return kimi_k2_config(thinking)

    @classmethod
    def tool_thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """vLLM builds the tool adapter's engine from the template kwargs too."""
        return _thinking(template_kwargs)

    def engine(self) -> Engine:
        key = (not self.reasoning_configured, self.thinking_enabled)
        engine = self._engines.get(key)
        if engine is None:
            engine = KimiK2Engine(key[1], self.info, skip_reasoning_parsing=key[0])
            self._engines[key] = engine
        return engine

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
