"""MiniMax M2 (`minimax_m2` tools and reasoning, `minimax_m2_append_think` reasoning).

    <think>...</think>
    <minimax:tool_call><invoke name="get_weather">
    <parameter name="city">Seattle</parameter>
    </invoke></minimax:tool_call>

`minimax_m2`: vLLM 0.33's `MinimaxM2Parser` engine config (`parser/minimax_m2.py`): reasoning
from the first token (the model emits no `<think>`), `<minimax:tool_call>` / `</minimax:tool_call>`
by token id, one call per `<invoke name=...>` (double, single or no quotes), parameter values
as JSON strings coerced to the tool schema, names checked against the request's tools,
trailing reasoning whitespace held until more reasoning follows.

`minimax_m2_append_think`: vLLM's `MiniMaxM2AppendThinkReasoningParser`: no reasoning split at
all; the output is content with `<think>` prepended to the first chunk, and reasoning "ends"
(the tool phase starts) once the last of `<think>`/`</think>` in the output is `</think>`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta
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
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    Transition,
    ValueExt,
    WholeCallsState,
)
from render_service.parsers.protocols import ParserState, ReasoningParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser
from render_service.parsers.xml_args import WS_CHARS, PartialMatcher, end_window, value_extender_step, ws_pattern

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<minimax:tool_call>", "</minimax:tool_call>"

# The bare name's class excludes `regex`'s whitespace (spelled out: `ws_pattern` rewrites only
# `\s` outside brackets).
_NAME = r"(?:\"(?P<dq_name>[^\"]*)\"|'(?P<sq_name>[^']*)'|(?P<bare_name>[^>" + WS_CHARS + "]+))"
_PARAM_RE = re.compile(
    ws_pattern(
        r"<\s*parameter\s+name\s*=\s*"
        + _NAME
        + r"\s*>(?P<value>.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s+name\s*=))"
    ),
    re.DOTALL,
)
_PARTIAL_PARAM_RE = re.compile(ws_pattern(r"<\s*parameter\s+name\s*=\s*" + _NAME + r"\s*>(?P<value>.*)$"), re.DOTALL)
_VALUE_END_RE = re.compile(ws_pattern(r"<\s*/\s*parameter\s*>|<\s*parameter\s+name\s*="))
# `\s+` after "parameter": one whitespace piece then `\s*`.
_VALUE_ENDS = PartialMatcher(
    ("<", None, "/", None, "parameter", None, ">"),
    *(("<", None, "parameter", ws, None, "name", None, "=") for ws in (" ", "\t", "\n", "\r")),
)


def _param_name(match: re.Match[str]) -> str:
    return (match.group("dq_name") or match.group("sq_name") or match.group("bare_name") or "").strip()


def _parse_args(raw_args: str, partial: bool) -> tuple[dict[str, object], re.Match[str] | None]:
    params: dict[str, object] = {}
    for match in _PARAM_RE.finditer(raw_args):
        name = _param_name(match)
        if name:
            params[name] = match.group("value")
    open_match = None
    if partial:
        partial_match = _PARTIAL_PARAM_RE.search(_PARAM_RE.sub("", raw_args))
        if partial_match:
            name = _param_name(partial_match)
            if name:
                params[name] = partial_match.group("value")
                open_match = partial_match
    return params, open_match


def minimax_m2_arg_converter(raw_args: str, partial: bool) -> str:
    return json.dumps(_parse_args(raw_args, partial)[0], ensure_ascii=False)


def minimax_m2_extender_start(raw_args: str) -> ValueExt | None:
    params, match = _parse_args(raw_args, partial=True)
    if match is None or next(reversed(params)) != _param_name(match):
        return None
    bare = match.group("bare_name")
    if _VALUE_END_RE.search(match.string, 0, match.start()) or (bare is not None and bare[0] in "\"'"):
        return None
    value = match.group("value")
    return ValueExt(window=end_window(value, _VALUE_ENDS), raw_len=len(value))


minimax_m2_extender_step = value_extender_step(_VALUE_END_RE, _VALUE_ENDS, trim_newlines=False)

_INVOKE_PREFIXES = ("INVOKE_PREFIX_DQ", "INVOKE_PREFIX_SQ", "INVOKE_PREFIX_UNQUOTED")
_NAME_ENDS = ("NAME_END_DQ", "NAME_END_SQ", "NAME_END_UNQUOTED")


@cache
def minimax_m2_config() -> EngineConfig:
    """vLLM's `minimax_m2_config`."""
    return EngineConfig(
        name="minimax_m2",
        initial_state=REASONING,
        wait_for_reasoning=True,
        terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": TOOL_CALL_START,
            "PARAM_START": "<parameter name=",
            "PARAM_END": "</parameter>",
            "TOOL_END": TOOL_CALL_END,
            "INVOKE_PREFIX_DQ": '<invoke name="',
            "INVOKE_PREFIX_SQ": "<invoke name='",
            "INVOKE_PREFIX_UNQUOTED": "<invoke name=",
            "INVOKE_END": "</invoke>",
            "NAME_END_DQ": '">',
            "NAME_END_SQ": "'>",
            "NAME_END_UNQUOTED": ">",
        },
        token_id_terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
        },
        transitions={
            (REASONING, "THINK_START"): Transition(REASONING),
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (CONTENT, "THINK_END"): Transition(CONTENT),
            (REASONING, "TOOL_START"): Transition(TOOL_PREAMBLE, (EV_REASONING_END,)),
            (CONTENT, "TOOL_START"): Transition(TOOL_PREAMBLE),
            (TOOL_ARGS, "PARAM_START"): Transition(TOOL_ARGS, (EV_ARG,)),
            (TOOL_ARGS, "PARAM_END"): Transition(TOOL_ARGS, (EV_ARG,)),
            (TOOL_PREAMBLE, "TOOL_END"): Transition(CONTENT),
            (TOOL_BETWEEN, "TOOL_END"): Transition(CONTENT),
            (CONTENT, "TOOL_END"): Transition(CONTENT),
            (TOOL_ARGS, "INVOKE_END"): Transition(TOOL_BETWEEN, (EV_TOOL_END,)),
            **{
                (state, terminal): Transition(TOOL_NAME, (EV_TOOL_START,))
                for state in (CONTENT, TOOL_PREAMBLE, TOOL_BETWEEN)
                for terminal in _INVOKE_PREFIXES
            },
            **{(TOOL_NAME, terminal): Transition(TOOL_ARGS) for terminal in _NAME_ENDS},
        },
        arg_converter=minimax_m2_arg_converter,
        extender_start=minimax_m2_extender_start,
        extender_step=minimax_m2_extender_step,
        stream_arg_deltas=True,
        tool_args_json=False,
        validate_tool_names=True,
    )


class MinimaxM2ReasoningState(EngineState, tag="minimax_m2.reasoning/1"):
    pass


@register_reasoning_parser("minimax_m2")
class MinimaxM2ReasoningParser(EngineReasoningParser):
    version = 2  # streams accumulate to the batch answer
    state_type = MinimaxM2ReasoningState

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return minimax_m2_config()

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        """`MinimaxM2Parser.extract_content_ids`: only what follows the last `</think>`."""
        end_id = self.engine.end_id
        if end_id is None:
            return []
        for i in range(len(delta_ids) - 1, -1, -1):
            if delta_ids[i] == end_id:
                return delta_ids[i + 1 :]
        return []


class MinimaxM2ToolState(WholeCallsState, tag="minimax_m2.tool/2"):
    pass


@register_tool_parser("minimax_m2")
class MinimaxM2ToolParser(EngineToolParser):
    version = 2  # each call sent whole: the stream accumulates to the batch answer
    calls_whole = True
    state_type = MinimaxM2ToolState
    structural_tag_model = "minimax"
    config = minimax_m2_config()

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """vLLM's `get_minimax_structural_tag` (xgrammar constructor arguments; defaults are
        filled by the caller): one `<invoke name="...">` tag per tool, arguments as
        `minimax_xml` JSON schema, inside `<minimax:tool_call>`."""
        tags = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            tags.append(
                {
                    "type": "tag",
                    "begin": f'<invoke name="{function["name"]}">\n',
                    "content": {"type": "json_schema", "json_schema": schema, "style": "minimax_xml"},
                    "end": "</invoke>\n",
                }
            )
        begin, end = TOOL_CALL_START + "\n", TOOL_CALL_END
        if choice == "auto":
            if not tags:
                return {"type": "any_text", "excludes": [THINK_START, THINK_END]}
            calls = {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True}
            return {
                "type": "triggered_tags",
                "triggers": [TOOL_CALL_START],
                "tags": [{"type": "tag", "begin": begin, "content": calls, "end": end}],
                "excludes": [THINK_START, THINK_END],
            }
        calls = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": choice == "forced",
        }
        return {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": "\n" + begin},
                calls,
                {"type": "const_string", "value": end},
            ],
        }


# -- minimax_m2_append_think ------------------------------------------------------------------------------


class AppendThinkState(ParserState, tag="minimax_m2_append_think/1"):
    seen_output: bool = False  # a chunk with tokens was parsed (vLLM: previous_token_ids)
    last_marker: int = 0  # the last of <think> (1) / </think> (2) among the output ids


@register_reasoning_parser("minimax_m2_append_think")
class MinimaxM2AppendThinkReasoningParser(ReasoningParser):
    version = 2  # the stream accumulates to the batch answer
    state_type = AppendThinkState

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        self.start_id = tokenizer.token_to_id(THINK_START)
        self.end_id = tokenizer.token_to_id(THINK_END)

    def _last_marker(self, ids: Sequence[int], last: int) -> int:
        for tid in reversed(ids):
            if tid == self.end_id:
                return 2
            if tid == self.start_id:
                return 1
        return last

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        return self._last_marker(prompt_token_ids, 0) == 2

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        """Batch prepends `<think>` to the output whatever the prompt holds, so the stream always
        starts here (vLLM's stream skips the prefix when the prompt closed reasoning)."""
        return False

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        """The first chunk, with `<think>` in front, and done: batch hands `<think>` plus the whole
        output to the tool parser as content, so the stream hands every chunk on from here (vLLM's
        stream waits for a `</think>` id before the tool parser sees anything)."""
        text = delta_text if st.seen_output else "<think>" + delta_text
        st.seen_output = st.seen_output or bool(delta_ids)
        st.last_marker = self._last_marker(delta_ids, st.last_marker)
        return Delta(content=text), True

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        return None, "<think>" + model_output
