"""vLLM 0.33's declarative parser engine, streaming over new text only, for the engine-based
families (`qwen3_coder`/`qwen3_xml`, `minimax_m2`, `glm45`/`glm47`, `seed_oss`, ...).

In vLLM these families are one `ParserEngine` each (`parser/engine/*`, `parser/<family>.py`):
a `ParserEngineConfig` (terminal literals, which of them are matched by token id, a
`(state, terminal) -> (state, events)` transition table, an argument converter) drives
`StreamingParserEngine` (`TokenIDScanner` -> `IncrementalLexer` -> state machine -> semantic
events), and `ParserEngine` turns the events into deltas (tool-call slots, argument JSON
streamed by prefix, schema type coercion). The reasoning and tool adapters run the same engine
with tool parsing, resp. reasoning-only markup, switched off.

This module ports that machinery once. A family module supplies an `EngineConfig` and two
thin classes (`EngineReasoningParser` / `EngineToolParser` subclasses). Per-stream data is one
`EngineState` struct: the lexer look-behind (shorter than the longest marker), the scanner's
deferred terminals, a few flags, and the *current* tool call's raw argument text and streamed
JSON (vLLM's arg converters re-read a call's whole argument text at parameter boundaries, and
schema coercion of the arguments needs all of them). So the state is bounded by the size of
one tool call, not by the stream; text inside a parameter value streams in O(new text) through
the value extender, as in vLLM.

JSON-array tool bodies (`tool_call_body_array`, Granite's `<|tool_call|>[{...}, ...]`) split
into one call per element with a two-flag state.

Not ported (no family here uses them): `MESSAGE_HEADER` states, reasoning-token counting,
Kimi-style tool-call ids.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolCallDelta, ToolIdFn, json_string_body
from render_service.parsers.held import HeldText
from render_service.parsers.protocols import ParserState, ReasoningParser, RequestAdjustment, ToolParser

# -- states, events, config ------------------------------------------------------------------------

CONTENT, REASONING, TOOL_PREAMBLE, TOOL_NAME, TOOL_ARGS, TOOL_BETWEEN = range(6)
TOOL_STATES = frozenset((TOOL_PREAMBLE, TOOL_NAME, TOOL_ARGS, TOOL_BETWEEN))
PLAIN_STATES = frozenset((CONTENT, REASONING))

EV_TEXT, EV_REASONING, EV_REASONING_START, EV_REASONING_END, EV_TOOL_START, EV_TOOL_NAME, EV_ARG, EV_TOOL_END = range(8)
REASONING_EVENTS = frozenset((EV_REASONING_START, EV_REASONING_END))
Event = tuple[int, str, int]  # (type, value, tool index)

DROP = "__DROP__"  # a special token the config does not name: dropped
CONTENT_EVENTS: Mapping[int, int] = {
    CONTENT: EV_TEXT,
    REASONING: EV_REASONING,
    TOOL_NAME: EV_TOOL_NAME,
    TOOL_ARGS: EV_ARG,
}


@dataclass(frozen=True, slots=True)
class Transition:
    next_state: int
    events: tuple[int, ...] = ()
    skip_in_token_id_mode: bool = False


class ValueExt(msgspec.Struct, array_like=True):
    """The state of an open-value extender (vLLM's `ArgValueExtender` closure)."""

    window: str = ""
    started: bool = False
    held: str = ""
    raw_len: int = 0  # length of the open value's raw text when the extender started
    count: int = 0  # a family's running counter (Gemma 4: ")" minus "(" in the call's arguments)


ArgConverter = Callable[[str, bool], str]
# (raw args) -> extender state or None; (state, delta) -> escaped text or None (the value ended)
ExtenderStart = Callable[[str], ValueExt | None]
ExtenderStep = Callable[[ValueExt, str], str | None]


@dataclass(frozen=True)
class EngineConfig:
    """vLLM's `ParserEngineConfig` (the fields the ported families use)."""

    name: str
    terminals: Mapping[str, str | tuple[str, ...]]
    token_id_terminals: Mapping[str, str]
    transitions: Mapping[tuple[int, str], Transition]
    initial_state: int = CONTENT
    wait_for_reasoning: bool | None = None
    arg_converter: ArgConverter | None = None
    extender_start: ExtenderStart | None = None
    extender_step: ExtenderStep | None = None
    stream_arg_deltas: bool = True
    tool_args_json: bool = True
    tool_call_body_array: bool = False
    arg_structural_chars: frozenset[str] | None = None
    preserve_tokens: frozenset[str] = frozenset()
    turn_boundary_tokens: frozenset[str] = frozenset()
    strip_trailing_reasoning_whitespace: bool = True
    drop_whitespace_only_content_before_tools: bool = True
    strip_content_whitespace_with_tools: bool = True
    validate_tool_names: bool = False
    # The converter trims one wrapping newline of each value (Qwen3 XML).
    value_trims_newlines: bool = False
    # Tool names are stripped of surrounding whitespace (GLM).
    strip_tool_names: bool = False
    # The converter returns the call's raw JSON text (a verbatim span of it, Granite): text
    # appended inside an open string value is appended to the converted JSON unchanged, so
    # streaming that value needs no re-conversion (`Engine._extend_open_string`).
    verbatim_json_args: bool = False
    content_events: Mapping[int, int] = field(default_factory=lambda: dict(CONTENT_EVENTS))

    @property
    def literals(self) -> list[tuple[str, str]]:
        out = []
        for name, value in self.terminals.items():
            for lit in (value,) if isinstance(value, str) else value:
                out.append((lit, name))
        return out


# -- per-stream state ------------------------------------------------------------------------------


class Slot(msgspec.Struct, array_like=True):
    """The tool call being parsed (vLLM's `ToolCallSlot`); finished calls are not kept."""

    name: str = ""
    args: str = ""  # raw argument text of this call
    name_sent: bool = False
    string_keys: list[str] | None = None
    streamed: str = ""  # the argument JSON streamed so far
    ext: ValueExt | None = None
    open_value_streams: bool = False
    value_start: int = -1  # where the open value starts in `args`
    string_start: int = -1  # where its JSON string starts in `streamed`
    id: str = ""  # an id the family's format carries (Kimi's header); else `tool_id(index)`
    # verbatim_json_args: the arguments end inside an open, streamed top-level string value
    in_open_string: bool = False
    escaped: bool = False  # ... and its last character is an unpaired backslash
    clean: bool = False  # ... and its text has no backslash or control character (elidable)
    unelided: int = 0  # characters appended to it since it was last elided


class EngineState(ParserState):
    """One stream of an engine-based parser. Families subclass it with their own tag."""

    state: int = CONTENT
    tool_index: int = -1
    ever_ids: bool = False
    buf: str = ""  # lexer look-behind
    dterms: list[tuple[str, int, str]] = msgspec.field(default_factory=list)  # scanner: deferred terminals
    dpost: str = ""  # scanner: text held with them
    in_skipped_tool_span: bool = False
    args_buffer: str = ""  # JSON-args streaming (tool_args_json)
    args_depth: int = 0
    args_in_string: bool = False
    args_escape: bool = False
    reasoning_ended: bool = False
    nslots: int = 0
    slot: Slot | None = None
    deferred_content: str = ""
    deferred_reasoning: str = ""
    content_has_nonws: bool = False
    array_started: bool = False  # tool_call_body_array: the "[" was seen
    array_in_element: bool = False  # ... and a "{...}" element is open


class WholeCallsState(EngineState):
    """The state of a tool parser that sends each call whole (`EngineToolParser.calls_whole`):
    what the stream holds until batch's decision about it is known.

    Held text lives in `HeldText` fields (append-only, stored beside a snapshot), so a chunk
    costs the same however long the open call or the held content is.
    """

    raw: HeldText = msgspec.field(default_factory=HeldText)  # the open call's raw argument text
    slot_open: bool = False  # the last call started is not decided yet
    sent: int = 0  # calls sent (the next one's index)
    after_tool: bool = False  # a tool event was seen: batch keeps later text only if no call is named
    dropping: bool = False  # a call was named: batch drops every later text (and strips before it)
    called: bool = False  # batch's `tools_called`: some call was accepted
    held_ws: str = ""  # trailing whitespace of the content before the first tool event
    held_after: HeldText = msgspec.field(default_factory=HeldText)  # text after it, undecided


Item = tuple[str, str] | tuple[str, str, int, str]  # ("text", text) | ("term", terminal, id, text)


# -- helpers shared with the families ----------------------------------------------------------------


def is_json_finite(obj: Any) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
        return True
    except (ValueError, TypeError):
        return False


def extract_types_from_schema(schema: Any) -> list[str]:
    """vLLM's `extract_types_from_schema` (type, enum, anyOf/oneOf/allOf)."""
    if schema is None or not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    if "type" in schema:
        value = schema["type"]
        if isinstance(value, str):
            types.add(value)
        elif isinstance(value, list):
            types.update(t for t in value if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        for v in enum:
            if v is None:
                types.add("null")
            elif isinstance(v, bool):
                types.add("boolean")
            elif isinstance(v, int):
                types.add("integer")
            elif isinstance(v, float):
                types.add("number")
            elif isinstance(v, str):
                types.add("string")
            elif isinstance(v, list):
                types.add("array")
            elif isinstance(v, dict):
                types.add("object")
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        if isinstance(choices, list):
            for choice in choices:
                types.update(extract_types_from_schema(choice))
    return list(types) if types else ["string"]


_TYPE_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}
_TYPE_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def coerce_to_schema_type(value: str, schema_type: str | list[str]) -> Any:
    """vLLM's `coerce_to_schema_type`: the first coercion that works, by type priority."""
    if isinstance(schema_type, str):
        schema_type = [schema_type]
    wanted = {_TYPE_ALIASES.get(k, k) for t in schema_type for k in [t.strip().lower()]}
    for candidate in _TYPE_PRIORITY:
        if candidate not in wanted:
            continue
        if candidate == "null":
            if value.lower() == "null":
                return None
        elif candidate == "string":
            return value
        elif candidate == "integer":
            try:
                return int(value)
            except (ValueError, TypeError):
                pass
        elif candidate == "number":
            try:
                return int(value)
            except (ValueError, TypeError):
                pass
            try:
                number = float(value)
            except (ValueError, TypeError):
                continue
            if not math.isfinite(number):
                continue
            return number if number != int(number) else int(number)
        elif candidate == "boolean":
            lower = value.lower().strip()
            if lower in ("true", "1"):
                return True
            if lower in ("false", "0"):
                return False
        else:  # object, array
            try:
                parsed = json.loads(value)
            except (ValueError, TypeError):
                continue
            if is_json_finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if is_json_finite(parsed) else value


def _function_tools(tools: Any) -> list[tuple[str, Any]]:
    out = []
    for tool in tools or ():
        if isinstance(tool, Mapping) and tool.get("type", "function") == "function":
            function = tool.get("function")
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                out.append((function["name"], function.get("parameters")))
    return out


def find_tool_properties(tools: Any, name: str) -> dict[str, Any]:
    for tool_name, params in _function_tools(tools):
        if tool_name == name:
            props = (params or {}).get("properties", {}) if isinstance(params or {}, Mapping) else {}
            return props if isinstance(props, dict) else {}
    return {}


def find_tool_name(tools: Any, name: str) -> bool:
    return any(tool_name == name for tool_name, _ in _function_tools(tools))


# -- the engine --------------------------------------------------------------------------------------


class Engine:
    """`StreamingParserEngine` + `ParserEngine` for one config and tokenizer: immutable tables;
    every method takes the stream's `EngineState`."""

    def __init__(
        self,
        config: EngineConfig,
        info: TokenizerInfo,
        *,
        skip_tool_parsing: bool = False,
        skip_reasoning_parsing: bool = False,
    ) -> None:
        self.config = config
        self.info = info
        self.skip_tool_parsing = skip_tool_parsing
        self.skip_reasoning_parsing = skip_reasoning_parsing
        resolved: dict[int, str] = {}
        for name, text in config.token_id_terminals.items():
            tid = info.token_to_id(text)
            if tid is not None:
                resolved[tid] = name
        configured = (
            set(config.token_id_terminals.values()) | {lit for lit, _ in config.literals} | config.preserve_tokens
        )
        drop_texts: set[str] = set()
        for text, tid in zip(info.special_tokens, info.special_ids, strict=False):
            if text not in configured:
                resolved[tid] = DROP
                drop_texts.add(text)
        self.has_drops = bool(drop_texts)
        self.resolved = resolved
        self.strict_names = frozenset(resolved.values())
        literals = config.literals + [(t, DROP) for t in sorted(drop_texts)]
        self.literals = literals
        self.first_chars = frozenset(lit[0] for lit, _ in literals if lit)
        self.prefix_set = frozenset(lit[:i] for lit, _ in literals for i in range(1, len(lit)))
        by_first: dict[str, list[tuple[str, str]]] = {}
        for lit, name in literals:
            by_first.setdefault(lit[0], []).append((lit, name))
        self.by_first = by_first

        transitions = config.transitions
        self.tool_terminals = frozenset(
            t for (s, t), tr in transitions.items() if tr.next_state in TOOL_STATES or s in TOOL_STATES
        )
        self.tool_exit_terminals = frozenset(
            t for (s, t), tr in transitions.items() if s in TOOL_STATES and tr.next_state not in TOOL_STATES
        )
        self.reasoning_markup_terminals = self._reasoning_markup_terminals()
        self.has_reasoning = (
            "THINK_END" in config.token_id_terminals
            or "THINK_START" in config.terminals
            or "THINK_END" in config.terminals
            or config.initial_state == REASONING
        )
        start_text = config.token_id_terminals.get("THINK_START")
        end_text = config.token_id_terminals.get("THINK_END")
        self.start_id = info.token_to_id(start_text) if start_text else None
        self.end_id = info.token_to_id(end_text) if end_text else None
        self.boundary_ids = frozenset(
            t for t in (info.token_to_id(b) for b in config.turn_boundary_tokens) if t is not None
        )
        self.end_ids = self._reasoning_end_ids()

    def _reasoning_markup_terminals(self) -> frozenset[str]:
        transitions = self.config.transitions
        markers = frozenset(
            t
            for (s, t), tr in transitions.items()
            if REASONING in (s, tr.next_state) and tr.next_state not in TOOL_STATES
        )
        for (s, t), tr in transitions.items():
            if t not in markers:
                continue
            if s not in PLAIN_STATES or tr.next_state not in PLAIN_STATES or not REASONING_EVENTS.issuperset(tr.events):
                return frozenset()
        return markers

    def _reasoning_end_ids(self) -> frozenset[int]:
        config = self.config
        end_terminals: dict[str, int] = {}
        for (s, t), tr in config.transitions.items():
            if s != REASONING:
                continue
            if EV_REASONING_END in tr.events:
                end_terminals.setdefault(t, tr.next_state)
            elif tr.next_state != REASONING:
                return frozenset()
        ids: set[int] = set()
        for terminal, next_state in end_terminals.items():
            text = config.token_id_terminals.get(terminal)
            tid = self.info.token_to_id(text) if text is not None else None
            if tid is not None:
                ids.add(tid)
            elif next_state == CONTENT:
                return frozenset()
        return frozenset(ids)

    # -- prompt ------------------------------------------------------------------------------------

    def is_reasoning_end(self, prompt_ids: Sequence[int]) -> bool:
        config = self.config
        wait = config.wait_for_reasoning
        if wait is None:
            wait = config.initial_state == REASONING
        start = config.transitions.get((config.initial_state, "THINK_START"))
        start_opens = start is not None and start.next_state == REASONING
        for tid in reversed(prompt_ids):
            if tid in self.end_ids:
                return True
            if tid == self.start_id:
                if start_opens:
                    return False
                break
            if tid in self.boundary_ids:
                break
        return not wait

    def extract_content_ids(self, ids: Sequence[int]) -> Sequence[int]:
        """`ParserEngine.extract_content_ids`."""
        config = self.config
        wait = config.wait_for_reasoning
        if wait is None:
            wait = config.initial_state == REASONING
        if not wait:
            return ids
        if self.end_id is not None:
            for i in range(len(ids) - 1, -1, -1):
                if ids[i] == self.end_id:
                    return ids[i + 1 :]
        if self.end_ids:
            turn_start = 0
            for i in range(len(ids) - 1, -1, -1):
                if ids[i] in self.boundary_ids:
                    turn_start = i + 1
                    break
            for i in range(turn_start, len(ids)):
                if ids[i] in self.end_ids:
                    return ids[i:]
        return ids

    def new_state(self, state_type: type[EngineState], initial: int) -> EngineState:
        return state_type(state=initial, reasoning_ended=not self.has_reasoning)

    # -- StreamingParserEngine ------------------------------------------------------------------------

    def feed(self, st: EngineState, text: str, ids: Sequence[int]) -> list[Event]:
        if ids:
            st.ever_ids = True
        resolved = self.resolved
        if text and not st.buf and not st.dterms and self.first_chars.isdisjoint(text):
            if not any(t in resolved for t in ids):
                return self._emit(st, text)
        return self._process_items(st, self._scan(st, text, ids))

    def finish(self, st: EngineState) -> list[Event]:
        events = self._process_items(st, self._flush_pending(st))
        events.extend(self._lex_tokens(st, self._lex_flush(st)))
        if st.args_buffer:
            events.append((EV_ARG, st.args_buffer, st.tool_index))
            st.args_buffer = ""
        if st.state in TOOL_STATES:
            # In array mode a closed element already ended its call; only an open one needs it.
            end_open_call = st.array_in_element if self.config.tool_call_body_array else True
            if end_open_call and st.tool_index >= 0:
                events.append((EV_TOOL_END, "", st.tool_index))
            st.state = CONTENT
        elif st.state == REASONING:
            events.append((EV_REASONING_END, "", st.tool_index))
            st.state = CONTENT
        return events

    def _process_items(self, st: EngineState, items: list[Item]) -> list[Event]:
        events: list[Event] = []
        for item in items:
            if item[0] == "term":
                events.extend(self._lex_tokens(st, self._lex_flush(st)))
                events.extend(self._on_terminal(st, item[1], item[3]))  # type: ignore[misc]
            elif item[1]:
                events.extend(self._lex_tokens(st, self._lex_feed(st, item[1])))
        return events

    def _lex_tokens(self, st: EngineState, tokens: list[tuple[str | None, str]]) -> list[Event]:
        events: list[Event] = []
        strict = self.strict_names if st.ever_ids else None
        for terminal, value in tokens:
            if terminal is None or (strict and terminal in strict):
                if value:
                    events.extend(self._emit(st, value))
            else:
                events.extend(self._on_terminal(st, terminal, value))
        return events

    def _on_terminal(self, st: EngineState, terminal: str, value: str) -> list[Event]:
        transition = self.config.transitions.get((st.state, terminal))
        if transition is None:
            if self.has_drops and terminal == DROP:
                return []
            if self.skip_tool_parsing and terminal in self.tool_exit_terminals:
                st.in_skipped_tool_span = False
            return self._emit(st, value)
        if self.skip_reasoning_parsing and terminal in self.reasoning_markup_terminals:
            return self._emit(st, value)
        if self.skip_tool_parsing and terminal in self.tool_terminals:
            is_opener = transition.next_state in TOOL_STATES
            is_exit = terminal in self.tool_exit_terminals
            if not (is_exit and not is_opener and not st.in_skipped_tool_span):
                if is_opener:
                    st.in_skipped_tool_span = True
                elif is_exit:
                    st.in_skipped_tool_span = False
                if EV_REASONING_END in transition.events:
                    st.state = CONTENT
                    return [(EV_REASONING_END, value, st.tool_index), (EV_TEXT, value, st.tool_index)]
                content_type = self.config.content_events.get(st.state)
                return [] if content_type is None else [(content_type, value, st.tool_index)]
        if transition.skip_in_token_id_mode and st.ever_ids:
            return self._emit(st, value)
        return self._apply(st, transition, value)

    def _emit(self, st: EngineState, text: str) -> list[Event]:
        if st.state == TOOL_ARGS:
            if self.config.tool_call_body_array:
                return self._feed_array_text(st, text)
            if self.config.tool_args_json:
                return self._feed_args_json(st, text)
            return [(EV_ARG, text, st.tool_index)]
        content_type = self.config.content_events.get(st.state)
        return [] if content_type is None else [(content_type, text, st.tool_index)]

    def _apply(self, st: EngineState, transition: Transition, value: str) -> list[Event]:
        events: list[Event] = []
        if st.state == TOOL_ARGS and transition.next_state != TOOL_ARGS and st.args_buffer:
            events.append((EV_ARG, st.args_buffer, st.tool_index))
            st.args_buffer = ""
        st.state = transition.next_state
        for event_type in transition.events:
            if event_type == EV_TOOL_START:
                st.tool_index += 1
            if event_type == EV_TEXT and not value:
                continue
            events.append((event_type, value, st.tool_index))
        if st.state == TOOL_ARGS:
            st.args_depth = 0
            st.args_in_string = False
            st.args_escape = False
            if self.config.tool_call_body_array:
                st.array_started = st.array_in_element = False
        return events

    # -- JSON-array tool body (tool_call_body_array) -----------------------------------------------

    def _feed_array_text(self, st: EngineState, text: str) -> list[Event]:
        """One call per `{...}` element of a `[...]` body; the `]` ends the region and what
        follows is content; anything but the array's structure before an element bails out to
        content (the marker was not followed by a JSON array)."""
        events: list[Event] = []
        i, n = 0, len(text)
        while i < n:
            if st.state != TOOL_ARGS:  # the array closed mid-chunk
                events.extend(self._emit(st, text[i:]))
                break
            run = self._plain_string_run(st, text, i)
            if run:
                events.extend(self._feed_args_json(st, text[i:run]))
                i = run
                continue
            events.extend(self._feed_array_char(st, text[i]))
            i += 1
        return events

    def _plain_string_run(self, st: EngineState, text: str, i: int) -> int:
        """verbatim_json_args: the end of the run of characters from `text[i]` on that stay
        inside the element's open JSON string (no quote, no backslash), or 0. Such a run moves
        neither the JSON structure nor the converted arguments except by appending to them, so
        it is one argument event instead of one per character (the same deltas, see
        `_extend_open_string`)."""
        if not (self.config.verbatim_json_args and st.array_in_element and st.args_in_string and not st.args_escape):
            return 0
        m = _PLAIN_STRING_RUN.match(text, i)
        return m.end() if m is not None and m.end() - i > 1 else 0

    def _feed_array_char(self, st: EngineState, ch: str) -> list[Event]:
        if st.array_in_element:
            events = self._feed_args_json(st, ch)
            if ch == "}" and not st.args_in_string and not st.args_escape and st.args_depth == 0:
                st.array_in_element = False  # the element object closed: flush its held "}"
                if st.args_buffer:
                    events.append((EV_ARG, st.args_buffer, st.tool_index))
                    st.args_buffer = ""
                events.append((EV_TOOL_END, "", st.tool_index))
            return events
        if ch in " \t\r\n":
            return []
        if not st.array_started:
            if ch == "[":
                st.array_started = True
                return []
            return self._bail_array(st, ch)
        if ch == ",":
            return []
        if ch == "{":
            st.tool_index += 1
            st.args_buffer = ""
            st.args_depth = 0
            st.args_in_string = st.args_escape = False
            st.array_in_element = True
            return [(EV_TOOL_START, "", st.tool_index), *self._feed_args_json(st, ch)]
        if ch == "]":
            st.state = CONTENT
            st.array_started = st.array_in_element = False
            return []
        return self._bail_array(st, ch)

    def _bail_array(self, st: EngineState, ch: str) -> list[Event]:
        st.state = CONTENT
        st.array_started = st.array_in_element = False
        return self._emit(st, ch)

    def _feed_args_json(self, st: EngineState, text: str) -> list[Event]:
        """Stream JSON argument text, holding back a closing top-level brace."""
        events: list[Event] = []
        # A run of characters inside a string (no quote, no backslash) changes no structure:
        # one event for it instead of one per character, where the events' answers concatenate
        # (raw arguments with no converter, or a verbatim converter: `_extend_open_string`).
        merge = self.config.verbatim_json_args or self.config.arg_converter is None
        i, n = 0, len(text)
        while i < n:
            if merge and st.args_in_string and not st.args_escape:
                m = _PLAIN_STRING_RUN.match(text, i)
                if m is not None and m.end() - i > 1:
                    events.append((EV_ARG, st.args_buffer + text[i : m.end()], st.tool_index))
                    st.args_buffer = ""
                    i = m.end()
                    continue
            ch = text[i]
            i += 1
            st.args_buffer += ch
            hold = False
            if st.args_escape:
                st.args_escape = False
            elif st.args_in_string:
                if ch == "\\":
                    st.args_escape = True
                elif ch == '"':
                    st.args_in_string = False
            elif ch == '"':
                st.args_in_string = True
            elif ch in "{[":
                st.args_depth += 1
            elif ch in "}]":
                if st.args_depth > 0:
                    st.args_depth -= 1
                hold = st.args_depth == 0
            if not hold:
                events.append((EV_ARG, st.args_buffer, st.tool_index))
                st.args_buffer = ""
        return events

    # -- IncrementalLexer --------------------------------------------------------------------------

    def _lex_feed(self, st: EngineState, text: str) -> list[tuple[str | None, str]]:
        if not st.buf and self.first_chars.isdisjoint(text):
            return [(None, text)]
        st.buf += text
        return self._drain(st, final=False)

    def _lex_flush(self, st: EngineState) -> list[tuple[str | None, str]]:
        if not st.buf:
            return []
        tokens = self._drain(st, final=True)
        if st.buf:
            tokens.append((None, st.buf))
            st.buf = ""
        return tokens

    def _drain(self, st: EngineState, *, final: bool) -> list[tuple[str | None, str]]:
        tokens: list[tuple[str | None, str]] = []
        first_chars, by_first, prefix_set = self.first_chars, self.by_first, self.prefix_set
        buf = st.buf
        while buf:
            if first_chars.isdisjoint(buf):
                tokens.append((None, buf))
                buf = ""
                break
            best: tuple[str, str] | None = None
            candidates = by_first.get(buf[0], ())
            for lit, name in candidates:
                if buf.startswith(lit) and (best is None or len(lit) > len(best[1])):
                    best = (name, lit)
            if buf in prefix_set and not final:
                if best is not None and not any(
                    len(lit) > len(best[1]) and lit.startswith(buf) for lit, _ in candidates
                ):
                    tokens.append(best)
                    buf = buf[len(best[1]) :]
                    continue
                break
            if best is not None:
                tokens.append(best)
                buf = buf[len(best[1]) :]
            else:
                end = self._content_boundary(buf)
                tokens.append((None, buf[:end]))
                buf = buf[end:]
        st.buf = buf
        return tokens

    def _content_boundary(self, buf: str) -> int:
        n = len(buf)
        first_chars = self.first_chars
        for i in range(1, n):
            if buf[i] not in first_chars:
                continue
            remaining = n - i
            for lit, _ in self.literals:
                check = min(remaining, len(lit))
                if buf[i : i + check] == lit[:check]:
                    return i
        return n

    # -- TokenIDScanner -------------------------------------------------------------------------------

    def _scan(self, st: EngineState, text: str, ids: Sequence[int]) -> list[Item]:
        prefix: list[Item] = []
        effective = text
        if st.dterms:
            prefix, effective = self._resolve_deferred(st, text)
        resolved = self.resolved
        if not resolved or not any(t in resolved for t in ids):
            if effective:
                prefix.append(("text", effective))
            return prefix
        decode = self.info.decode_one
        results: list[Item] = []
        acc: list[str] = []
        for tid in ids:
            terminal = resolved.get(tid)
            if terminal is not None:
                joined = "".join(acc)
                if joined:
                    results.append(("text", joined))
                acc = []
                results.append(("term", terminal, tid, decode(tid)))
            else:
                acc.append(decode(tid))
        joined = "".join(acc)
        if joined:
            results.append(("text", joined))
        if effective:
            results = self._recover_holdback(st, effective, results)
        else:
            st.dterms.extend((r[1], r[2], r[3]) for r in results if r[0] == "term")  # type: ignore[misc]
            results = []
        return prefix + results

    def _flush_pending(self, st: EngineState) -> list[Item]:
        if not st.dterms and not st.dpost:
            return []
        items: list[Item] = []
        if st.dpost:
            items.append(("text", st.dpost))
            st.dpost = ""
        items.extend(("term", t[0], t[1], t[2]) for t in st.dterms)
        st.dterms = []
        return items

    def _resolve_deferred(self, st: EngineState, text: str) -> tuple[list[Item], str]:
        deferred = st.dterms
        st.dterms = []
        results: list[Item] = []
        remaining = text
        if st.dpost:
            remaining = st.dpost + remaining
            st.dpost = ""
        for terminal, tid, ttext in deferred:
            pos = remaining.find(ttext)
            if pos > 0:
                results.append(("text", remaining[:pos]))
                results.append(("term", terminal, tid, ttext))
                remaining = remaining[pos + len(ttext) :]
            elif pos == 0:
                results.append(("term", terminal, tid, ttext))
                remaining = remaining[len(ttext) :]
            else:
                if remaining:
                    st.dpost += remaining
                    remaining = ""
                st.dterms.append((terminal, tid, ttext))
        return results, remaining

    def _recover_holdback(self, st: EngineState, text: str, results: list[Item]) -> list[Item]:
        if not results:
            return [("text", text)]
        reconstructed = "".join(r[1] if r[0] == "text" else r[3] for r in results)  # type: ignore[misc]
        if not reconstructed:
            return [("text", text), *results]
        pos = text.find(reconstructed)
        if pos > 0:
            return [("text", text[:pos]), *results]
        if pos == 0:
            return results
        return self._rebuild_from_anchors(st, text, results)

    def _rebuild_from_anchors(self, st: EngineState, text: str, results: list[Item]) -> list[Item]:
        anchors = [r for r in results if r[0] == "term"]
        if not anchors:
            return [("text", text)]
        positions = [-1] * len(anchors)
        search_end = len(text)
        for i in range(len(anchors) - 1, -1, -1):
            pos = text.rfind(anchors[i][3], 0, search_end)  # type: ignore[misc]
            if pos >= 0:
                positions[i] = pos
                search_end = pos
        out: list[Item] = []
        consumed = 0
        for i, anchor in enumerate(anchors):
            pos = positions[i]
            if pos >= consumed:
                if pos > consumed:
                    out.append(("text", text[consumed:pos]))
                out.append(anchor)
                consumed = pos + len(anchor[3])  # type: ignore[misc]
            else:
                has_later_valid = any(p >= 0 for p in positions[i + 1 :])
                if not has_later_valid and consumed < len(text) and anchor[1] != DROP:
                    st.dpost += text[consumed:]
                    consumed = len(text)
                st.dterms.append((anchor[1], anchor[2], anchor[3]))  # type: ignore[misc]
        if consumed < len(text):
            out.append(("text", text[consumed:]))
        return out

    # -- ParserEngine: events -> deltas --------------------------------------------------------------

    def to_delta(
        self,
        st: EngineState,
        events: list[Event],
        *,
        finished: bool,
        tool_id: ToolIdFn,
        tools: Any,
        suppress: bool = False,
        done: list[Slot] | None = None,
    ) -> Delta | None:
        """`_events_to_delta`. `done` collects finished slots (batch only; batch keeps every
        argument's raw text, streaming elides long streamed values, see `_elide`)."""
        if not events and not st.deferred_content:
            return None
        calls: list[ToolCallDelta] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = st.deferred_content
        seen_tool_event = False
        for kind, value, index in events:
            if kind == EV_TEXT:
                if seen_tool_event:
                    st.deferred_content += value
                else:
                    content_parts.append(value)
            elif kind == EV_REASONING:
                reasoning_parts.append(value)
            elif kind == EV_REASONING_END:
                st.reasoning_ended = True
            elif suppress or kind == EV_REASONING_START:
                continue
            elif kind == EV_TOOL_START:
                seen_tool_event = True
                self._ensure_slot(st, index, done)
            elif kind == EV_TOOL_NAME:
                seen_tool_event = True
                slot = self._slot(st, index)
                slot.name += value
            elif kind == EV_ARG:
                seen_tool_event = True
                self._arg_chunk(st, index, value, calls, tool_id, tools, elide=done is None)
            elif kind == EV_TOOL_END:
                seen_tool_event = True
                self._tool_end(st, index, calls, tool_id, tools)
        if len(calls) > 1:
            calls = _coalesce(calls)
        if st.deferred_content and (not seen_tool_event or not calls):
            deferred_now = st.deferred_content[len(carried) :]
            if carried:
                content_parts.insert(0, carried)
            if deferred_now:
                content_parts.append(deferred_now)
            st.deferred_content = ""
        content = "".join(content_parts)
        if not st.content_has_nonws and content:
            if content.strip():
                st.content_has_nonws = True
            elif st.nslots:
                if self.config.drop_whitespace_only_content_before_tools:
                    content = ""
            elif not finished:
                st.deferred_content = content
                content = ""
        reasoning = "".join(reasoning_parts)
        if content or calls or reasoning:
            return Delta(content=content or None, reasoning=reasoning or None, tool_calls=calls)
        return None

    def to_delta_whole(
        self,
        st: WholeCallsState,
        events: list[Event],
        *,
        finished: bool,
        tool_id: ToolIdFn,
        tools: Any,
        forced: bool = False,
    ) -> Delta | None:
        """The stream of a tool parser that sends each call whole, accumulating to batch's
        answer (`extract_for_request`; `docs/parsers.md`, "Streaming accumulates to the batch
        answer").

        Batch converts each call's whole argument text once (a later duplicate or unclosed
        parameter changes what a partial conversion streamed), keeps the content before the
        first tool event (with its trailing whitespace stripped when a call is accepted), and
        keeps the text after that event only when no call is named at all. So the stream holds
        a call until it is decided (its end, the next call's start, or the end of the output)
        and sends it in one delta as batch converts it; holds the content's trailing whitespace
        until more content or a call decides it; and holds the text after the first tool event
        until a named call drops it or the output ends without one. `forced` (tool_choice
        required/named): batch drops a blank content when no call is accepted
        (`ChatParser._extract_tool_calls`), so does the stream's end.
        """
        calls: list[ToolCallDelta] = []
        content: list[str] = []
        reasoning: list[str] = []
        for kind, value, index in events:
            if kind == EV_TEXT:
                if st.after_tool:
                    if not st.dropping:
                        st.held_after.append(value)
                    continue
                combined = st.held_ws + value
                if self.config.strip_content_whitespace_with_tools:
                    kept = combined.rstrip()  # trailing whitespace: stripped if a call follows
                elif st.content_has_nonws or combined.strip():
                    kept = combined
                else:
                    kept = ""  # whitespace-only content: dropped if a call follows
                st.held_ws = combined[len(kept) :]
                if kept:
                    content.append(kept)
                    st.content_has_nonws = True
            elif kind == EV_REASONING:
                reasoning.append(value)
            elif kind == EV_REASONING_END:
                st.reasoning_ended = True
            elif kind == EV_REASONING_START:
                continue
            elif kind == EV_TOOL_START:
                st.after_tool = True
                self._decide_whole(st, calls, tool_id, tools)
                st.slot = Slot()
                st.raw = HeldText()
                st.nslots += 1
                st.slot_open = True
            elif kind == EV_TOOL_NAME:
                st.after_tool = True
                if st.slot_open and st.slot is not None and index == st.nslots - 1:
                    st.slot.name += value
            elif kind == EV_ARG:
                st.after_tool = True
                if st.slot_open and index == st.nslots - 1:
                    st.raw.append(value)
            elif kind == EV_TOOL_END:
                st.after_tool = True
                if index == st.nslots - 1:
                    self._decide_whole(st, calls, tool_id, tools)
        if finished:
            self._decide_whole(st, calls, tool_id, tools)
            tail = st.held_ws + ("" if st.dropping else st.held_after.text())
            config = self.config
            if (
                not st.content_has_nonws
                and not tail.strip()
                and (
                    (st.nslots and config.drop_whitespace_only_content_before_tools)
                    or (st.called and config.strip_content_whitespace_with_tools)
                )
            ) or (forced and not st.called and not st.content_has_nonws and not tail.strip()):
                tail = ""  # whitespace-only content with tools (or with calls forced): dropped
            elif st.called and self.config.strip_content_whitespace_with_tools:
                tail = tail.rstrip()  # batch strips the content (its leading whitespace: see strip_content)
            if tail:
                content.append(tail)
            st.held_ws = ""
            st.held_after = HeldText()
        text = "".join(content)
        joined = "".join(reasoning)
        if text or calls or joined:
            return Delta(content=text or None, reasoning=joined or None, tool_calls=calls)
        return None

    def _decide_whole(self, st: WholeCallsState, calls: list[ToolCallDelta], tool_id: ToolIdFn, tools: Any) -> None:
        """The open call is decided: send it as batch converts it, if batch keeps it."""
        if not st.slot_open or st.slot is None:
            return
        st.slot_open = False
        slot = self.settle_slot(Slot(name=st.slot.name, args=st.raw.text()))
        st.slot = Slot()
        st.raw = HeldText()
        # Batch drops the text after the first tool event once any call's name is emitted
        # (`to_delta`'s calls), and strips the content once `build_result` keeps a call.
        name = slot.name.strip() if self.config.strip_tool_names else slot.name
        if not name:
            # No name markup: batch's `to_delta` names the call from its arguments' "name"
            # (`_emit_name`), so `build_result` converts the arguments as they stand instead of
            # re-reading the element as JSON (which needs it whole and decodes its escapes).
            from_args = _name_from_args(slot.args) or ""
            if self.config.strip_tool_names:
                from_args = from_args.strip()
            if self._accept_name(from_args, tools):
                slot.name = name = from_args
        if self._accept_name(name, tools):
            st.dropping = True
        _, built = self.build_result([slot], tools, _batch_ids)
        if not built:
            return
        st.called = st.dropping = True
        st.held_ws = ""
        st.held_after = HeldText()
        index = st.sent
        st.sent += 1
        call = built[0]
        calls.append(
            ToolCallDelta(
                index=index, id=call.call_id(tool_id, index), type="function", name=call.name, arguments=call.arguments
            )
        )

    def settle_slot(self, slot: Slot) -> Slot:
        """A whole call's slot (its name text and raw arguments) as batch's `to_delta` leaves it
        for `build_result`: families whose hooks rewrite the name (Kimi's header) override it."""
        return slot

    def strip_trailing_reasoning(self, st: EngineState, delta: Delta | None) -> Delta | None:
        """`_strip_trailing_reasoning`: trailing reasoning whitespace waits for what follows."""
        if not self.config.strip_trailing_reasoning_whitespace:
            return delta
        if delta is not None and delta.reasoning is not None:
            combined = st.deferred_reasoning + delta.reasoning
            trimmed = combined.rstrip()
            st.deferred_reasoning = combined[len(trimmed) :]
            delta.reasoning = trimmed or None
            if delta.reasoning is None and delta.content is None and not delta.tool_calls:
                return None
        elif st.deferred_reasoning and st.reasoning_ended:
            st.deferred_reasoning = ""
        return delta

    def _ensure_slot(self, st: EngineState, index: int, done: list[Slot] | None) -> None:
        while st.nslots <= index:
            if done is not None and st.slot is not None:
                done.append(st.slot)
            st.slot = Slot()
            st.nslots += 1

    def _slot(self, st: EngineState, index: int) -> Slot:
        if index != st.nslots - 1 or st.slot is None:
            raise IndexError(f"tool call {index} is not the open one")
        return st.slot

    def _accept_name(self, name: str, tools: Any) -> bool:
        if not name:
            return False
        if not self.config.validate_tool_names or not tools:
            return True
        return find_tool_name(tools, name)

    def _string_keys(self, tools: Any, name: str) -> list[str] | None:
        properties = find_tool_properties(tools, name)
        if not properties:
            return None
        return [k for k, schema in properties.items() if set(extract_types_from_schema(schema)) == {"string"}]

    def _emit_name(
        self, st: EngineState, index: int, calls: list[ToolCallDelta], name: str | None, tool_id: ToolIdFn, tools: Any
    ) -> None:
        if name is not None and self.config.strip_tool_names:
            name = name.strip()
        if name is None or not self._accept_name(name, tools):
            return
        slot = self._slot(st, index)
        slot.name = name
        slot.name_sent = True
        slot.string_keys = self._string_keys(tools, name)
        calls.append(ToolCallDelta(index=index, id=slot.id or tool_id(index), type="function", name=name))

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
        slot = self._slot(st, index)
        if value:
            slot.args += value
        if not slot.name_sent:
            if slot.name:
                self._emit_name(st, index, calls, slot.name, tool_id, tools)
            elif value:
                self._emit_name(st, index, calls, _name_from_args(slot.args), tool_id, tools)
        elif value:
            delta = self._arg_delta(slot, value, tools, elide=elide)
            if delta:
                calls.append(ToolCallDelta(index=index, arguments=delta))

    def _tool_end(self, st: EngineState, index: int, calls: list[ToolCallDelta], tool_id: ToolIdFn, tools: Any) -> None:
        if index >= st.nslots:
            return
        slot = self._slot(st, index)
        if self.config.strip_tool_names:
            slot.name = slot.name.strip()
        remaining = self._flush_args(slot, tools)
        if not slot.name_sent:
            name = slot.name or _name_from_args(slot.args) or ""
            if self._accept_name(name, tools):
                slot.name = name
                slot.name_sent = True
                slot.string_keys = self._string_keys(tools, name)
                calls.append(
                    ToolCallDelta(
                        index=index, id=slot.id or tool_id(index), type="function", name=name, arguments=remaining or ""
                    )
                )
                remaining = None
        if remaining and slot.name_sent:
            calls.append(ToolCallDelta(index=index, arguments=remaining))

    def _arg_delta(self, slot: Slot, raw_delta: str, tools: Any, *, elide: bool = False) -> str | None:
        """`_compute_arg_delta`."""
        config = self.config
        converter = config.arg_converter
        if converter is None:
            return raw_delta
        if not config.stream_arg_deltas:
            return None
        if slot.in_open_string:
            diff = self._extend_open_string(slot, raw_delta, elide=elide)
            if diff is not None:
                return diff
        if slot.ext is not None:
            assert config.extender_step is not None
            diff = config.extender_step(slot.ext, raw_delta)
            if diff is not None:
                if not diff or not slot.open_value_streams:
                    return None
                slot.streamed += diff
                if elide:
                    self._elide(slot)
                return diff
            slot.ext = None
        elif config.arg_structural_chars is not None and config.arg_structural_chars.isdisjoint(raw_delta):
            return None
        try:
            current = self.convert_args(slot, True, tools)
        except (ValueError, TypeError):
            return None
        if not current:
            return None
        if slot.name:
            current = self.fix_arg_types(current, slot.name, tools)
        prev = slot.streamed
        safe, value_streams = safe_arg_prefix(current, set(slot.string_keys) if slot.string_keys is not None else None)
        if not safe:
            return None
        if prev and not safe.startswith(prev):
            return None
        slot.streamed = safe
        if config.verbatim_json_args:
            self._enter_open_string(slot, safe, current, value_streams)
        if config.extender_start is not None:
            slot.ext = config.extender_start(slot.args)
            slot.open_value_streams = value_streams
            if slot.ext is not None and value_streams:
                slot.value_start = len(slot.args) - slot.ext.raw_len
                slot.string_start = _open_string_start(safe)
            else:
                slot.value_start = slot.string_start = -1
        return safe[len(prev) :] or None

    def _enter_open_string(self, slot: Slot, safe: str, current: str, value_streams: bool) -> None:
        """After a full conversion: note whether the arguments end inside an open string value
        that streams (`safe_arg_prefix` kept everything), so the following text is appended
        without converting again."""
        slot.in_open_string = value_streams and safe == current
        if not slot.in_open_string:
            return
        start = _open_string_start(safe)
        body = safe[start:]
        trailing = len(body) - len(body.rstrip("\\"))
        slot.escaped = trailing % 2 == 1
        slot.clean = _UNCLEAN.search(body) is None
        slot.unelided = len(body)
        slot.string_start = start
        slot.value_start = len(slot.args) - len(body)  # the span runs to the end of the raw text

    def _extend_open_string(self, slot: Slot, raw_delta: str, *, elide: bool) -> str | None:
        """`_compute_arg_delta` while the arguments end inside an open streamed string value
        (verbatim converters only): the raw text up to the string's closing quote is the
        converted text, and everything up to it is the safe prefix (a string never parses, so
        schema coercion leaves it as it is). None when the delta closes the string: the caller
        converts the whole text as vLLM does."""
        escaped = slot.escaped
        for ch in raw_delta:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                slot.in_open_string = False
                return None
        slot.escaped = escaped
        slot.streamed += raw_delta
        if slot.clean and _UNCLEAN.search(raw_delta) is not None:
            slot.clean = False
        slot.unelided += len(raw_delta)
        if elide and slot.clean and slot.unelided >= ELIDE_MIN_CHARS:
            # The value's text so far is plain (no escape, no control character): nothing reads
            # it again except to find the value's end, and `json.dumps` would write it as it
            # is, so one marker stands for it in both strings (see `_elide`).
            slot.args = slot.args[: slot.value_start] + ELIDED
            slot.streamed = slot.streamed[: slot.string_start] + ELIDED
            slot.unelided = 0
        return raw_delta

    def convert_args(self, slot: Slot, partial: bool, tools: Any) -> str:
        """The config's argument converter on the call's raw text (a family whose converter
        also reads the call's name or the request's tools overrides this)."""
        converter = self.config.arg_converter
        assert converter is not None
        return converter(slot.args, partial)

    def _elide(self, slot: Slot) -> None:
        """Keep a long streaming value out of the state.

        While an open string value streams through the extender, vLLM keeps its raw text in the
        call's arguments and its escaped text in the streamed JSON, and reads them again only
        when the value ends: to convert the arguments (a regex over the parameter markup, then
        `json.dumps`), coerce them (a string-typed value stays as it is) and cut the safe
        prefix (a scan of the JSON structure). None of these looks inside the value's text
        beyond the part that may still turn into its end marker (the extender's window) or be
        trimmed (the held newline). So the already streamed middle of the value is replaced,
        in both strings, by one fixed marker text without JSON-special characters: every later
        answer is the same, while the state stays bounded by the markup instead of growing
        with the value. Only the output of this stream is affected, never the batch path,
        which keeps the raw text (and a value that spells the marker, U+E000..U+E002, is the
        one input this could confuse).
        """
        ext = slot.ext
        if ext is None or slot.value_start < 0 or slot.string_start < 0:
            return
        args = slot.args
        head = slot.value_start
        if self.config.value_trims_newlines and args.startswith("\n", head):
            head += 1
        keep = len(ext.window) if len(ext.window) > len(ext.held) else len(ext.held)
        end = len(args) - keep
        if end - head < ELIDE_MIN_CHARS:
            return
        kept = args[end:]
        kept_json = json_string_body(kept[: len(kept) - len(ext.held)])
        streamed = slot.streamed
        if not streamed.endswith(kept_json) or len(streamed) - len(kept_json) < slot.string_start:
            return
        marker = self.elision_marker(args[head:end])
        slot.args = args[:head] + marker + kept
        slot.streamed = streamed[: slot.string_start] + marker + kept_json

    def elision_marker(self, elided: str) -> str:
        """What stands for the elided raw text `elided` in both strings: `ELIDED`, plus, for
        families whose converter counts characters over the whole arguments, those characters
        (JSON-neutral ones only; see `gemma4.py`)."""
        return ELIDED

    def _flush_args(self, slot: Slot, tools: Any) -> str | None:
        converter = self.config.arg_converter
        if converter is None:
            return None
        try:
            final = self.convert_args(slot, False, tools)
        except (ValueError, TypeError):
            return None
        if final:
            final = self.fix_arg_types(final, slot.name, tools)
        prev = slot.streamed
        if final and len(final) > len(prev):
            if prev and not final.startswith(prev):
                return None
            slot.streamed = final
            return final[len(prev) :]
        return None

    def fix_arg_types(self, args_json: str, name: str, tools: Any) -> str:
        """`_fix_arg_types`: coerce argument values to the tool schema's types."""
        if not tools or not name:
            return args_json
        try:
            args = json.loads(args_json)
        except ValueError:
            return args_json
        if not isinstance(args, dict):
            return args_json
        properties = find_tool_properties(tools, name)
        if not properties:
            return args_json
        _, changed = _coerce_dict(args, properties)
        return json.dumps(args, ensure_ascii=False) if changed else args_json

    # -- batch -----------------------------------------------------------------------------------------

    def build_result(self, slots: list[Slot], tools: Any, tool_id: ToolIdFn) -> tuple[bool, list[FunctionCall]]:
        """`_build_extracted_result` (content handled by the caller)."""
        calls: list[FunctionCall] = []
        for slot in slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            raw = slot.args
            if not name and raw.strip():
                name, args_json = _name_and_args(raw)
            elif raw.strip():
                converter = self.config.arg_converter
                if converter is not None:
                    try:
                        args_json = self.convert_args(slot, False, tools)
                    except (ValueError, TypeError):
                        args_json = self._extract_args_json(raw)
                else:
                    args_json = self._extract_args_json(raw)
            else:
                args_json = "{}"
            if self._accept_name(name, tools):
                args_json = self.fix_arg_types(args_json, name, tools)
                calls.append(FunctionCall(name=name, arguments=args_json, id=slot.id or None))
        return bool(calls), calls

    def _extract_args_json(self, raw: str) -> str:
        """`_extract_args_json` (families override it)."""
        return _args_json(raw)

    def strip_content(self, content: str, tools_called: bool, *, keep_leading: bool = False) -> str | None:
        """`_strip_content_whitespace`. `keep_leading`: only trailing whitespace is stripped (a
        stream that accumulates to batch sends the leading whitespace with the first text, before
        any call is known; see `EngineToolParser.calls_whole`)."""
        if tools_called:
            if self.config.strip_content_whitespace_with_tools:
                content = content.rstrip() if keep_leading else content.strip()
            elif self.config.drop_whitespace_only_content_before_tools and not content.strip():
                content = ""
        return content or None


ELIDED = "\ue000\ue001\ue002"  # stands for the streamed middle of a long value (see `Engine._elide`)
ELIDE_MIN_CHARS = 64
_PLAIN_STRING_RUN = re.compile(r'[^"\\]+')
_UNCLEAN = re.compile(r"[\\\x00-\x1f]")


def _open_string_start(json_text: str) -> int:
    """Index just after the opening quote of the JSON string `json_text` ends inside."""
    i = len(json_text) - 1
    while i >= 0:
        if json_text[i] == '"':
            backslashes = 0
            j = i - 1
            while j >= 0 and json_text[j] == "\\":
                backslashes += 1
                j -= 1
            if backslashes % 2 == 0:
                return i + 1
        i -= 1
    return -1


def _name_from_args(args: str) -> str | None:
    match = _NAME_RE.search(args)
    return match.group(1) or None if match else None


def _name_and_args(raw: str) -> tuple[str, str]:
    raw = raw.strip()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return "", raw
    if not isinstance(parsed, dict):
        return "", raw
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)


def _args_json(raw: str) -> str:
    if not raw.strip():
        return "{}"
    return _name_and_args(raw)[1]


def _coerce_value(value: Any, schema: dict[str, Any]) -> tuple[Any, bool]:
    if isinstance(value, str):
        coerced = coerce_to_schema_type(value, extract_types_from_schema(schema))
        return (coerced, True) if coerced is not value else (value, False)
    if isinstance(value, dict):
        nested = schema.get("properties")
        if isinstance(nested, dict):
            _, changed = _coerce_dict(value, nested)
            return value, changed
        return value, False
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            changed = False
            for i, item in enumerate(value):
                coerced, item_changed = _coerce_value(item, items)
                if item_changed:
                    value[i] = coerced
                    changed = True
            return value, changed
        return value, False
    as_str = json.dumps(value, ensure_ascii=False)
    coerced = coerce_to_schema_type(as_str, extract_types_from_schema(schema))
    if type(coerced) is not type(value) or coerced != value:
        return coerced, True
    return value, False


def _coerce_dict(args: dict[str, Any], properties: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    changed = False
    for key, value in args.items():
        prop = properties.get(key)
        if not isinstance(prop, dict):
            continue
        coerced, value_changed = _coerce_value(value, prop)
        if value_changed:
            args[key] = coerced
            changed = True
    return args, changed


# A JSON string (group 1: its raw body; group 2: its closing quote, None while open) or one
# structural character. Scanning with it visits each string once, in C, instead of per character.
JSON_TOKENS = re.compile(r'"((?:[^"\\]|\\.)*)(")?|[{}\[\]:]', re.DOTALL)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*(")?', re.DOTALL)


def safe_arg_prefix(json_str: str, string_keys: set[str] | None) -> tuple[str, bool]:
    """`_safe_arg_prefix`: the JSON up to the last top-level value (into it when that value
    is an open string of a string-typed key), and whether it stops inside that string."""
    last_colon = -1
    last_key: str | None = None
    pending_key: str | None = None
    depth = 0
    for m in JSON_TOKENS.finditer(json_str):
        c = json_str[m.start()]
        if c == '"':
            if m.group(2) is not None and depth == 1:
                pending_key = m.group(1)
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif depth == 1:  # ":"
            last_colon = m.start()
            last_key = pending_key
            pending_key = None
    if last_colon < 0:
        return "", False
    end = last_colon + 1
    while end < len(json_str) and json_str[end] in " \t\n\r":
        end += 1
    if end >= len(json_str) or json_str[end] != '"':
        return json_str[:end], False
    if string_keys is not None and last_key not in string_keys:
        return json_str[:end], False
    value = _JSON_STRING.match(json_str, end)
    if value is not None and value.group(1) is not None:
        return json_str[: value.end() - 1], True
    return json_str, True


def _coalesce(calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
    merged: dict[int, ToolCallDelta] = {}
    for tc in calls:
        existing = merged.get(tc.index)
        if existing is None:
            merged[tc.index] = tc
            continue
        if tc.id is not None and existing.id is None:
            existing.id = tc.id
        if tc.type is not None and existing.type is None:
            existing.type = tc.type
        if tc.name is not None and existing.name is None:
            existing.name = tc.name
        if tc.arguments is not None:
            existing.arguments = tc.arguments if existing.arguments is None else existing.arguments + tc.arguments
    if len(merged) == len(calls):
        return calls
    return list(merged.values())


_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]*)"')


# -- the two adapters ------------------------------------------------------------------------------


class EngineReasoningParser(ReasoningParser):
    """vLLM's `ParserEngineReasoningAdapter`: the engine with tool parsing switched off."""

    state_type: ClassVar[type[ParserState]]
    engine_based_streaming = True
    reads_enable_thinking: ClassVar[bool] = False  # the Qwen3-grammar families do

    engine_type: ClassVar[type[Engine]] = Engine  # a family's `Engine` subclass (vLLM's parser hooks)

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        self.engine = self.engine_type(self.config_for(thinking_enabled), tokenizer, skip_tool_parsing=True)

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        """The family's engine config for a request with thinking on or off."""
        raise NotImplementedError

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("enable_thinking", True)) if cls.reads_enable_thinking else True

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        request.skip_special_tokens = False  # ParserEngine.adjust_request

    def new_state(self) -> ParserState:
        return self.engine.new_state(self.state_type, self.engine.config.initial_state)  # type: ignore[arg-type]

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        return self.engine.is_reasoning_end(prompt_token_ids)

    # -- accumulating to the batch answer (see `extract`) -------------------------------------

    filters_after_end = True
    # A family sets it (`ReasoningParser.streams_whole_output`): the stream is batch's engine pass,
    # chunk by chunk (`after_end` from the first chunk: markers by text, a possible marker prefix
    # held at a chunk end, trailing reasoning whitespace held), and accumulates to `extract`.
    streams_whole_output: ClassVar[bool] = False

    def _batch_is_raw(self) -> bool:
        return self.reads_enable_thinking and not self.thinking_enabled

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        """Batch starts the engine in CONTENT when the prompt closes reasoning and the
        tokenizer has turn boundaries; without them it ignores the prompt (so does the
        stream: the engine runs from its initial state)."""
        engine = self.engine
        ends = engine.is_reasoning_end(prompt_token_ids)
        if not ends or self._batch_is_raw() or engine.config.initial_state != REASONING:
            return ends
        if not engine.boundary_ids:
            return False
        st.state = CONTENT
        return True

    def after_end(self, st: Any, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        """What batch's engine makes of the text after reasoning ended: it matches markers by
        text (it has no ids) and drops or switches on them. The lexer is flushed every chunk,
        so nothing is held back and the deltas keep vLLM's chunk boundaries."""
        if self._batch_is_raw():
            return Delta(content=text) if text else None
        engine = self.engine
        st.ever_ids = False
        events = engine.feed(st, text, ())
        if finished:
            events.extend(engine.finish(st))
        elif not self.streams_whole_output:
            events.extend(engine._lex_tokens(st, engine._lex_flush(st)))
        content = "".join(v for k, v, _ in events if k == EV_TEXT)
        reasoning = "".join(v for k, v, _ in events if k == EV_REASONING)
        if self.streams_whole_output and engine.config.strip_trailing_reasoning_whitespace:
            reasoning = self._hold_reasoning_ws(st, reasoning, finished=finished)
        if not content and not reasoning:
            return None
        return Delta(content=content or None, reasoning=reasoning or None)

    @staticmethod
    def _hold_reasoning_ws(st: Any, reasoning: str, *, finished: bool) -> str:
        """Batch strips the trailing whitespace of all the reasoning once, at the end (`extract`):
        the stream holds the reasoning's trailing whitespace until more reasoning text follows
        (then it goes out in front of it, even across content or a call in between) and drops it
        when the output ends. Only a run of whitespace is held, never text."""
        if not reasoning and not finished:
            return ""
        combined = st.deferred_reasoning + reasoning
        kept = combined.rstrip()
        st.deferred_reasoning = "" if finished else combined[len(kept) :]
        return kept

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        return self.engine.extract_content_ids(delta_ids)

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        engine = self.engine
        events = engine.feed(st, delta_text, delta_ids)
        delta = engine.to_delta(st, events, finished=False, tool_id=_no_ids, tools=None)
        return engine.strip_trailing_reasoning(st, delta), st.reasoning_ended

    def flush_on_transition(self, st: Any) -> Delta | None:
        events = self.engine.finish(st)
        if events or st.deferred_content:
            return self.engine.to_delta(st, events, finished=True, tool_id=_no_ids, tools=None)
        return None

    finish = flush_on_transition

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        if self.reads_enable_thinking and not self.thinking_enabled:
            return None, model_output
        engine = self.engine
        initial = engine.config.initial_state
        if (
            prompt_token_ids is not None
            and initial == REASONING
            and engine.boundary_ids
            and engine.is_reasoning_end(prompt_token_ids)
        ):
            initial = CONTENT
        st = engine.new_state(self.state_type, initial)  # type: ignore[arg-type]
        events = engine.feed(st, model_output, ())
        events.extend(engine.finish(st))
        reasoning = "".join(v for k, v, _ in events if k == EV_REASONING)
        if engine.config.strip_trailing_reasoning_whitespace:
            reasoning = reasoning.rstrip()
        content = "".join(v for k, v, _ in events if k == EV_TEXT)
        return reasoning or None, content or None


def _no_ids(index: int) -> str:
    raise AssertionError("the reasoning adapter never emits tool calls")


class EngineToolParser(ToolParser):
    """vLLM's `ParserEngineToolAdapter`: the engine started in CONTENT; with no reasoning
    parser configured, reasoning-only markup passes through as text."""

    config: ClassVar[EngineConfig]
    engine_based_streaming = True
    engine_type: ClassVar[type[Engine]] = Engine  # a family's `Engine` subclass (vLLM's parser hooks)
    # Send each call whole, once batch's decision about it is known, so the stream accumulates
    # to the batch answer (`Engine.to_delta_whole`; the state must be a `WholeCallsState`).
    # Batch then keeps the content's leading whitespace when a call is accepted, as the stream
    # does (vLLM strips it: a deliberate difference, `strip_content`).
    calls_whole: ClassVar[bool] = False
    # Match the markers by text, not by token id, as batch does (it has no ids): a marker spelled
    # by ordinary tokens then opens a call in the stream too (vLLM's stream keeps it as text).
    matches_by_text: ClassVar[bool] = False

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        self._engines: dict[tuple[bool, bool], Engine] = {}

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        """The config for a request with thinking on or off (vLLM builds the tool adapter's
        engine from the request's template kwargs too); most families have one."""
        return cls.config

    def engine(self) -> Engine:
        key = (not self.reasoning_configured, self.thinking_enabled)
        engine = self._engines.get(key)
        if engine is None:
            engine = self.engine_type(self.config_for(key[1]), self.info, skip_reasoning_parsing=key[0])
            self._engines[key] = engine
        return engine

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        request.skip_special_tokens = False  # ParserEngine.adjust_request

    def new_state(self) -> ParserState:
        return self.engine().new_state(self.state_type, CONTENT)  # type: ignore[arg-type]

    def feed(self, st: Any, text: str, tool_id: ToolIdFn) -> Delta | None:
        return self.feed_for_request(st, text, (), tool_id, RequestOptions(tool_choice="auto"))

    def feed_for_request(
        self, st: Any, text: str, token_ids: Sequence[int], tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        engine = self.engine()
        events = engine.feed(st, text, () if self.matches_by_text else token_ids)
        if self.calls_whole and not _suppress(opts):
            delta = engine.to_delta_whole(
                st, events, finished=False, tool_id=tool_id, tools=opts.tools, forced=opts.forces_tool_calls
            )
        else:
            delta = engine.to_delta(
                st, events, finished=False, tool_id=tool_id, tools=opts.tools, suppress=_suppress(opts)
            )
        return engine.strip_trailing_reasoning(st, delta)

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        engine = self.engine()
        events = engine.finish(st)
        if self.calls_whole and not _suppress(opts):
            return engine.to_delta_whole(
                st, events, finished=True, tool_id=tool_id, tools=opts.tools, forced=opts.forces_tool_calls
            )
        if events or st.deferred_content:
            return engine.to_delta(
                st, events, finished=True, tool_id=tool_id, tools=opts.tools, suppress=_suppress(opts)
            )
        return None

    def remaining_args(self, st: Any) -> str:
        return ""  # the engine adapter never fills vLLM's prev_tool_call_arr

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return self.extract_for_request(model_output, RequestOptions(tool_choice="auto"))

    def extract_for_request(
        self, model_output: str, opts: RequestOptions
    ) -> tuple[bool, list[FunctionCall], str | None]:
        """`extract_tool_calls_from_content`: one pass from CONTENT over reasoning-free text."""
        engine = self.engine()
        st: Any = engine.new_state(self.state_type, CONTENT)  # type: ignore[arg-type]
        suppress = _suppress(opts)
        events = engine.feed(st, model_output, ())
        events.extend(engine.finish(st))
        done: list[Slot] = []
        delta = engine.to_delta(
            st, events, finished=True, tool_id=_batch_ids, tools=opts.tools, suppress=suppress, done=done
        )
        slots = [*done, st.slot] if st.slot is not None else done
        called, calls = engine.build_result(slots, opts.tools, _batch_ids)
        content = delta.content if delta else None
        if content:
            content = engine.strip_content(content, called, keep_leading=self.calls_whole)
        return called, calls, content


def _batch_ids(index: int) -> str:
    return ""


def _suppress(opts: RequestOptions) -> bool:
    """`_check_skip_tool_parsing`: tool_choice none with tools drops the calls' markup."""
    return opts.tool_choice == "none" and bool(opts.tools)
