"""MiniMax M3 (`minimax_m3`, reasoning and tools): `<mm:think>...</mm:think>`, then calls whose every
tag carries the `]<]minimax[>[` namespace marker:

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="create_order">
    ]<]minimax[>[<user_id>42]<]minimax[>[</user_id>
    ]<]minimax[>[<items>]<]minimax[>[<item>]<]minimax[>[<sku>b-1]<]minimax[>[</sku>]<]minimax[>[</item>]<]minimax[>[</items>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

Tools: vLLM 0.33's `MinimaxM3Parser` engine config (`parser/minimax_m3.py`) on the shared engine:
one call per `<invoke>`, its parameters nested elements converted once the invoke closes (an
element with children is an object, or an array when its schema says so; repeated names collect
into a list; scalars coerced to the schema), each call sent whole once batch's decision is known.
Unlike the other engine families, vLLM's `adjust_request` leaves the request alone (the markers are
non-special added tokens), and required/named tool_choice are parsed like auto.

Reasoning: vLLM's `MiniMaxM3ReasoningParser`, which matches the markers by text (the model may
spell them with several tokens). Batch: a `</mm:think>` that opens the output is dropped and the
rest is content; else the text before the first `<mm:think>` is content, the text after it up to
the first `</mm:think>` reasoning, and what follows content again. With the template's
`thinking_mode="enabled"` (the prompt opened the block) the output starts in reasoning. vLLM's
stream re-reads the whole text on every chunk; ours streams batch's pass over the output once,
holding back only a possible marker prefix. Where batch decides on a `<mm:think>` that may come
last (thinking_mode enabled: the text before a late `<mm:think>` becomes content), our batch
follows the stream's rule instead: the output is reasoning up to the first `</mm:think>`, a
`<mm:think>` before it removed (docs/parsers.md, "MiniMax M3").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, partial_tag_overlap
from render_service.parsers.deepseek_v32 import DsmlEngine, DsmlToolState
from render_service.parsers.engine import (
    CONTENT,
    EV_TOOL_END,
    EV_TOOL_START,
    TOOL_ARGS,
    TOOL_BETWEEN,
    TOOL_NAME,
    TOOL_PREAMBLE,
    EngineConfig,
    EngineToolParser,
    Slot,
    Transition,
    coerce_to_schema_type,
    extract_types_from_schema,
    find_tool_properties,
)
from render_service.parsers.protocols import ParserState, ReasoningParser, RequestAdjustment
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

THINK_START, THINK_END = "<mm:think>", "</mm:think>"
NAMESPACE = "]<]minimax[>["
ELEMENT_START = NAMESPACE + "<"
ELEMENT_END_START = NAMESPACE + "</"
MIXED_TEXT_FIELD = "$text"
MAX_ELEMENT_DEPTH = 128

# -- the argument converter (vLLM's `_minimax_m3_arg_converter`) -------------------------------------

# An element's value: its text, or its (name, value) children in order.
Element = str | list[tuple[str, Any]]


def _parse_element(text: str, pos: int, depth: int) -> tuple[str, Element, int] | None:
    """The element that starts at `pos` (its name, value and end), or None if malformed."""
    if depth > MAX_ELEMENT_DEPTH:
        return None
    name_start = pos + len(ELEMENT_START)
    name_end = text.find(">", name_start)
    if name_end <= name_start:
        return None
    name = text[name_start:name_end]
    if name.startswith("/") or not name.strip():
        return None
    close = f"{ELEMENT_END_START}{name}>"
    pos = name_end + 1
    texts: list[str] = []
    children: list[tuple[str, Element]] = []
    while True:
        marker = text.find(NAMESPACE, pos)
        if marker < 0:
            return None
        texts.append(text[pos:marker])
        if text.startswith(close, marker):
            pos = marker + len(close)
            break
        if not text.startswith(ELEMENT_START, marker):
            return None
        child = _parse_element(text, marker, depth + 1)
        if child is None:
            return None
        children.append((child[0], child[1]))
        pos = child[2]
    body = "".join(texts)
    if not children:
        return name, body, pos
    if body.strip():
        # mixed text goes under a reserved field no child uses
        field = MIXED_TEXT_FIELD
        while any(child_name == field for child_name, _ in children):
            field = "$" + field
        children.append((field, body))
    return name, children, pos


def _parse_params(raw_args: str) -> list[tuple[str, Element]]:
    """The parameter elements of one invoke body, up to the first malformed or open one."""
    params: list[tuple[str, Element]] = []
    pos = 0
    while True:
        while pos < len(raw_args) and raw_args[pos].isspace():
            pos += 1
        if not raw_args.startswith(ELEMENT_START, pos):
            return params
        element = _parse_element(raw_args, pos, 1)
        if element is None:
            return params
        params.append((element[0], element[1]))
        pos = element[2]


def _container(schema: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The first `array` or `object` alternative of `schema`."""
    types = schema.get("type")
    for kind in ("array", "object"):
        if types == kind or (isinstance(types, list) and kind in types):
            return kind, schema
    if types is None:
        if "items" in schema:
            return "array", schema
        if "properties" in schema or "additionalProperties" in schema:
            return "object", schema
    for field in ("anyOf", "oneOf"):
        for choice in schema.get(field) or ():
            if isinstance(choice, Mapping) and (found := _container(choice)):
                return found
    return None


def _convert_element(value: Element, schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        schema = None
    container = _container(schema) if schema is not None else None
    if isinstance(value, str):
        if schema is None:
            return value
        types = extract_types_from_schema(schema)
        # the template renders an empty list or dict as an empty element
        if container is not None and "string" not in types and not value.strip():
            return [] if container[0] == "array" else {}
        return coerce_to_schema_type(value, types)
    if container is not None and container[0] == "array":
        items = container[1].get("items")
        return [_convert_element(child, items) for _, child in value]
    return _convert_object(value, container[1] if container is not None else None)


def _convert_object(elements: list[tuple[str, Element]], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """Named elements as an object; a repeated name collects its values into a list."""
    properties = (schema or {}).get("properties") or {}
    additional = (schema or {}).get("additionalProperties")
    out: dict[str, Any] = {}
    repeated: set[str] = set()
    for name, element in elements:
        converted = _convert_element(element, properties.get(name, additional))
        if name not in out:
            out[name] = converted
        elif name in repeated:
            out[name].append(converted)
        else:
            out[name] = [out[name], converted]
            repeated.add(name)
    return out


def minimax_m3_arg_converter(raw_args: str, partial: bool, properties: Mapping[str, Any] | None = None) -> str:
    return json.dumps(_convert_object(_parse_params(raw_args), {"properties": properties or {}}), ensure_ascii=False)


# -- tools -----------------------------------------------------------------------------------------

_INVOKE_PREFIXES = ("INVOKE_PREFIX_DQ", "INVOKE_PREFIX_SQ", "INVOKE_PREFIX_UNQUOTED")
_NAME_ENDS = ("NAME_END_DQ", "NAME_END_SQ", "NAME_END_UNQUOTED")


@cache
def minimax_m3_config() -> EngineConfig:
    return EngineConfig(
        name="minimax_m3",
        terminals={
            "TOOL_START": NAMESPACE + "<tool_call>",
            "TOOL_END": NAMESPACE + "</tool_call>",
            "INVOKE_PREFIX_DQ": NAMESPACE + '<invoke name="',
            "INVOKE_PREFIX_SQ": NAMESPACE + "<invoke name='",
            "INVOKE_PREFIX_UNQUOTED": NAMESPACE + "<invoke name=",
            "INVOKE_END": NAMESPACE + "</invoke>",
            "NAME_END_DQ": '">',
            "NAME_END_SQ": "'>",
            "NAME_END_UNQUOTED": ">",
        },
        token_id_terminals={},
        transitions={
            (CONTENT, "TOOL_START"): Transition(TOOL_PREAMBLE),
            **{
                (state, terminal): Transition(TOOL_NAME, (EV_TOOL_START,))
                for state in (TOOL_PREAMBLE, TOOL_BETWEEN)
                for terminal in _INVOKE_PREFIXES
            },
            **{(TOOL_NAME, terminal): Transition(TOOL_ARGS) for terminal in _NAME_ENDS},
            # nested parameter elements are argument text: only the invoke closer ends the call
            (TOOL_ARGS, "INVOKE_END"): Transition(TOOL_BETWEEN, (EV_TOOL_END,)),
            # the tool block ends the message: the text after it is dropped
            (TOOL_PREAMBLE, "TOOL_END"): Transition(TOOL_BETWEEN),
            (TOOL_BETWEEN, "TOOL_END"): Transition(TOOL_BETWEEN),
        },
        arg_converter=minimax_m3_arg_converter,
        # converted once per invoke (a repeated name turns a scalar into a list): no deltas
        stream_arg_deltas=False,
        tool_args_json=False,
        strip_content_whitespace_with_tools=False,
        # (read only by `DsmlEngine`: every argument chunk after the name is held beside the
        # snapshot until the invoke closes, as nothing reads it before)
        arg_structural_chars=frozenset(),
    )


class MinimaxM3Engine(DsmlEngine):
    """The engine with vLLM's `_convert_args`: the converter with the call's tool properties
    (argument text held beside the snapshot until the call ends, as for DSML)."""

    def convert_args(self, slot: Slot, partial: bool, tools: Any) -> str:
        return minimax_m3_arg_converter(slot.args, partial, find_tool_properties(tools, slot.name.strip()))


class MinimaxM3ToolState(DsmlToolState, tag="minimax_m3.tool/1"):
    pass


@register_tool_parser("minimax_m3")
class MinimaxM3ToolParser(EngineToolParser):
    version = 1
    calls_whole = True
    state_type = MinimaxM3ToolState
    engine_type = MinimaxM3Engine
    supports_required_and_named = False  # required/named parse the native syntax (vLLM)
    config = minimax_m3_config()

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        return None  # vLLM: the markers are non-special added tokens; the request is left alone


# -- reasoning -------------------------------------------------------------------------------------

# Where the stream is in batch's pass: the output's start (it may still open with `</mm:think>`),
# content before the first `<mm:think>`, reasoning, or content after the first `</mm:think>`.
START, BEFORE, REASONING, AFTER = 0, 1, 2, 3


class MinimaxM3ReasoningState(ParserState, tag="minimax_m3/1"):
    phase: int = START
    held: str = ""  # a possible marker prefix not decided yet (< 11 characters)
    start_removed: bool = False  # thinking_mode enabled: a `<mm:think>` before `</mm:think>` was removed


@register_reasoning_parser("minimax_m3")
class MinimaxM3ReasoningParser(ReasoningParser):
    version = 1
    state_type = MinimaxM3ReasoningState
    streams_whole_output = True
    filters_after_end = True  # (streams_whole_output implies it)

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        start_id, end_id = tokenizer.token_to_id(THINK_START), tokenizer.token_to_id(THINK_END)
        if start_id is None or end_id is None:
            raise ValueError(
                "MiniMaxM3ReasoningParser reasoning parser could not locate think start/end tokens in the tokenizer!"
            )
        tok = tokenizer.tokenizer
        self._start_ids = tuple(tok.encode(THINK_START, add_special_tokens=False))
        self._end_ids = tuple(tok.encode(THINK_END, add_special_tokens=False))

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """vLLM reads `thinking_mode="enabled"`: the prompt opened the block, the output starts in it."""
        return template_kwargs.get("thinking_mode") == "enabled"

    @staticmethod
    def _rfind(ids: Sequence[int], marker: tuple[int, ...]) -> int:
        """The last position of the id sequence `marker` in `ids`, or -1: compares the last id
        first, so a prompt (often ~100k ids, on every render) is walked once without slicing."""
        n = len(marker)
        if n == 0:
            return -1
        last = marker[-1]
        for i in range(len(ids) - 1, n - 2, -1):
            if ids[i] == last and (n == 1 or tuple(ids[i - n + 1 : i + 1]) == marker):
                return i - n + 1
        return -1

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        """`is_reasoning_end(prompt)`: the last end-marker id sequence comes after the last start."""
        start, end = self._rfind(prompt_token_ids, self._start_ids), self._rfind(prompt_token_ids, self._end_ids)
        return end >= 0 and (start < 0 or end > start)

    def new_state(self) -> ParserState:
        # thinking_mode enabled: batch starts inside the block, whatever the prompt holds
        return MinimaxM3ReasoningState(phase=REASONING if self.thinking_enabled else START)

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        return False  # batch ignores the prompt: so does the stream

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        # Not called: `streams_whole_output` sends every chunk to `after_end`.
        return self.after_end(st, delta_text, delta_ids, finished=False), True

    def after_end(self, st: Any, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        """Batch's pass over the chunk `text`: its reasoning and content; `finished` flushes."""
        reasoning: list[str] = []
        content: list[str] = []
        text = st.held + text
        st.held = ""
        while text:
            if st.phase == AFTER:
                content.append(text)
                break
            if st.phase == START:
                if text.startswith(THINK_END):  # a stray closer opening the output: dropped
                    st.phase, text = AFTER, text[len(THINK_END) :]
                    continue
                if THINK_END.startswith(text):
                    st.held, text = text, ""
                    break
                st.phase = BEFORE
            if st.phase == REASONING and self.thinking_enabled and not st.start_removed:
                at = text.find(THINK_START)
                end = text.find(THINK_END)
                if at != -1 and (end == -1 or at < end):
                    reasoning.append(text[:at])
                    text, st.start_removed = text[at + len(THINK_START) :], True
                    continue
            marker = THINK_START if st.phase == BEFORE else THINK_END
            out = content if st.phase == BEFORE else reasoning
            at = text.find(marker)
            if at == -1:
                keep = partial_tag_overlap(text, marker)
                if st.phase == REASONING and self.thinking_enabled and not st.start_removed:
                    keep = max(keep, partial_tag_overlap(text, THINK_START))
                out.append(text[: len(text) - keep])
                st.held = text[len(text) - keep :] if keep else ""
                break
            out.append(text[:at])
            text = text[at + len(marker) :]
            st.phase = REASONING if st.phase == BEFORE else AFTER
        if finished and st.held:
            (reasoning if st.phase == REASONING else content).append(st.held)
            st.held = ""
        r, c = "".join(reasoning), "".join(content)
        if not r and not c:
            return None
        return Delta(reasoning=r or None, content=c or None)

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """Batch `extract_reasoning`; with thinking_mode enabled by the stream's rule (reasoning up
        to the first `</mm:think>`, a `<mm:think>` before it removed)."""
        if self.thinking_enabled:
            head, end, content = model_output.partition(THINK_END)
            if not end:
                return model_output.replace(THINK_START, "", 1), None
            return head.replace(THINK_START, "", 1), content or None
        if model_output.startswith(THINK_END):
            return None, model_output[len(THINK_END) :] or None
        if THINK_START not in model_output:
            return None, model_output
        before, _, after = model_output.partition(THINK_START)
        reasoning, end, rest = after.partition(THINK_END)
        if not end:
            return reasoning, before or None
        return reasoning, (before + rest) or None
