"""vLLM 0.33's declarative parser engine (`vllm/parser/engine/*`), streaming over new text only.

Many 0.33 families (`kimi_k2`, `gemma4`, `deepseek_v32`, `glm45`, `minimax_m2`, ...) are a
`ParserEngineConfig` (terminals, token-id terminals, a transition table, content events) run by
one engine and exposed as a reasoning adapter (`skip_tool_parsing`) and a tool adapter (started in
CONTENT). This module ports that engine: `TokenIDScanner` (special-token ids split the delta, with
the hold-back recovery, anchor rebuild and deferral when a terminal's text has not arrived),
`IncrementalLexer` (a suffix that may start a terminal literal is held back), the state machine
(`_on_terminal`, the skip modes, the JSON-argument brace hold-back) and `ParserEngine`'s event ->
delta step (`_events_to_delta` with tool slots, whitespace-only content deferral, trailing
reasoning whitespace deferral).

The whole per-stream data is an `EngineState` struct: the machine state, the lexer look-behind
(shorter than the longest literal), the scanner's deferred terminals (only while a terminal's text
is late), held-back argument braces, deferred whitespace, and one small slot per tool call (its
header/name and id; its argument text only while its name is unknown).

A family subclasses `EngineParser` (its config and hooks, as vLLM's `ParserEngine` subclasses
do) and registers `reasoning_adapter(...)` / `tool_adapter(...)` classes built from it.

Not ported (no family here uses them yet): `arg_converter` / `arg_value_extender` /
`arg_structural_chars` (non-JSON argument formats), `tool_call_body_array`, MESSAGE_HEADER,
`validate_tool_names`, schema type coercion of arguments, `skip_in_token_id_mode` transitions,
reasoning-token counting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, ToolCallDelta, ToolIdFn
from render_service.parsers.protocols import ParserState, ReasoningParser, RequestAdjustment, ToolParser

# -- config --------------------------------------------------------------------------------------------

# ParserState
CONTENT, REASONING, TOOL_PREAMBLE, TOOL_NAME, TOOL_ARGS, TOOL_BETWEEN = range(6)
TOOL_STATES = frozenset((TOOL_PREAMBLE, TOOL_NAME, TOOL_ARGS, TOOL_BETWEEN))
PLAIN_STATES = frozenset((CONTENT, REASONING))
# EventType
TEXT, REASONING_START, REASONING_CHUNK, REASONING_END, TOOL_START, TOOL_NAME_EV, ARG, TOOL_END = range(8)
REASONING_EVENTS = frozenset((REASONING_START, REASONING_END))
DROP = "__DROP__"
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]*)"')

Event = tuple[int, str, int]  # (type, value, tool_index)


@dataclass(frozen=True)
class EngineConfig:
    """`ParserEngineConfig`, the fields the ported engine reads."""

    name: str
    terminals: Mapping[str, str]
    token_id_terminals: Mapping[str, str]
    transitions: Mapping[tuple[int, str], tuple[int, tuple[int, ...]]]
    content_events: Mapping[int, int] = field(
        default_factory=lambda: {CONTENT: TEXT, REASONING: REASONING_CHUNK, TOOL_NAME: TOOL_NAME_EV, TOOL_ARGS: ARG}
    )
    initial_state: int = CONTENT
    wait_for_reasoning: bool | None = None
    tool_args_json: bool = True
    preserve_tokens: frozenset[str] = frozenset()
    turn_boundary_tokens: frozenset[str] = frozenset()
    strip_trailing_reasoning_whitespace: bool = True
    drop_whitespace_only_content_before_tools: bool = True
    strip_content_whitespace_with_tools: bool = True


class Tables:
    """Everything the engine derives from (config, tokenizer): immutable, shared by every stream."""

    def __init__(self, config: EngineConfig, info: TokenizerInfo) -> None:
        self.config = config
        self.info = info
        resolved: dict[int, str] = {}
        for name, text in config.token_id_terminals.items():
            tid = info.token_to_id(text)
            if tid is not None:
                resolved[tid] = name
        configured = set(config.token_id_terminals.values()) | set(config.terminals.values()) | config.preserve_tokens
        drop_texts = set()
        for text, tid in zip(info.special_tokens, info.special_ids, strict=False):
            if text not in configured:
                resolved[tid] = DROP
                drop_texts.add(text)
        self.has_drops = bool(drop_texts)
        self.resolved = resolved
        self.strict_names = frozenset(resolved.values())
        literals = [(lit, name) for name, lit in config.terminals.items()] + [(t, DROP) for t in sorted(drop_texts)]
        self.literals = literals
        self.first_chars = frozenset(lit[0] for lit, _ in literals if lit)
        self.prefix_set = frozenset(lit[:i] for lit, _ in literals for i in range(1, len(lit)))
        by_first: dict[str, list[tuple[str, str]]] = {}
        for lit, name in literals:
            if lit:
                by_first.setdefault(lit[0], []).append((lit, name))
        self.by_first = by_first
        transitions = config.transitions
        self.tool_terminals = frozenset(
            t for (s, t), (nxt, _) in transitions.items() if nxt in TOOL_STATES or s in TOOL_STATES
        )
        self.tool_exit_terminals = frozenset(
            t for (s, t), (nxt, _) in transitions.items() if s in TOOL_STATES and nxt not in TOOL_STATES
        )
        self.reasoning_markup_terminals = self._reasoning_markup()
        self.start_id = (
            info.token_to_id(config.token_id_terminals["THINK_START"])
            if "THINK_START" in config.token_id_terminals
            else None
        )
        self.end_id = (
            info.token_to_id(config.token_id_terminals["THINK_END"])
            if "THINK_END" in config.token_id_terminals
            else None
        )
        self.boundary_ids = frozenset(
            tid for tid in (info.token_to_id(t) for t in config.turn_boundary_tokens) if tid is not None
        )
        self.end_ids = self._reasoning_end_ids()
        self.has_reasoning = (
            "THINK_END" in config.token_id_terminals
            or "THINK_START" in config.terminals
            or "THINK_END" in config.terminals
            or config.initial_state == REASONING
        )

    def _reasoning_markup(self) -> frozenset[str]:
        transitions = self.config.transitions
        markers = frozenset(
            t for (s, t), (nxt, _) in transitions.items() if REASONING in (s, nxt) and nxt not in TOOL_STATES
        )
        for (s, t), (nxt, events) in transitions.items():
            if t in markers and (
                s not in PLAIN_STATES or nxt not in PLAIN_STATES or not REASONING_EVENTS.issuperset(events)
            ):
                return frozenset()
        return markers

    def _reasoning_end_ids(self) -> frozenset[int]:
        ends: dict[str, int] = {}
        for (s, t), (nxt, events) in self.config.transitions.items():
            if s != REASONING:
                continue
            if REASONING_END in events:
                ends.setdefault(t, nxt)
            elif nxt != REASONING:
                return frozenset()
        ids: set[int] = set()
        for terminal, nxt in ends.items():
            text = self.config.token_id_terminals.get(terminal)
            tid = self.info.token_to_id(text) if text is not None else None
            if tid is not None:
                ids.add(tid)
            elif nxt == CONTENT:
                return frozenset()
        return frozenset(ids)


# -- state ---------------------------------------------------------------------------------------------


class Slot(msgspec.Struct, array_like=True):
    """`ToolCallSlot`: `args` is kept only while the name is unknown (vLLM then searches it)."""

    id: str = ""
    name: str = ""
    name_sent: bool = False
    args: str = ""
    has_args: bool = False  # any argument text at all (vLLM's `slot.args` truthiness)


class EngineState(ParserState, tag="engine/1"):
    """One engine instance's stream data (vLLM keeps two instances: reasoning and tool adapters)."""

    initialized: bool = False
    state: int = CONTENT
    tool_index: int = -1
    ever_ids: bool = False
    buf: str = ""  # lexer look-behind
    dterms: list[tuple[str, int, str]] = msgspec.field(default_factory=list)  # scanner: deferred terminals
    dpost: str = ""  # scanner: text waiting for a deferred terminal's text
    skipped_span: bool = False
    args_buf: str = ""
    args_depth: int = 0
    args_in_string: bool = False
    args_escape: bool = False
    # ParserEngine
    reasoning_ended: bool = False
    deferred_content: str = ""
    deferred_reasoning: str = ""
    content_nonws: bool = False
    suppress: bool = False
    keep_args: bool = False  # batch: every slot keeps its whole argument text
    slots: list[Slot] = msgspec.field(default_factory=list)


Item = tuple[str, str] | tuple[str, str, int, str]  # ("text", text) | ("term", terminal, id, text)


# -- the engine ----------------------------------------------------------------------------------------


class EngineParser:
    """`ParserEngine` + `StreamingParserEngine` for one config; families subclass it for their hooks
    (as vLLM's `KimiK2Parser`, `Gemma4Parser`... subclass `ParserEngine`)."""

    def __init__(self, info: TokenizerInfo, config: EngineConfig) -> None:
        self.info = info
        self.config = config
        self.t = Tables(config, info)

    # -- lifecycle ---------------------------------------------------------------------------------

    def new_state(self, initial_state: int | None = None) -> EngineState:
        """`_reset(initial_state)`: a fresh engine (the prompt-closes-reasoning case is not used by
        configs without turn boundaries)."""
        return EngineState(
            initialized=True,
            state=self.config.initial_state if initial_state is None else initial_state,
            reasoning_ended=not self.t.has_reasoning,
        )

    def initial_state_object(self) -> EngineState:
        """The engine as constructed, before `initialize_streaming` (what a never-fed adapter flushes)."""
        return EngineState(state=self.config.initial_state, reasoning_ended=not self.t.has_reasoning)

    # -- prompt ------------------------------------------------------------------------------------

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        config = self.config
        wait = config.wait_for_reasoning
        if wait is None:
            wait = config.initial_state == REASONING
        start_tr = config.transitions.get((config.initial_state, "THINK_START"))
        start_opens = start_tr is not None and start_tr[0] == REASONING
        for tid in reversed(input_ids):
            if tid in self.t.end_ids:
                return True
            if tid == self.t.start_id:
                if start_opens:
                    return False
                break
            if tid in self.t.boundary_ids:
                break
        return not wait

    def extract_content_ids(self, input_ids: Sequence[int]) -> Sequence[int]:
        config = self.config
        wait = config.wait_for_reasoning
        if wait is None:
            wait = config.initial_state == REASONING
        if not wait:
            return input_ids
        end_id = self.t.end_id
        if end_id is not None:
            for i in range(len(input_ids) - 1, -1, -1):
                if input_ids[i] == end_id:
                    return input_ids[i + 1 :]
        if self.t.end_ids:
            turn_start = 0
            for i in range(len(input_ids) - 1, -1, -1):
                if input_ids[i] in self.t.boundary_ids:
                    turn_start = i + 1
                    break
            for i in range(turn_start, len(input_ids)):
                if input_ids[i] in self.t.end_ids:
                    return input_ids[i:]
        return input_ids

    # -- feeding -----------------------------------------------------------------------------------

    def feed(
        self, st: EngineState, text: str, ids: Sequence[int], *, skip_tool: bool = False, skip_reasoning: bool = False
    ) -> list[Event]:
        """`StreamingParserEngine.feed`."""
        if ids:
            st.ever_ids = True
        t = self.t
        if text and not st.buf and not st.dterms and t.first_chars.isdisjoint(text):
            if not any(tid in t.resolved for tid in ids):
                return self._emit_for_state(st, text)
        return self._process_items(st, self._scan(st, text, ids), skip_tool, skip_reasoning)

    def finish(self, st: EngineState, *, skip_tool: bool = False, skip_reasoning: bool = False) -> list[Event]:
        """`StreamingParserEngine.finish`."""
        events = self._process_items(st, self._flush_pending(st), skip_tool, skip_reasoning)
        events.extend(self._lex_tokens(st, self._lex_flush(st), skip_tool, skip_reasoning))
        if st.args_buf:
            events.append((ARG, st.args_buf, st.tool_index))
            st.args_buf = ""
        if st.state in TOOL_STATES:
            if st.tool_index >= 0:
                events.append((TOOL_END, "", st.tool_index))
            st.state = CONTENT
        elif st.state == REASONING:
            events.append((REASONING_END, "", st.tool_index))
            st.state = CONTENT
        return events

    def _process_items(self, st: EngineState, items: list[Item], skip_tool: bool, skip_reasoning: bool) -> list[Event]:
        events: list[Event] = []
        for item in items:
            if item[0] == "term":
                events.extend(self._lex_tokens(st, self._lex_flush(st), skip_tool, skip_reasoning))
                events.extend(self._on_terminal(st, item[1], item[3], skip_tool, skip_reasoning))  # type: ignore[misc]
            elif item[1]:
                events.extend(self._lex_tokens(st, self._lex_feed(st, item[1]), skip_tool, skip_reasoning))
        return events

    def _lex_tokens(
        self, st: EngineState, tokens: list[tuple[str | None, str]], skip_tool: bool, skip_reasoning: bool
    ) -> list[Event]:
        events: list[Event] = []
        strict = self.t.strict_names if st.ever_ids else None
        for terminal, value in tokens:
            if terminal is None or (strict and terminal in strict):
                if value:
                    events.extend(self._emit_for_state(st, value))
            else:
                events.extend(self._on_terminal(st, terminal, value, skip_tool, skip_reasoning))
        return events

    # -- state machine ---------------------------------------------------------------------------------

    def _on_terminal(
        self, st: EngineState, terminal: str, value: str, skip_tool: bool, skip_reasoning: bool
    ) -> list[Event]:
        t = self.t
        transition = self.config.transitions.get((st.state, terminal))
        if transition is None:
            if t.has_drops and terminal == DROP:
                return []
            if skip_tool and terminal in t.tool_exit_terminals:
                st.skipped_span = False
            return self._emit_for_state(st, value)
        next_state, events = transition
        if skip_reasoning and terminal in t.reasoning_markup_terminals:
            return self._emit_for_state(st, value)
        if skip_tool and terminal in t.tool_terminals:
            is_opener = next_state in TOOL_STATES
            is_exit = terminal in t.tool_exit_terminals
            if not (is_exit and not is_opener and not st.skipped_span):
                if is_opener:
                    st.skipped_span = True
                elif is_exit:
                    st.skipped_span = False
                if REASONING_END in events:
                    st.state = CONTENT
                    return [(REASONING_END, value, st.tool_index), (TEXT, value, st.tool_index)]
                content_type = self.config.content_events.get(st.state)
                return [(content_type, value, st.tool_index)] if content_type is not None else []
        return self._apply_transition(st, next_state, events, value)

    def _emit_for_state(self, st: EngineState, text: str) -> list[Event]:
        if st.state == TOOL_ARGS and self.config.tool_args_json:
            return self._feed_args(st, text)
        content_type = self.config.content_events.get(st.state)
        if content_type is not None:
            return [(content_type, text, st.tool_index)]
        return []

    def _apply_transition(self, st: EngineState, next_state: int, kinds: tuple[int, ...], value: str) -> list[Event]:
        events: list[Event] = []
        if st.state == TOOL_ARGS and next_state != TOOL_ARGS and st.args_buf:
            events.append((ARG, st.args_buf, st.tool_index))
            st.args_buf = ""
        st.state = next_state
        for kind in kinds:
            if kind == TOOL_START:
                st.tool_index += 1
            if kind == TEXT and not value:
                continue
            events.append((kind, value, st.tool_index))
        if st.state == TOOL_ARGS:
            st.args_depth = 0
            st.args_in_string = False
            st.args_escape = False
        return events

    def _feed_args(self, st: EngineState, text: str) -> list[Event]:
        """`_feed_args_char` per char: everything streams except a top-level closing brace, held
        until another char (or the end) confirms it."""
        out: list[str] = []
        buf = st.args_buf
        depth, in_string, escape = st.args_depth, st.args_in_string, st.args_escape
        for ch in text:
            buf += ch
            if escape:
                escape = False
            elif in_string:
                if ch == "\\":
                    escape = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                if depth > 0:
                    depth -= 1
                if depth == 0:
                    continue  # held back
            out.append(buf)
            buf = ""
        st.args_buf, st.args_depth, st.args_in_string, st.args_escape = buf, depth, in_string, escape
        return [(ARG, v, st.tool_index) for v in out]

    # -- IncrementalLexer ----------------------------------------------------------------------------

    def _lex_feed(self, st: EngineState, text: str) -> list[tuple[str | None, str]]:
        if not st.buf and self.t.first_chars.isdisjoint(text):
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
        t = self.t
        tokens: list[tuple[str | None, str]] = []
        buf = st.buf
        while buf:
            if t.first_chars.isdisjoint(buf):
                tokens.append((None, buf))
                buf = ""
                break
            best: tuple[str, str] | None = None
            candidates = t.by_first.get(buf[0], ())
            for lit, name in candidates:
                if buf.startswith(lit) and (best is None or len(lit) > len(best[1])):
                    best = (name, lit)
            if buf in t.prefix_set and not final:
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
        first_chars = self.t.first_chars
        for i in range(1, n):
            if buf[i] not in first_chars:
                continue
            remaining = n - i
            for lit, _ in self.t.literals:
                check = min(remaining, len(lit))
                if buf[i : i + check] == lit[:check]:
                    return i
        return n

    # -- TokenIDScanner ----------------------------------------------------------------------------------

    def _scan(self, st: EngineState, text: str, ids: Sequence[int]) -> list[Item]:
        prefix: list[Item] = []
        effective = text
        if st.dterms:
            prefix, effective = self._resolve_deferred(st, text)
        resolved = self.t.resolved
        if not resolved or not any(tid in resolved for tid in ids):
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
        items.extend(("term", a, b, c) for a, b, c in st.dterms)
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

    # -- ParserEngine: events -> delta -------------------------------------------------------------------

    def events_to_delta(
        self, st: EngineState, events: list[Event], tool_id: ToolIdFn, finished: bool = False
    ) -> Delta | None:
        """`_events_to_delta`."""
        if not events and not st.deferred_content:
            return None
        calls: list[ToolCallDelta] = []
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        carried = st.deferred_content
        seen_tool = False
        suppress = st.suppress
        for kind, value, index in events:
            if kind == TEXT:
                if seen_tool:
                    st.deferred_content += value
                else:
                    content_parts.append(value)
            elif kind == REASONING_CHUNK:
                reasoning_parts.append(value)
            elif kind == REASONING_END:
                st.reasoning_ended = True
            elif kind in (TOOL_START, TOOL_NAME_EV, ARG, TOOL_END) and not suppress:
                seen_tool = True
                if kind == TOOL_START:
                    self._ensure_slot(st, index)
                elif kind == TOOL_NAME_EV:
                    st.slots[index].name += value
                elif kind == ARG:
                    self._handle_arg_chunk(st, index, value, calls, tool_id)
                else:
                    self._handle_tool_end(st, index, calls, tool_id)
        if len(calls) > 1:
            calls = _coalesce(calls)
        if st.deferred_content and (not seen_tool or not calls):
            now = st.deferred_content[len(carried) :]
            if carried:
                content_parts.insert(0, carried)
            if now:
                content_parts.append(now)
            st.deferred_content = ""
        content = "".join(content_parts)
        if not st.content_nonws and content:
            if content.strip():
                st.content_nonws = True
            elif st.slots:
                if self.config.drop_whitespace_only_content_before_tools:
                    content = ""
            elif not finished:
                st.deferred_content = content
                content = ""
        reasoning = "".join(reasoning_parts)
        if content or calls or reasoning:
            return Delta(content=content or None, reasoning=reasoning or None, tool_calls=calls)
        return None

    def strip_trailing_reasoning(self, st: EngineState, delta: Delta | None) -> Delta | None:
        """`_strip_trailing_reasoning`."""
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

    # tool slots (families override these hooks)

    def _ensure_slot(self, st: EngineState, index: int) -> None:
        while len(st.slots) <= index:
            st.slots.append(Slot())

    def _ensure_tool_id(self, st: EngineState, slot: Slot, index: int, tool_id: ToolIdFn) -> None:
        if not slot.id:
            slot.id = tool_id(index)

    def _emit_name_delta(
        self, st: EngineState, index: int, calls: list[ToolCallDelta], name: str | None, tool_id: ToolIdFn
    ) -> None:
        if not name:
            return
        slot = st.slots[index]
        slot.name = name
        slot.name_sent = True
        if not st.keep_args:
            slot.args = ""
        self._ensure_tool_id(st, slot, index, tool_id)
        calls.append(ToolCallDelta(index=index, id=slot.id, type="function", name=name))

    def _handle_arg_chunk(
        self, st: EngineState, index: int, value: str, calls: list[ToolCallDelta], tool_id: ToolIdFn
    ) -> None:
        slot = st.slots[index]
        if value:
            slot.has_args = True
            if st.keep_args or not slot.name_sent:
                slot.args += value
        if not slot.name_sent:
            if slot.name:
                self._emit_name_delta(st, index, calls, slot.name, tool_id)
            elif value:
                self._emit_name_delta(st, index, calls, _search_name(slot.args), tool_id)
        elif value:
            calls.append(ToolCallDelta(index=index, arguments=value))

    def _handle_tool_end(self, st: EngineState, index: int, calls: list[ToolCallDelta], tool_id: ToolIdFn) -> None:
        if index >= len(st.slots):
            return
        slot = st.slots[index]
        if not slot.name_sent:
            name = slot.name or _search_name(slot.args) or ""
            if name:
                slot.name = name
                slot.name_sent = True
                if not st.keep_args:
                    slot.args = ""
                self._ensure_tool_id(st, slot, index, tool_id)
                calls.append(ToolCallDelta(index=index, id=slot.id, type="function", name=name, arguments=""))

    # -- batch ---------------------------------------------------------------------------------------------

    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        """`ParserEngine.extract_reasoning` (the reasoning adapter skips tool parsing)."""
        st = self.new_state()
        events = self.feed(st, model_output, (), skip_tool=True)
        events.extend(self.finish(st, skip_tool=True))
        reasoning = "".join(v for k, v, _ in events if k == REASONING_CHUNK)
        content = "".join(v for k, v, _ in events if k == TEXT)
        if self.config.strip_trailing_reasoning_whitespace:
            reasoning = reasoning.rstrip()
        return reasoning or None, content or None

    def extract_tool_calls_from_content(
        self, content: str, *, suppress: bool, skip_reasoning: bool, tool_id: ToolIdFn
    ) -> tuple[bool, list[FunctionCall], str | None]:
        """`extract_tool_calls_from_content`: one pass started in CONTENT, then the slots."""
        st = self.new_state(CONTENT)
        st.suppress = suppress
        st.keep_args = True
        events = self.feed(st, content, (), skip_reasoning=skip_reasoning)
        events.extend(self.finish(st, skip_reasoning=skip_reasoning))
        delta = self.events_to_delta(st, events, tool_id, finished=True)
        calls: list[FunctionCall] = []
        for index, slot in enumerate(st.slots):
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            raw = slot.args
            if not name and raw.strip():
                name, args_json = self._name_and_args(raw)
            elif raw.strip():
                args_json = self._extract_args_json(raw, name)
            else:
                args_json = "{}"
            if name:
                self._ensure_tool_id(st, slot, index, tool_id)
                calls.append(FunctionCall(name=name, arguments=args_json, id=slot.id or None))
        parsed = delta.content if delta is not None else None
        if parsed:
            parsed = self._strip_content_whitespace(parsed, bool(calls))
        return bool(calls), calls, parsed

    def _strip_content_whitespace(self, content: str, tools_called: bool) -> str | None:
        if tools_called:
            if self.config.strip_content_whitespace_with_tools:
                content = content.strip()
            elif self.config.drop_whitespace_only_content_before_tools and not content.strip():
                content = ""
        return content or None

    def _name_and_args(self, raw: str) -> tuple[str, str]:
        raw = raw.strip()
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return "", raw
        if not isinstance(parsed, dict):
            return "", raw
        name = parsed.get("name", "")
        for key in ("arguments", "parameters"):
            if key in parsed:
                val = parsed[key]
                return name, val if isinstance(val, str) else json.dumps(val, ensure_ascii=False)
        return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)

    def _extract_args_json(self, raw: str, name: str) -> str:
        if not raw.strip():
            return "{}"
        return self._name_and_args(raw)[1]


# -- the adapters (vLLM's ParserEngineReasoningAdapter / ParserEngineToolAdapter) ----------------------


def _no_ids(index: int) -> str:
    return ""


class EngineReasoningAdapter(ReasoningParser):
    """An engine as a reasoning parser: its own engine instance, tool parsing skipped."""

    engine_based_streaming = True
    state_type = EngineState

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        self.engine = self.make_engine(tokenizer, thinking_enabled)

    @classmethod
    def make_engine(cls, info: TokenizerInfo, thinking: bool) -> EngineParser:
        raise NotImplementedError

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        request.skip_special_tokens = False  # ParserEngine.adjust_request

    def new_state(self) -> EngineState:
        return self.engine.new_state()

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        return self.engine.is_reasoning_end(prompt_token_ids)

    def content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        return self.engine.extract_content_ids(delta_ids)

    def stream(self, st: EngineState, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        engine = self.engine
        events = engine.feed(st, delta_text, delta_ids, skip_tool=True)
        delta = engine.strip_trailing_reasoning(st, engine.events_to_delta(st, events, _no_ids))
        return delta, st.reasoning_ended

    def flush_on_transition(self, st: EngineState) -> Delta | None:
        events = self.engine.finish(st, skip_tool=True)
        if events or st.deferred_content:
            return self.engine.events_to_delta(st, events, _no_ids, finished=True)
        return None

    finish = flush_on_transition

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        return self.engine.extract_reasoning(model_output)


class EngineToolAdapter(ToolParser):
    """An engine as a tool parser: started in CONTENT; with no reasoning parser configured the
    reasoning markup passes through (`skip_reasoning_parsing`)."""

    engine_based_streaming = True
    reads_thinking = True
    state_type = EngineState

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer)
        self.engine = self.make_engine(tokenizer, thinking_enabled)
        self.skip_reasoning_parsing = False

    @classmethod
    def make_engine(cls, info: TokenizerInfo, thinking: bool) -> EngineParser:
        raise NotImplementedError

    def new_state(self) -> EngineState:
        # the engine as constructed; `initialize_streaming(CONTENT)` runs on the first feed
        return self.engine.initial_state_object()

    def _start(self, st: EngineState, suppress: bool) -> None:
        if not st.initialized:
            fresh = self.engine.new_state(CONTENT)
            for name in EngineState.__struct_fields__:
                setattr(st, name, getattr(fresh, name))
        if suppress:
            st.suppress = True

    def feed(self, st: EngineState, text: str, tool_id: ToolIdFn) -> Delta | None:
        return self.feed_tokens(st, text, (), tool_id)

    def feed_tokens(self, st: EngineState, text: str, token_ids: Sequence[int], tool_id: ToolIdFn) -> Delta | None:
        return self._feed(st, text, token_ids, tool_id, suppress=False)

    def feed_without_tools(
        self, st: EngineState, text: str, token_ids: Sequence[int] = (), *, has_tools: bool = True
    ) -> Delta | None:
        # `_check_skip_tool_parsing`: tool_choice none with tools suppresses every tool event
        delta = self._feed(st, text, token_ids, _no_ids, suppress=has_tools)
        if delta is not None:
            delta.tool_calls = []
        return delta

    def _feed(
        self, st: EngineState, text: str, ids: Sequence[int], tool_id: ToolIdFn, *, suppress: bool
    ) -> Delta | None:
        self._start(st, suppress)
        engine = self.engine
        events = engine.feed(st, text, ids, skip_reasoning=self.skip_reasoning_parsing)
        return engine.strip_trailing_reasoning(st, engine.events_to_delta(st, events, tool_id))

    def finish(self, st: EngineState, tool_id: ToolIdFn) -> Delta | None:
        events = self.engine.finish(st, skip_reasoning=self.skip_reasoning_parsing)
        if events or st.deferred_content:
            return self.engine.events_to_delta(st, events, tool_id, finished=True)
        return None

    def remaining_args(self, st: EngineState) -> str:
        return ""  # the adapter's own prev_tool_call_arr is never filled

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return self.engine.extract_tool_calls_from_content(
            model_output, suppress=False, skip_reasoning=self.skip_reasoning_parsing, tool_id=_no_ids
        )

    def content_without_tools(self, content: str | None, *, has_tools: bool = True) -> str | None:
        _, _, parsed = self.engine.extract_tool_calls_from_content(
            content or "", suppress=has_tools, skip_reasoning=self.skip_reasoning_parsing, tool_id=_no_ids
        )
        return parsed


def _search_name(args: str) -> str | None:
    """`_try_extract_name`: `"name"\\s*:\\s*"([^"]*)"` anywhere in the arguments."""
    m = _NAME_RE.search(args)
    return m.group(1) or None if m else None


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
