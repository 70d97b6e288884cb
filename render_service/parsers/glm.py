"""GLM-4.5 / GLM-4.7 (`glm45`, `glm47` tools and reasoning): vLLM 0.33's `Glm47MoeParser`.

    <think>...</think>
    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

The engine config of `parser/glm47_moe.py`: reasoning first when thinking is on (the template
kwarg `thinking` or `enable_thinking`; with both unset it is on), `<think>` in content opens
reasoning again, `<tool_call>` / `</tool_call>` by token id, the function name is the text up
to the first `<arg_key>` (whitespace stripped), values are strings coerced to the tool
schema, names are checked against the request's tools. With thinking off the think markers
are plain text and batch returns the output as content.

Not reproduced: vLLM ignores `thinking=false` for GLM-5.3 templates (it looks for
"[gMASK]<sop>" and "Reasoning Effort:" in the tokenizer's chat template); here the flag is
honoured for every template. The tool parser follows the reasoning parser's reading of the
kwargs (with no reasoning parser configured it assumes thinking on).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from render_service.parsers.base import json_string_body
from render_service.parsers.engine import (
    CONTENT,
    EV_ARG,
    EV_REASONING_END,
    EV_REASONING_START,
    EV_TOOL_END,
    EV_TOOL_START,
    REASONING,
    TOOL_ARGS,
    TOOL_NAME,
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    Transition,
    ValueExt,
    WholeCallsState,
)
from render_service.parsers.protocols import ToolStrictLevel
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser
from render_service.parsers.xml_args import ws_pattern

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
ARG_KEY_START, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE_START, ARG_VALUE_END = "<arg_value>", "</arg_value>"
TURN_BOUNDARIES = frozenset(("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"))

_ARG_RE = re.compile(ws_pattern(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>"), re.DOTALL)
_PARTIAL_ARG_RE = re.compile(ws_pattern(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*)$"), re.DOTALL)
_TAIL = len(ARG_VALUE_END) - 1  # what may still become `</arg_value>`


def _parse_args(raw_args: str, partial: bool) -> tuple[dict[str, object], re.Match[str] | None]:
    params: dict[str, object] = {}
    for match in _ARG_RE.finditer(raw_args):
        params[match.group("key").strip()] = match.group("value")
    open_match = None
    if partial:
        partial_match = _PARTIAL_ARG_RE.search(_ARG_RE.sub("", raw_args))
        if partial_match:
            key = partial_match.group("key").strip()
            if key:
                params[key] = partial_match.group("value")
                open_match = partial_match
    return params, open_match


def glm_arg_converter(raw_args: str, partial: bool) -> str:
    return json.dumps(_parse_args(raw_args, partial)[0], ensure_ascii=False)


def glm_extender_start(raw_args: str) -> ValueExt | None:
    """`_glm47_arg_value_extender`'s initial state: the last characters of the arguments."""
    params, match = _parse_args(raw_args, partial=True)
    if match is None or next(reversed(params)) != match.group("key").strip():
        return None
    return ValueExt(window=raw_args[-_TAIL:], raw_len=len(match.group("value")))


def glm_extender_step(ext: ValueExt, delta: str) -> str | None:
    text = ext.window + delta
    if ARG_VALUE_END in text:
        return None
    ext.window = text[-_TAIL:]
    return json_string_body(delta)


@cache
def glm_config(thinking: bool = True) -> EngineConfig:
    """vLLM's `glm47_moe_config`."""
    reasoning_terminals = {"THINK_START": THINK_START, "THINK_END": THINK_END} if thinking else {}
    reasoning_transitions = (
        {
            (CONTENT, "THINK_START"): Transition(REASONING, (EV_REASONING_START,)),
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (CONTENT, "THINK_END"): Transition(CONTENT),
        }
        if thinking
        else {}
    )
    return EngineConfig(
        name="glm47_moe",
        initial_state=REASONING if thinking else CONTENT,
        terminals={
            **reasoning_terminals,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
            "ARG_KEY_START": ARG_KEY_START,
            "ARG_KEY_END": ARG_KEY_END,
            "ARG_VALUE_START": ARG_VALUE_START,
            "ARG_VALUE_END": ARG_VALUE_END,
        },
        token_id_terminals={**reasoning_terminals, "TOOL_START": TOOL_CALL_START, "TOOL_END": TOOL_CALL_END},
        transitions={
            **reasoning_transitions,
            (REASONING, "THINK_START"): Transition(REASONING),
            (REASONING, "TOOL_START"): Transition(TOOL_NAME, (EV_REASONING_END, EV_TOOL_START)),
            (CONTENT, "TOOL_START"): Transition(TOOL_NAME, (EV_TOOL_START,)),
            (TOOL_NAME, "ARG_KEY_START"): Transition(TOOL_ARGS, (EV_ARG,)),
            (TOOL_NAME, "TOOL_END"): Transition(CONTENT, (EV_TOOL_END,)),
            (TOOL_ARGS, "TOOL_END"): Transition(CONTENT, (EV_TOOL_END,)),
            **{
                (TOOL_ARGS, t): Transition(TOOL_ARGS, (EV_ARG,))
                for t in ("ARG_KEY_START", "ARG_KEY_END", "ARG_VALUE_START", "ARG_VALUE_END")
            },
        },
        turn_boundary_tokens=TURN_BOUNDARIES,
        arg_converter=glm_arg_converter,
        extender_start=glm_extender_start,
        extender_step=glm_extender_step,
        stream_arg_deltas=True,
        tool_args_json=False,
        validate_tool_names=True,
        strip_tool_names=True,
    )


def _thinking(template_kwargs: Mapping[str, Any]) -> bool:
    thinking = template_kwargs.get("thinking")
    enable = template_kwargs.get("enable_thinking")
    return True if thinking is None and enable is None else bool(thinking) or bool(enable)


class GlmReasoningState(EngineState, tag="glm.reasoning/1"):
    pass


@register_reasoning_parser("glm45", aliases=("glm47",))
class GlmReasoningParser(EngineReasoningParser):
    version = 3  # the stream is batch's engine pass over the whole output (accumulates to it)
    state_type = GlmReasoningState
    streams_whole_output = True
    reads_enable_thinking = True

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _thinking(template_kwargs)

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return glm_config(thinking)


class GlmToolState(WholeCallsState, tag="glm.tool/2"):
    pass


@register_tool_parser("glm45", aliases=("glm47",))
class GlmToolParser(EngineToolParser):
    version = 2  # each call sent whole: the stream accumulates to the batch answer
    calls_whole = True
    state_type = GlmToolState
    structural_tag_model = "glm_4_7"
    # Auto tool calls get the shallow tag by default.
    default_tool_strict_level = ToolStrictLevel.FUNCTION
    config = glm_config(True)

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        return glm_config(thinking)

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """vLLM's `get_glm_4_7_structural_tag`: xgrammar's builtin `glm_4_7` tag when every
        tool is strict, else one tag per tool (schema-pinned for strict tools, keys and value
        types pinned for the others)."""
        if tools and all(strict):
            tags = [_tag(tool, _json_schema(_parameters(tool))) for tool in tools]
            if choice == "forced":
                return tags[0]
            if not tags:
                return {"type": "any_text", "excludes": _REASONING_EXCLUDES}
            return {
                "type": "triggered_tags",
                "triggers": [TOOL_CALL_START],
                "tags": tags,
                "excludes": _TEXT_EXCLUDES,
                "at_least_one": choice == "required",
            }
        tags = [
            _tag(tool, _json_schema(_parameters(tool))) if is_strict else _shallow_tag(tool)
            for tool, is_strict in zip(tools, strict, strict=True)
        ]
        if choice == "auto":
            return {
                "type": "triggered_tags",
                "triggers": [TOOL_CALL_START],
                "tags": tags,
                "excludes": [e for e in _VALUE_EXCLUDES if e != TOOL_CALL_START],
            }
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": choice == "forced",
        }


_ARG_TOKENS = [ARG_KEY_START, ARG_KEY_END, ARG_VALUE_START, ARG_VALUE_END]
_VALUE_EXCLUDES = [THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END, *_ARG_TOKENS]
_REASONING_EXCLUDES = [THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END, *_ARG_TOKENS]
_TEXT_EXCLUDES = [THINK_START, THINK_END, TOOL_CALL_END, *_ARG_TOKENS]


def _parameters(tool: dict[str, Any]) -> Any:
    parameters = tool["function"].get("parameters")
    return parameters if parameters is not None else True


def _json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "style": "glm_xml", "any_order": False}


def _tag(tool: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": TOOL_CALL_START + tool["function"]["name"],
        "content": content,
        "end": TOOL_CALL_END,
    }


def _value_format(prop: dict[str, Any]) -> dict[str, Any]:
    if "enum" in prop:
        values = [{"type": "const_string", "value": v if isinstance(v, str) else json.dumps(v)} for v in prop["enum"]]
        return values[0] if len(values) == 1 else {"type": "or", "elements": values}
    prop_type = prop.get("type")
    if isinstance(prop_type, list):
        formats = [_value_format({"type": t}) for t in prop_type if t != "string"]
        if "string" in prop_type:
            formats.append({"type": "any_text", "excludes": _VALUE_EXCLUDES})
        return formats[0] if len(formats) == 1 else {"type": "or", "elements": formats}
    if prop_type in (None, "string"):
        return {"type": "any_text", "excludes": _VALUE_EXCLUDES}
    return {"type": "json_schema", "json_schema": {"type": prop_type}}


def _shallow_tag(tool: dict[str, Any]) -> dict[str, Any]:
    """A non-strict tool: its keys and their basic value types, in any number and order."""
    params = tool["function"].get("parameters") or {}
    properties = params.get("properties")
    if (
        not isinstance(properties, dict)
        or not properties
        or params.get("additionalProperties") is True
        or any(key in params for key in ("$ref", "allOf", "anyOf", "oneOf", "patternProperties"))
    ):
        return _tag(tool, _json_schema(True))
    pairs = [
        {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": f"{ARG_KEY_START}{key}{ARG_KEY_END}{ARG_VALUE_START}"},
                _value_format(prop),
                {"type": "const_string", "value": ARG_VALUE_END},
            ],
        }
        for key, prop in properties.items()
    ]
    content = {"type": "star", "content": pairs[0] if len(pairs) == 1 else {"type": "or", "elements": pairs}}
    return _tag(tool, content)
