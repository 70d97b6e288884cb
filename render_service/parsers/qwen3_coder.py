"""Qwen3 XML tool calls (`qwen3_coder`, `qwen3_xml`): vLLM 0.33's `Qwen3EngineToolParser`.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

The `Qwen3Parser` engine config (`parser/qwen3.py`) with tool parsing on: `<tool_call>` /
`</tool_call>` by token id, `<function=`, `</function>`, `<parameter=`, `</parameter>`, `>` by
text; arguments converted to a JSON object of strings (one wrapping newline trimmed), then
coerced to the tool schema's types; string values stream as they arrive. Also: recovery from
unclosed names and calls (vLLM issue 58227 transitions), `<function=` without `<tool_call>`.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from render_service.parsers.engine import (
    CONTENT,
    EV_ARG,
    EV_REASONING_END,
    EV_TOOL_END,
    EV_TOOL_START,
    REASONING,
    TOOL_ARGS,
    TOOL_BETWEEN,
    TOOL_NAME,
    TOOL_PREAMBLE,
    EngineConfig,
    EngineToolParser,
    Transition,
    ValueExt,
    WholeCallsState,
)
from render_service.parsers.registry import register_tool_parser
from render_service.parsers.xml_args import (
    PartialMatcher,
    end_window,
    trim_wrapping_newlines,
    value_extender_step,
    ws_pattern,
)

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
CHATML_TURN_BOUNDARIES = frozenset(("<|im_start|>", "<|im_end|>"))

_PARAM_RE = re.compile(
    ws_pattern(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))"), re.DOTALL
)
_PARTIAL_PARAM_RE = re.compile(ws_pattern(r"<\s*parameter\s*=\s*([^>]+)>(.*)$"), re.DOTALL)
_VALUE_END_RE = re.compile(ws_pattern(r"<\s*/\s*parameter\s*>|<\s*parameter\s*="))
_VALUE_ENDS = PartialMatcher(("<", None, "/", None, "parameter", None, ">"), ("<", None, "parameter", None, "="))


def qwen3_arg_converter(raw_args: str, partial: bool) -> str:
    """`_qwen3_arg_converter`: `<parameter=k>v</parameter>`s -> a JSON object of strings."""
    params: dict[str, object] = {}
    for match in _PARAM_RE.finditer(raw_args):
        params[match.group(1)] = trim_wrapping_newlines(match.group(2))
    if partial:
        open_match = _PARTIAL_PARAM_RE.search(_PARAM_RE.sub("", raw_args))
        if open_match and open_match.group(1):
            params[open_match.group(1)] = trim_wrapping_newlines(open_match.group(2))
    return json.dumps(params, ensure_ascii=False)


def qwen3_extender_start(raw_args: str) -> ValueExt | None:
    """`_param_value_extender(raw_args, trim_newlines=True)`'s initial state."""
    match = _PARTIAL_PARAM_RE.search(_PARAM_RE.sub("", raw_args))
    if match is None:
        return None
    name, value = match.group(1), match.group(2)
    if any(m.group(1) == name for m in _PARAM_RE.finditer(raw_args)):
        return None  # a repeated key keeps its first position: its value is not last
    held = "\n" if value.endswith("\n") and value != "\n" else ""
    return ValueExt(window=end_window(value, _VALUE_ENDS), started=bool(value), held=held, raw_len=len(value))


qwen3_extender_step = value_extender_step(_VALUE_END_RE, _VALUE_ENDS, trim_newlines=True)


@cache
def qwen3_config(
    thinking: bool = True,
    *,
    name: str = "qwen3",
    think_start: str = THINK_START,
    think_end: str = THINK_END,
    tool_start: str = TOOL_CALL_START,
    tool_end: str = TOOL_CALL_END,
    turn_boundary_tokens: frozenset[str] = CHATML_TURN_BOUNDARIES,
) -> EngineConfig:
    """vLLM's `qwen3_config` (shared by `seed_oss` with other wrapper tokens)."""
    start_tool = (EV_REASONING_END, EV_TOOL_START)
    return EngineConfig(
        name=name,
        initial_state=REASONING if thinking else CONTENT,
        wait_for_reasoning=thinking,
        turn_boundary_tokens=turn_boundary_tokens,
        terminals={
            "THINK_START": think_start,
            "THINK_END": think_end,
            "TOOL_START": tool_start,
            "TOOL_END": tool_end,
            "FUNC_PREFIX": "<function=",
            "FUNC_END": "</function>",
            "PARAM_START": "<parameter=",
            "PARAM_END": "</parameter>",
            "CLOSE_ANGLE": ">",
        },
        token_id_terminals={
            "THINK_START": think_start,
            "THINK_END": think_end,
            "TOOL_START": tool_start,
            "TOOL_END": tool_end,
        },
        transitions={
            (REASONING, "THINK_START"): Transition(REASONING),
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (CONTENT, "THINK_END"): Transition(CONTENT),
            (REASONING, "TOOL_START"): Transition(TOOL_PREAMBLE, start_tool),
            (CONTENT, "TOOL_START"): Transition(TOOL_PREAMBLE, start_tool),
            (CONTENT, "FUNC_PREFIX"): Transition(TOOL_NAME, (EV_TOOL_START,)),
            (TOOL_PREAMBLE, "TOOL_END"): Transition(CONTENT, (EV_TOOL_END,)),
            (TOOL_PREAMBLE, "FUNC_PREFIX"): Transition(TOOL_NAME),
            (TOOL_NAME, "CLOSE_ANGLE"): Transition(TOOL_ARGS),
            (TOOL_NAME, "FUNC_END"): Transition(TOOL_BETWEEN, (EV_TOOL_END,)),
            (TOOL_NAME, "TOOL_END"): Transition(CONTENT, (EV_TOOL_END,)),
            (TOOL_NAME, "TOOL_START"): Transition(TOOL_PREAMBLE, (EV_TOOL_END, EV_TOOL_START)),
            (TOOL_NAME, "FUNC_PREFIX"): Transition(TOOL_NAME, (EV_TOOL_END, EV_TOOL_START)),
            (TOOL_ARGS, "FUNC_END"): Transition(TOOL_BETWEEN, (EV_TOOL_END,)),
            (TOOL_ARGS, "FUNC_PREFIX"): Transition(TOOL_NAME, (EV_TOOL_END, EV_TOOL_START)),
            (TOOL_ARGS, "PARAM_START"): Transition(TOOL_ARGS, (EV_ARG,)),
            (TOOL_ARGS, "PARAM_END"): Transition(TOOL_ARGS, (EV_ARG,)),
            (TOOL_BETWEEN, "TOOL_END"): Transition(CONTENT),
            (TOOL_BETWEEN, "TOOL_START"): Transition(TOOL_PREAMBLE, (EV_TOOL_START,)),
            (TOOL_BETWEEN, "FUNC_PREFIX"): Transition(TOOL_NAME, (EV_TOOL_START,)),
        },
        arg_converter=qwen3_arg_converter,
        extender_start=qwen3_extender_start,
        extender_step=qwen3_extender_step,
        stream_arg_deltas=True,
        strip_trailing_reasoning_whitespace=False,
        tool_args_json=False,
        value_trims_newlines=True,
    )


class Qwen3CoderState(WholeCallsState, tag="qwen3_coder/2"):
    pass


@register_tool_parser("qwen3_coder", aliases=("qwen3_xml",))
class Qwen3CoderToolParser(EngineToolParser):
    version = 2  # each call sent whole: the stream accumulates to the batch answer
    calls_whole = True
    state_type = Qwen3CoderState
    structural_tag_model = "qwen_3_coder"
    config = qwen3_config(True)

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """xgrammar's builtin `qwen_3_coder` structural tag as vLLM requests it (reasoning
        disabled, parallel calls allowed, `<think>`/`</think>` excluded from free text)."""
        tags = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            tags.append(
                {
                    "type": "tag",
                    "begin": f"<tool_call>\n<function={function['name']}>\n",
                    "content": {"type": "json_schema", "json_schema": schema, "style": "qwen_xml"},
                    "end": "\n</function>\n</tool_call>",
                }
            )
        excludes = [THINK_START, THINK_END]
        if choice == "forced":
            return tags[0]
        if not tags:
            return {"type": "any_text", "excludes": excludes}
        return {
            "type": "triggered_tags",
            "triggers": ["<tool_call>\n<function="],
            "tags": tags,
            "excludes": excludes,
            "at_least_one": choice == "required",
        }
