"""Gemma 4 (`gemma4` tools and reasoning): vLLM 0.33's `Gemma4Parser` (`parser/gemma4.py`).

    <|channel>thought
    ...reasoning...<channel|>
    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

One engine config for both adapters: `<|channel>`/`<channel|>` and `<|tool_call>`/`<tool_call|>`,
`call:` (or a bare `:`) then the name up to `{` or `(`, arguments in Gemma's own `key:value`
syntax (strings between `<|"|>` delimiters, bare numbers/booleans, nested `{}` and `[]`) converted
to a JSON object of strings and coerced to the tool schema. On top of the engine, as vLLM's
subclass does: `<|channel>` is put in front of the text when it opens the thought channel
(`_preprocess_feed`), `thought\\n` at the head of the reasoning is dropped, a prompt ending inside
an open `<|channel>` block starts in reasoning, `enable_thinking` (default off) only decides
whether a silent tail waits for reasoning; no structural tag: `tool_choice` required/named are
parsed like auto, and every request gets `skip_special_tokens=False`.

The streams accumulate to the batch answer (docs/parsers.md):

- the reasoning parser streams batch's engine pass over the whole output, markers matched by text
  (`streams_whole_output`); the output's start is held while it may still become `thought\\n` (at
  most 7 characters, `take_lead`), as is the reasoning's head (`thought\\n` is dropped from it, a
  lone `thought` at the end too) and its trailing whitespace;
- the tool parser sends each call whole once decided (`calls_whole`: the call's text is held in a
  `HeldText` beside the snapshot), matches the markers by text, and holds the start of its text
  as the reasoning parser does (a content that opens the channel is reasoning to it, dropped);
- where vLLM's batch opens the channel on a `<channel|>` anywhere in the output (unless there is a
  `<|channel>`) and ignores the prompt, our batch follows the stream's rule (with the prompt for
  the reasoning parser; always for the tool parser, the only one whose text may hold the marker):
  a deliberate difference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn, json_string_body
from render_service.parsers.engine import (
    CONTENT,
    EV_REASONING,
    EV_REASONING_END,
    EV_REASONING_START,
    EV_TEXT,
    EV_TOOL_END,
    EV_TOOL_START,
    REASONING,
    TOOL_ARGS,
    TOOL_NAME,
    TOOL_PREAMBLE,
    Engine,
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    Transition,
    ValueExt,
    WholeCallsState,
)
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

CHANNEL_START, CHANNEL_END = "<|channel>", "<channel|>"
TOOL_CALL_START, TOOL_CALL_END = "<|tool_call>", "<tool_call|>"
STRING_DELIM = '<|"|>'
THOUGHT_PREFIX = "thought\n"
TURN_BOUNDARIES = frozenset(("<|turn>", "<|tool_response>"))

_DELIM_PREFIXES = tuple(STRING_DELIM[:k] for k in range(len(STRING_DELIM), 0, -1))
_KEY_GAP = " ,\n\t"  # skipped before a key (and between array items)
_VALUE_GAP = " \n\t"  # skipped between ":" and a value


# -- Gemma's key:value argument syntax -----------------------------------------------------------------


def strip_partial_delim(value: str) -> str:
    """`value` without a trailing piece of `<|"|>` that may still be completed."""
    for piece in _DELIM_PREFIXES:
        if value.endswith(piece):
            return value[: -len(piece)]
    return value


def _group_end(text: str, start: int, opener: str, closer: str) -> tuple[int, bool]:
    """From just after `opener` at `start`, the index after the matching `closer` (or the end)
    and whether it was found; delimited strings are skipped whole."""
    depth, i, n = 1, start, len(text)
    while i < n and depth:
        if text.startswith(STRING_DELIM, i):
            close = text.find(STRING_DELIM, i + len(STRING_DELIM))
            i = n if close < 0 else close + len(STRING_DELIM)
            continue
        ch = text[i]
        if ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
        i += 1
    return i, depth == 0


def _nested(text: str, i: int) -> tuple[Any, int]:
    """The `{...}` or `[...]` value at `i` (an unclosed one is read as partial)."""
    opener = text[i]
    closer = "}" if opener == "{" else "]"
    end, closed = _group_end(text, i + 1, opener, closer)
    inner = text[i + 1 : end - 1] if closed else text[i + 1 : end]
    value = parse_fields(inner, partial=not closed)[0] if opener == "{" else parse_items(inner, partial=not closed)
    return value, end


def _bare(text: str, i: int, stops: str, partial: bool) -> tuple[str | None, int]:
    """A bare value from `i` up to one of `stops`; None when it may be incomplete (streaming)
    or is empty (malformed input ends the parse)."""
    n, start = len(text), i
    while i < n and text[i] not in stops:
        i += 1
    if (partial and i >= n) or i == start:
        return None, i
    raw = text[start:i].strip()
    if partial and raw.endswith("."):  # more digits may follow
        return None, i
    return raw, i


def parse_fields(text: str, *, partial: bool = False) -> tuple[dict[str, Any], str | None]:
    """`key:value,...` -> a dict of strings / dicts / lists, and the key whose top-level
    delimited string is still open at the end (if any). `partial` withholds a trailing bare
    value and a trailing piece of the delimiter."""
    out: dict[str, Any] = {}
    if not text.strip():
        return out, None
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _KEY_GAP:
            i += 1
        colon = text.find(":", i)
        if i >= n or colon < 0:
            break
        key = text[i:colon].strip()
        if key.startswith(STRING_DELIM) and key.endswith(STRING_DELIM):
            key = key[len(STRING_DELIM) : -len(STRING_DELIM)]
        i = colon + 1
        while i < n and text[i] in _VALUE_GAP:
            i += 1
        if i >= n:
            if not partial:
                out[key] = ""
            break
        if text.startswith(STRING_DELIM, i):
            i += len(STRING_DELIM)
            close = text.find(STRING_DELIM, i)
            if close < 0:
                out[key] = strip_partial_delim(text[i:]) if partial else text[i:]
                return out, key
            out[key] = text[i:close]
            i = close + len(STRING_DELIM)
        elif text[i] in "{[":
            out[key], i = _nested(text, i)
        else:
            value, i = _bare(text, i, ",}]", partial)
            if value is None:
                break
            out[key] = value
    return out, None


def parse_items(text: str, *, partial: bool = False) -> list[Any]:
    """The items of a `[...]` body (an open delimited string runs to the end)."""
    items: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _KEY_GAP:
            i += 1
        if i >= n:
            break
        if text.startswith(STRING_DELIM, i):
            i += len(STRING_DELIM)
            close = text.find(STRING_DELIM, i)
            if close < 0:
                items.append(text[i:])
                break
            items.append(text[i:close])
            i = close + len(STRING_DELIM)
        elif text[i] in "{[":
            value, i = _nested(text, i)
            items.append(value)
        else:
            bare, i = _bare(text, i, ",]", partial)
            if bare is None:
                break
            items.append(bare)
    return items


def _without_closer(text: str, paren_excess: bool) -> str:
    """The call body's closer is not part of the arguments: a trailing `}`, or a trailing `)`
    when `)` outnumber `(`."""
    if text.endswith("}") or (paren_excess and text.endswith(")")):
        return text[:-1]
    return text


def gemma4_arg_converter(raw_args: str, partial: bool) -> str:
    text = raw_args.strip()
    body = _without_closer(text, text.count(")") > text.count("("))
    return json.dumps(parse_fields(body, partial=partial)[0], ensure_ascii=False)


def gemma4_extender_start(raw_args: str) -> ValueExt | None:
    """The open top-level string value, when it is the last argument: `held` is the raw tail
    the converter would not show yet (it doubles as the window that finds the closing
    delimiter), `count` the call's `)` minus `(`."""
    text = raw_args.strip()
    excess = text.count(")") - text.count("(")
    body = _without_closer(text, excess > 0)
    params, open_key = parse_fields(body, partial=True)
    if open_key is None or next(reversed(params)) != open_key:
        return None
    held_len = len(raw_args) - len(raw_args.rstrip()) + len(text) - len(strip_partial_delim(body))
    return ValueExt(
        held=raw_args[len(raw_args) - held_len :] if held_len else "",
        raw_len=len(raw_args) - raw_args.rfind(STRING_DELIM) - len(STRING_DELIM),
        count=excess,
    )


def gemma4_extender_step(ext: ValueExt, delta: str) -> str | None:
    text = ext.held + delta
    if STRING_DELIM in text:
        return None
    ext.count += delta.count(")") - delta.count("(")
    visible = strip_partial_delim(_without_closer(text.rstrip(), ext.count > 0))
    ext.held = text[len(visible) :]
    return json_string_body(visible)


@cache
def gemma4_config(thinking: bool = False) -> EngineConfig:
    """vLLM's `gemma4_config`."""
    tool_end = Transition(CONTENT, (EV_TOOL_END,))
    return EngineConfig(
        name="gemma4",
        initial_state=CONTENT,
        # With thinking off the templates write no marker: a silent tail is content.
        wait_for_reasoning=thinking,
        turn_boundary_tokens=TURN_BOUNDARIES,
        terminals={
            "THINK_START": CHANNEL_START,
            "THINK_END": CHANNEL_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
            "CALL_PREFIX": "call:",
            "COLON": ":",
            "OPEN_BRACE": "{",
            "OPEN_PAREN": "(",
        },
        token_id_terminals={
            "THINK_START": CHANNEL_START,
            "THINK_END": CHANNEL_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
        },
        transitions={
            (CONTENT, "THINK_START"): Transition(REASONING, (EV_REASONING_START,)),
            (REASONING, "THINK_START"): Transition(REASONING),  # the prompt opened it already
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (REASONING, "TOOL_START"): Transition(TOOL_PREAMBLE, (EV_REASONING_END, EV_TOOL_START)),
            (CONTENT, "TOOL_START"): Transition(TOOL_PREAMBLE, (EV_REASONING_END, EV_TOOL_START)),
            (TOOL_PREAMBLE, "TOOL_END"): tool_end,
            (TOOL_PREAMBLE, "CALL_PREFIX"): Transition(TOOL_NAME),
            (TOOL_PREAMBLE, "COLON"): Transition(TOOL_NAME),  # "<|tool_call>:name{...}"
            (TOOL_NAME, "OPEN_BRACE"): Transition(TOOL_ARGS),
            (TOOL_NAME, "OPEN_PAREN"): Transition(TOOL_ARGS),
            (TOOL_NAME, "TOOL_END"): tool_end,
            (TOOL_ARGS, "TOOL_END"): tool_end,
            (CONTENT, "TOOL_END"): Transition(CONTENT),
            (CONTENT, "THINK_END"): Transition(CONTENT),
        },
        arg_converter=gemma4_arg_converter,
        extender_start=gemma4_extender_start,
        extender_step=gemma4_extender_step,
        tool_args_json=False,
        arg_structural_chars=frozenset(",:{}[]<"),
        preserve_tokens=frozenset((STRING_DELIM,)),
    )


# -- the engine with Gemma4Parser's hooks --------------------------------------------------------------


class Gemma4Engine(Engine):
    def opens_channel(self, st: EngineState) -> bool:
        """Whether `_preprocess_feed` may put `<|channel>` in front of the first text."""
        return st.state == CONTENT and self.start_id is not None and self.end_id is not None


def vllm_first_feed(engine: Gemma4Engine, st: EngineState, text: str) -> str:
    """vLLM's `_preprocess_feed` on a batch pass's only feed (the whole text): `<|channel>` in
    front when there is none and the text holds `<channel|>` anywhere, or starts with
    `thought\\n`, or is `thought`."""
    if (
        text
        and engine.opens_channel(st)
        and CHANNEL_START not in text
        and (CHANNEL_END in text or text.startswith(THOUGHT_PREFIX) or text == THOUGHT_PREFIX[:-1])
    ):
        return CHANNEL_START + text
    return text


def stream_first_feed(engine: Gemma4Engine, st: EngineState, text: str) -> str:
    """The stream's rule for the same (`take_lead`, on the whole text): only the start of the
    text decides, so a stream holds at most `thought` before it knows."""
    if engine.opens_channel(st) and (text.startswith(THOUGHT_PREFIX) or text == THOUGHT_PREFIX[:-1]):
        return CHANNEL_START + text
    return text


def take_lead(engine: Gemma4Engine, st: Any, text: str, *, finished: bool) -> str | None:
    """The stream's `_preprocess_feed` (`stream_first_feed`): the output's start is held while it
    may still become `thought\\n` (at most 7 characters, `st.lead`); then it goes on, with
    `<|channel>` in front when it opens the thought channel. None: nothing to feed yet."""
    if st.lead_done:
        return text
    lead = st.lead + text
    if (
        not finished
        and engine.opens_channel(st)
        and len(lead) < len(THOUGHT_PREFIX)
        and THOUGHT_PREFIX.startswith(lead)
    ):
        st.lead = lead
        return None
    st.lead, st.lead_done = "", True
    return stream_first_feed(engine, st, lead)


def strip_thought(reasoning: str | None) -> str | None:
    """`Gemma4Parser.extract_reasoning`: `thought\\n` off the head of the (stripped) reasoning,
    and a reasoning that is only `thought` is none."""
    if reasoning:
        if reasoning.startswith(THOUGHT_PREFIX):
            reasoning = reasoning[len(THOUGHT_PREFIX) :]
        elif reasoning == THOUGHT_PREFIX.rstrip():
            reasoning = None
    return reasoning or None


def _prompt_opens_channel(engine: Engine, prompt_token_ids: Sequence[int]) -> bool:
    """Does the prompt end inside an open `<|channel>` block?"""
    if engine.start_id is None:
        return False
    info = engine.info
    closers = {engine.end_id, *(info.token_to_id(t) for t in (TOOL_CALL_START, *TURN_BOUNDARIES))} - {None}
    for tid in reversed(prompt_token_ids):
        if tid == engine.start_id:
            return True
        if tid in closers:
            return False
    return False


def _enable_thinking(template_kwargs: Mapping[str, Any]) -> bool:
    return bool(template_kwargs.get("enable_thinking", False))


class Gemma4ReasoningState(EngineState, tag="gemma4.reasoning/3"):
    """`EngineState` plus the two holds of the stream's start, each at most `thought\\n` long."""

    lead: str = ""  # the output so far, while it may still become "thought\n" (`take_lead`)
    lead_done: bool = False
    thought_head: str = ""  # the reasoning so far, while it may still become "thought\n"
    thought_done: bool = False  # the head was stripped, or ruled out


@register_reasoning_parser("gemma4")
class Gemma4ReasoningParser(EngineReasoningParser):
    version = 3  # the stream is batch's engine pass over the whole output (accumulates to it)
    state_type = Gemma4ReasoningState
    engine_type = Gemma4Engine
    streams_whole_output = True
    batch_reads_stream_prompt = True  # the prompt the stream checks decides the channel (`extract`)
    engine: Gemma4Engine

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _enable_thinking(template_kwargs)

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return gemma4_config(thinking)

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        # `adjust_initial_state_from_prompt`: a prompt ending inside an open `<|channel>` starts
        # the pass in reasoning; the pass itself runs from the first chunk either way.
        if _prompt_opens_channel(self.engine, prompt_token_ids):
            st.state = REASONING
        return True

    def after_end(self, st: Any, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        fed = take_lead(self.engine, st, text, finished=finished)
        if fed is None:
            return None
        delta = super().after_end(st, fed, (), finished=finished)
        if st.thought_done or (not finished and (delta is None or delta.reasoning is None)):
            return delta
        reasoning = self._strip_thought_head(st, (delta.reasoning if delta else None) or "", finished=finished)
        if delta is None:
            return Delta(reasoning=reasoning) if reasoning else None
        delta.reasoning = reasoning or None
        return delta if delta.reasoning is not None or delta.content is not None else None

    @staticmethod
    def _strip_thought_head(st: Any, reasoning: str, *, finished: bool) -> str:
        """`strip_thought` as the reasoning streams (after its trailing whitespace was held): the
        head waits while it may still become `thought\\n`; at the end a lone `thought` is dropped."""
        head = st.thought_head + reasoning
        if not head.startswith(THOUGHT_PREFIX) and THOUGHT_PREFIX.startswith(head):
            if not finished:
                st.thought_head = head
                return ""
            st.thought_head, st.thought_done = "", True
            return "" if head == THOUGHT_PREFIX.rstrip() else head
        st.thought_head, st.thought_done = "", True
        return head[len(THOUGHT_PREFIX) :] if head.startswith(THOUGHT_PREFIX) else head

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """vLLM's batch pass. With the prompt, the thought channel opens as the stream opens it
        (the prompt, then the output's start); vLLM's batch ignores the prompt and opens it on a
        `<channel|>` anywhere in the output, which a stream could only match by holding it all
        (a deliberate difference, docs/parsers.md)."""
        engine = self.engine
        st = engine.new_state(self.state_type, CONTENT)
        if prompt_token_ids is None:
            text = vllm_first_feed(engine, st, model_output)
        else:
            if _prompt_opens_channel(engine, prompt_token_ids):
                st.state = REASONING
            text = stream_first_feed(engine, st, model_output)
        events = engine.feed(st, text, ())
        events.extend(engine.finish(st))
        reasoning = "".join(v for k, v, _ in events if k == EV_REASONING).rstrip()
        content = "".join(v for k, v, _ in events if k == EV_TEXT)
        return strip_thought(reasoning), content or None


class Gemma4ToolState(WholeCallsState, tag="gemma4.tool/2"):
    """`WholeCallsState` plus the hold of the text's start (`take_lead`, at most `thought`)."""

    lead: str = ""
    lead_done: bool = False


def _without_reasoning(delta: Delta | None) -> Delta | None:
    """Batch's tool pass keeps only content and calls: reasoning its engine finds (a content
    that starts with `thought\\n` opens the channel there too) is dropped."""
    if delta is None or delta.reasoning is None:
        return delta
    delta.reasoning = None
    return delta if delta.content is not None or delta.tool_calls else None


@register_tool_parser("gemma4")
class Gemma4ToolParser(EngineToolParser):
    version = 2  # each call sent whole, markers by text: the stream accumulates to the batch answer
    state_type = Gemma4ToolState
    engine_type = Gemma4Engine
    calls_whole = True
    matches_by_text = True
    # No structural tag model, yet vLLM's `Gemma4EngineToolParser` opts out of the JSON paths:
    # required/named are parsed like auto and leave the request unconstrained.
    supports_required_and_named = False
    config = gemma4_config(False)

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        return gemma4_config(thinking)

    @classmethod
    def tool_thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _enable_thinking(template_kwargs)

    def _engine(self) -> Gemma4Engine:
        engine = self.engine()
        assert isinstance(engine, Gemma4Engine)
        return engine

    def feed_for_request(
        self, st: Any, text: str, token_ids: Sequence[int], tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        fed = take_lead(self._engine(), st, text, finished=False)
        if fed is None:
            return None
        return _without_reasoning(super().feed_for_request(st, fed, (), tool_id, opts))

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        first = None
        if not st.lead_done:
            fed = take_lead(self._engine(), st, "", finished=True) or ""
            first = _without_reasoning(super().feed_for_request(st, fed, (), tool_id, opts))
        last = _without_reasoning(super().finish_for_request(st, tool_id, opts))
        if first is None or last is None:
            return first or last
        first.content = (first.content or "") + (last.content or "") or None
        first.tool_calls = first.tool_calls + last.tool_calls
        return first

    def extract_for_request(
        self, model_output: str, opts: RequestOptions
    ) -> tuple[bool, list[FunctionCall], str | None]:
        # The stream's `_preprocess_feed` rule (`stream_first_feed`): vLLM's also opens the
        # channel on a `<channel|>` anywhere, which only the tool parser alone can meet (behind
        # the reasoning parser the content holds no channel marker): a deliberate difference.
        engine = self._engine()
        text = stream_first_feed(engine, engine.new_state(self.state_type, CONTENT), model_output)
        return super().extract_for_request(text, opts)
