"""Mistral (`mistral` reasoning and tool parsers): vLLM 0.33's `MistralParser`.

    [THINK]reasoning[/THINK]content[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]...   v11+
    content[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]                 before v11

The tokenizer decides the format, as in vLLM:

- reasoning: `[THINK]`/`[/THINK]` special tokens when the vocabulary has `[THINK]` (v13+);
  plain-text `<think>`/`</think>` for other grammar-capable tokenizers (Tekken v11+);
  none otherwise (all output is content);
- tool calls from v11: the shared engine (`engine.py`) with vLLM's config: `[TOOL_CALLS]` opens a
  call whose name runs to `[ARGS]` (or to the first `{`, which starts the arguments), the
  arguments stream as JSON text and end at the next `[TOOL_CALLS]` or the end of the output;
  batch arguments are the first JSON value of the text (trailing text dropped); an empty name is
  a call named "" (vLLM surfaces the malformed generation); `[TOOL_CALLS]` inside reasoning ends it;
- tool calls before v11: `[TOOL_CALLS]` followed by a JSON array of `{"name", "arguments"}` (or one
  such object): batch as vLLM's legacy extraction (the first JSON value after the marker, a
  `[{...}]` regex as fallback; entries that are not calls skipped; string arguments kept).
  Streaming holds the JSON after the marker until it is one complete value and then sends every
  call whole, where vLLM streams each call's name and argument fragments as they arrive: the
  assembled message is the same, the chunking differs (see the module's tests).

Tool-call ids are the service's deterministic ids (`tool_id(index)`), not vLLM's random
9-character ones; the `mistral` renderer keeps the last 9 characters of a longer id, as vLLM does,
so they are valid mistral-common ids when the client sends the history back.

Render side (`adjust_request`): with tools and `tool_choice` other than "none" the output keeps
its special tokens (`skip_special_tokens=False`) so `[TOOL_CALLS]` survives detokenization.
vLLM 0.33 additionally compiles a mistral-common grammar for grammar-capable tokenizers (v11+),
which this service does not produce (see docs/parity.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Literal

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolCallDelta, ToolIdFn
from render_service.parsers.engine import (
    CONTENT,
    EV_ARG,
    EV_REASONING_END,
    EV_TOOL_END,
    EV_TOOL_START,
    REASONING,
    TOOL_ARGS,
    TOOL_NAME,
    Engine,
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    Slot,
    Transition,
)
from render_service.parsers.protocols import ParserState, RequestAdjustment
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
THINK_START_SPECIAL = "[THINK]"
THINK_END_SPECIAL = "[/THINK]"
THINK_START_TEXT = "<think>"
THINK_END_TEXT = "</think>"
OPEN_BRACE = "{"

ReasoningEncoding = Literal["special_token", "text", "none"]
_ARRAY_RE = re.compile(r"\[{.*}\]", re.DOTALL)


@cache
def mistral_config(encoding: ReasoningEncoding) -> EngineConfig:
    """vLLM's `mistral_config(reasoning_encoding=...)`."""
    if encoding == "special_token":
        reasoning_terminals = {"THINK_START": THINK_START_SPECIAL, "THINK_END": THINK_END_SPECIAL}
        reasoning_id_terminals = dict(reasoning_terminals)
    elif encoding == "text":
        reasoning_terminals = {"THINK_START": THINK_START_TEXT, "THINK_END": THINK_END_TEXT}
        reasoning_id_terminals = {}
    else:
        reasoning_terminals = {}
        reasoning_id_terminals = {}
    reasoning = encoding != "none"
    reasoning_transitions = (
        {
            (CONTENT, "THINK_START"): Transition(REASONING),
            (REASONING, "THINK_START"): Transition(REASONING),  # a repeated start is absorbed
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (CONTENT, "THINK_END"): Transition(CONTENT),  # a stray end is absorbed
            (REASONING, "TOOL_CALLS"): Transition(TOOL_NAME, (EV_REASONING_END, EV_TOOL_START)),
        }
        if reasoning
        else {}
    )
    return EngineConfig(
        name="mistral",
        initial_state=CONTENT,
        wait_for_reasoning=reasoning,
        terminals={**reasoning_terminals, "TOOL_CALLS": TOOL_CALLS, "ARGS": ARGS, "OPEN_BRACE": OPEN_BRACE},
        token_id_terminals={**reasoning_id_terminals, "TOOL_CALLS": TOOL_CALLS, "ARGS": ARGS},
        transitions={
            **reasoning_transitions,
            (CONTENT, "TOOL_CALLS"): Transition(
                TOOL_NAME, (EV_REASONING_END, EV_TOOL_START) if reasoning else (EV_TOOL_START,)
            ),
            (TOOL_NAME, "ARGS"): Transition(TOOL_ARGS),
            # `{` ends the name and is the first character of the arguments.
            (TOOL_NAME, "OPEN_BRACE"): Transition(TOOL_ARGS, (EV_ARG,)),
            (TOOL_ARGS, "TOOL_CALLS"): Transition(TOOL_NAME, (EV_TOOL_END, EV_TOOL_START)),
        },
        stream_arg_deltas=True,
        tool_args_json=True,
        strip_trailing_reasoning_whitespace=True,
        drop_whitespace_only_content_before_tools=True,
    )


def reasoning_encoding(info: TokenizerInfo) -> ReasoningEncoding:
    """`MistralParser.__init__`: `[THINK]` in the vocabulary, else a grammar-capable tokenizer
    (Tekken v11+) thinks in plain text, else no reasoning."""
    if info.token_to_id(THINK_START_SPECIAL) is not None:
        return "special_token"
    tokenizer = info.tokenizer
    if getattr(tokenizer, "is_tekken", False) and getattr(tokenizer, "version", 0) >= 11:
        return "text"
    return "none"


def is_pre_v11(info: TokenizerInfo) -> bool:
    """`_is_pre_v11_tokeniser`: a Mistral tokenizer's version, else whether `[ARGS]` is missing."""
    version = getattr(info.tokenizer, "version", None)
    if isinstance(version, int):
        return version < 11
    return info.token_to_id(ARGS) is None


def first_json_value(raw: str) -> str:
    """vLLM's `MistralParser._extract_args_json`: the first complete JSON value of the text."""
    stripped = raw.strip()
    if not stripped:
        return "{}"
    try:
        _, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return stripped
    return stripped[:end]


def pre_v11_calls(parsed: Any) -> list[FunctionCall]:
    """`_pre_v11_function_calls`: a bare object is one call; non-call entries are skipped."""
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not isinstance(parsed, list):
        return []
    calls = []
    for item in parsed:
        if not isinstance(item, dict) or not ("name" in item or "arguments" in item):
            continue
        name = item.get("name")
        arguments = item.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(FunctionCall(name=name if isinstance(name, str) else "", arguments=arguments))
    return calls


def pre_v11_extract(model_output: str, opts: RequestOptions) -> tuple[bool, list[FunctionCall], str | None]:
    """`_legacy_extract_tool_calls` (batch, before v11)."""
    if opts.tool_choice == "none" and opts.tools:
        return False, [], model_output
    content: str | None = None
    if TOOL_CALLS in model_output:
        content, *segments = model_output.split(TOOL_CALLS)
        body = next((segment.strip() for segment in segments if segment.strip()), "")
    elif opts.forces_tool_calls:
        body = model_output.strip()  # a guided bare array, no marker
    else:
        return False, [], model_output
    parsed: Any
    try:
        parsed, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        try:
            parsed = json.loads(_ARRAY_RE.findall(body)[0])
        except (IndexError, json.JSONDecodeError):
            parsed = None
    calls = pre_v11_calls(parsed)
    if not calls:
        return False, [], body
    return True, calls, content if content and content.strip() else None


def uses_grammar(tokenizer: Any) -> bool:
    """vLLM's grammar branch of `MistralParser.adjust_request`: a Mistral Tekken tokenizer of v11+."""
    return bool(getattr(tokenizer, "is_tekken", False)) and getattr(tokenizer, "version", 0) >= 11


def forced_call_schema(body: Mapping[str, Any], tokenizer: Any) -> dict[str, Any] | None:
    """`_build_guided_schema_pre_v11`, as the non-grammar branch of `adjust_request` applies it: for
    required or named `tool_choice` with tools, no `structured_outputs` of the request's own and a
    `response_format` it may replace, the JSON schema of a bare `[{"name", "arguments"}]` array
    (the `response_format` is dropped). None when it does not apply."""
    if uses_grammar(tokenizer):
        return None
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    named = isinstance(choice, Mapping)
    if not tools or body.get("structured_outputs") is not None or not (choice == "required" or named):
        return None
    response_format = body.get("response_format")
    if response_format is not None and response_format.get("type") not in ("text", "json_object", "json_schema"):
        return None
    functions = [tool.get("function") or {} for tool in tools]
    extra: dict[str, Any] = {}
    if isinstance(choice, Mapping):
        wanted = (choice.get("function") or {}).get("name")
        functions = [f for f in functions if f.get("name") == wanted]
        if not functions:
            return None
        extra["maxItems"] = 1
    any_of = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [function.get("name")]},
                "arguments": function.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for function in functions
    ]
    return {"type": "array", "minItems": 1, **extra, "items": {"type": "object", "anyOf": any_of}}


class MistralEngine(Engine):
    """The engine with `MistralParser`'s hooks."""

    def _accept_name(self, name: str, tools: Any) -> bool:
        return True  # the name after [TOOL_CALLS] is final, empty included (no validation)

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
        if not slot.name_sent and not slot.name and value:
            # `_try_extract_name` is the slot's name: no JSON-embedded "name" in this format.
            slot.args += value
            self._emit_name(st, index, calls, "", tool_id, tools)
            if slot.name_sent:
                calls.append(ToolCallDelta(index=index, arguments=value))
            return
        sent_before = slot.name_sent
        super()._arg_chunk(st, index, value, calls, tool_id, tools, elide=elide)
        if value and not sent_before and slot.name_sent:
            # The `{` (or first argument text) that carried the name out goes out as arguments too.
            calls.append(ToolCallDelta(index=index, arguments=value))

    def _extract_args_json(self, raw: str) -> str:
        return first_json_value(raw)

    def build_result(self, slots: list[Slot], tools: Any, tool_id: ToolIdFn) -> tuple[bool, list[FunctionCall]]:
        """`_build_extracted_result` with Mistral's `_extract_name_and_args` (never an envelope)."""
        calls: list[FunctionCall] = []
        for slot in slots:
            if not slot.name and not slot.args:
                continue
            name = slot.name.strip()
            args_json = first_json_value(slot.args) if slot.args.strip() else "{}"
            args_json = self.fix_arg_types(args_json, name, tools)
            calls.append(FunctionCall(name=name, arguments=args_json, id=slot.id or None))
        return bool(calls), calls


class MistralReasoningState(EngineState, tag="mistral.reasoning/1"):
    pass


class MistralToolState(EngineState, tag="mistral.tool/1"):
    pass


# vLLM's `StreamingState` for the pre-v11 stream.
(
    WAITING_FOR_TOOL_START,
    WAITING_FOR_TOOL_KEY,
    PARSING_NAME,
    PARSING_NAME_COMPLETED,
    WAITING_FOR_ARGUMENTS_START,
    PARSING_ARGUMENTS,
    PARSING_ARGUMENTS_COMPLETED,
    TOOL_COMPLETE,
    ALL_TOOLS_COMPLETE,
) = range(9)
# Where `_split_delta` cuts the text in each state: the characters after which it stops.
_SPLIT_STOPS: dict[int, str] = {
    WAITING_FOR_TOOL_START: "{",
    WAITING_FOR_TOOL_KEY: ":{}",
    PARSING_NAME: ",]}",
    PARSING_NAME_COMPLETED: "}]",
    WAITING_FOR_ARGUMENTS_START: "{}",
    PARSING_ARGUMENTS: "}",
    PARSING_ARGUMENTS_COMPLETED: "}]",
    TOOL_COMPLETE: "{]",
}
_JSON_WS = " \t\n\r"
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_NUMBER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = ("true", "false", "null")


class JsonEventLexer(msgspec.Struct, array_like=True):
    """An incremental JSON parser that emits ijson's `(prefix, event, value)` events with the
    timing of ijson's yajl2_c backend (vLLM's `ijson.parse_coro`): a container or literal event as
    soon as its last character arrives, a string or key at its closing quote, a number at the
    first character after it. Only what is open is kept: the container stack (with each map's
    current key) and the unfinished token."""

    # One frame per open container: [kind "a"|"m", current key, phase]; phase: "v" value expected,
    # "k" key expected, ":" colon expected, "," comma or close expected, "V"/"K" after "[" / "{"
    # (a value/key or the close).
    stack: list[list[Any]] = msgspec.field(default_factory=list)
    top: str = "v"  # the top level: "v" a value expected, "d" done
    token: str = ""  # "" | "s" string | "n" number | "l" literal
    raw: str = ""  # the unfinished token's text
    escape: bool = False  # the string's last character is an unpaired backslash
    failed: bool = False  # yajl raised: every later send raises again

    def _path(self, depth: int) -> str:
        parts = ["item" if kind == "a" else str(key) for kind, key, _ in self.stack[:depth]]
        return ".".join(parts)

    def _value_prefix(self) -> str:
        return self._path(len(self.stack))

    def _expecting_value(self) -> bool:
        if not self.stack:
            return self.top == "v"
        return self.stack[-1][2] in ("v", "V")

    def _after_value(self) -> None:
        if self.stack:
            self.stack[-1][2] = ","
        else:
            self.top = "d"

    def feed(self, text: str) -> list[tuple[str, str, Any]]:
        """The events `text` completes; raises ValueError where yajl reports a JSON error."""
        if self.failed:
            raise ValueError("the JSON stream already failed")
        events: list[tuple[str, str, Any]] = []
        try:
            for ch in text:
                self._char(ch, events)
        except ValueError:
            self.failed = True
            raise
        return events

    def _char(self, ch: str, events: list[tuple[str, str, Any]]) -> None:
        if self.token == "s":
            if self.escape:
                self.escape = False
                self.raw += ch
            elif ch == "\\":
                self.escape = True
                self.raw += ch
            elif ch == '"':
                self._end_string(events)
            else:
                self.raw += ch
            return
        if self.token == "n":
            if ch in _NUMBER_CHARS:
                self.raw += ch
                return
            self._end_number(events)
        elif self.token == "l":
            self.raw += ch
            if not any(lit.startswith(self.raw) for lit in _LITERALS):
                raise ValueError("invalid literal")
            if self.raw in _LITERALS:
                value = {"true": True, "false": False, "null": None}[self.raw]
                events.append((self._value_prefix(), "null" if value is None else "boolean", value))
                self.token, self.raw = "", ""
                self._after_value()
            return
        if ch in _JSON_WS:
            return
        frame = self.stack[-1] if self.stack else None
        phase = frame[2] if frame is not None else self.top
        if phase == "d":
            raise ValueError("trailing garbage")
        if ch == '"' and phase in ("v", "V", "k", "K"):
            self.token, self.raw = "s", ""
            return
        if phase in ("k", "K"):
            if ch == "}" and phase == "K":
                self._close(events, "m")
                return
            raise ValueError("expected a key")
        if phase == ":":
            if ch != ":":
                raise ValueError("expected ':'")
            frame[2] = "v"  # type: ignore[index]
            return
        if phase == ",":
            if ch == ",":
                frame[2] = "k" if frame[0] == "m" else "v"  # type: ignore[index]
                return
            if ch in "]}" and (ch == "]") == (frame[0] == "a"):  # type: ignore[index]
                self._close(events, frame[0])  # type: ignore[index]
                return
            raise ValueError("expected ',' or a close")
        # a value is expected
        if ch == "]" and phase == "V":
            self._close(events, "a")
        elif ch == "{":
            events.append((self._value_prefix(), "start_map", None))
            self.stack.append(["m", None, "K"])
        elif ch == "[":
            events.append((self._value_prefix(), "start_array", None))
            self.stack.append(["a", None, "V"])
        elif ch == "-" or ch.isdigit():
            self.token, self.raw = "n", ch
        elif ch in "tfn":
            self.token, self.raw = "l", ch
        else:
            raise ValueError("invalid char")

    def _close(self, events: list[tuple[str, str, Any]], kind: str) -> None:
        self.stack.pop()
        events.append((self._value_prefix(), "end_map" if kind == "m" else "end_array", None))
        self._after_value()

    def _end_string(self, events: list[tuple[str, str, Any]]) -> None:
        try:
            value = json.loads(f'"{self.raw}"')
        except json.JSONDecodeError as exc:
            raise ValueError("invalid string") from exc
        self.token, self.raw = "", ""
        frame = self.stack[-1] if self.stack else None
        if frame is not None and frame[2] in ("k", "K"):
            frame[1] = value
            frame[2] = ":"
            events.append((self._path(len(self.stack) - 1), "map_key", value))
            return
        events.append((self._value_prefix(), "string", value))
        self._after_value()

    def _end_number(self, events: list[tuple[str, str, Any]]) -> None:
        if not _NUMBER_RE.fullmatch(self.raw):
            raise ValueError("invalid number")
        value = json.loads(self.raw)
        self.token, self.raw = "", ""
        events.append((self._value_prefix(), "number", value))
        self._after_value()


class MistralLegacyToolState(ParserState, tag="mistral.legacy/1"):
    """vLLM's pre-v11 streaming state: `tool_call_started`, `streaming_state`, the ijson
    coroutine's `bare_object`, `current_tool_id`, whether the current call still waits for its
    id, and the JSON lexer (container stack + unfinished token)."""

    started: bool = False
    phase: int = WAITING_FOR_TOOL_START
    bare_object: bool = False
    tool_index: int = -1
    id_pending: bool = False
    lexer: JsonEventLexer = msgspec.field(default_factory=JsonEventLexer)


def _split_delta(text: str, stops: str) -> tuple[str, str]:
    """`_split_delta` with at most one stop per character class: cut after the first stop."""
    for index, ch in enumerate(text):
        if ch in stops:
            return text[: index + 1], text[index + 1 :]
    return text, ""


@register_reasoning_parser("mistral")
class MistralReasoningParser(EngineReasoningParser):
    version = 2
    state_type = MistralReasoningState
    engine_type = MistralEngine

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        self.encoding = reasoning_encoding(tokenizer)
        self.info = tokenizer
        self.thinking_enabled = thinking_enabled
        self.engine = MistralEngine(mistral_config(self.encoding), tokenizer, skip_tool_parsing=True)

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return mistral_config("special_token")  # the instance picks its encoding from the tokenizer

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        if self.encoding == "none":
            return None, model_output
        return super().extract(model_output, prompt_token_ids)


@register_tool_parser("mistral")
class MistralToolParser(EngineToolParser):
    version = 1
    state_type = MistralToolState
    engine_type = MistralEngine
    # Required and named tool_choice are parsed like auto ([TOOL_CALLS] format, not vLLM's JSON paths).
    supports_required_and_named = False

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        self.encoding = reasoning_encoding(tokenizer)
        self.pre_v11 = is_pre_v11(tokenizer)
        if tokenizer.token_to_id(TOOL_CALLS) is None:
            raise RuntimeError("Mistral parser could not locate the tool call token in the tokenizer!")

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        return mistral_config("special_token")  # the instance picks its encoding (engine())

    def engine(self) -> Engine:
        key = (not self.reasoning_configured, True)
        engine = self._engines.get(key)
        if engine is None:
            engine = MistralEngine(mistral_config(self.encoding), self.info, skip_reasoning_parsing=key[0])
            self._engines[key] = engine
        return engine

    forced_call_schema = staticmethod(forced_call_schema)

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # vLLM's non-grammar branch: keep [TOOL_CALLS] in the detokenized text.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    # -- before v11: the legacy JSON-array format ----------------------------------------------------

    def new_state(self) -> ParserState:
        if self.pre_v11:
            return MistralLegacyToolState()
        return super().new_state()

    def load_state(self, obj: Any) -> ParserState:
        if self.pre_v11:
            return msgspec.convert(obj, MistralLegacyToolState)
        return super().load_state(obj)

    def feed_for_request(
        self, st: Any, text: str, token_ids: Sequence[int], tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        if not self.pre_v11:
            return super().feed_for_request(st, text, token_ids, tool_id, opts)
        return self._legacy_feed(st, text, tool_id, opts)

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        if not self.pre_v11:
            return super().finish_for_request(st, tool_id, opts)
        return None

    def extract_for_request(
        self, model_output: str, opts: RequestOptions
    ) -> tuple[bool, list[FunctionCall], str | None]:
        if self.pre_v11:
            return pre_v11_extract(model_output, opts)
        return super().extract_for_request(model_output, opts)

    def _legacy_feed(
        self, st: MistralLegacyToolState, text: str, tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        """`extract_tool_calls_streaming` for pre-v11 tokenizers (`[TOOL_CALLS][{...}, ...]`)."""
        if TOOL_CALLS in text:
            st.started = True
        elif not st.started and text and opts.forces_tool_calls:
            st.started = True  # a guided bare array: no marker
        if not st.started:
            return Delta(content=text)
        try:
            return self._legacy_step(st, text, tool_id)
        except ValueError:
            # ijson raised (invalid JSON): vLLM logs it and sends nothing for this chunk; what earlier
            # pieces of the chunk changed stays, and every later piece raises again (lexer.failed).
            return None

    def _legacy_step(self, st: MistralLegacyToolState, text: str, tool_id: ToolIdFn) -> Delta | None:
        content: str | None = None
        if TOOL_CALLS in text:
            head, *rest = text.split(TOOL_CALLS)
            if not text.startswith(TOOL_CALLS):
                content = head
            text = "".join(rest)
        calls: list[ToolCallDelta] = []
        current = ToolCallDelta(index=st.tool_index, type="function")
        modified = False
        while text:
            before = st.phase
            piece = ""
            if st.phase == ALL_TOOLS_COMPLETE:
                content, text = text, ""
            else:
                piece, text = _split_delta(text, _SPLIT_STOPS[st.phase])
                name: str | None = None
                string_args: str | None = None
                starting = False
                for prefix, event, value in st.lexer.feed(piece):
                    name, string_args, starting = self._legacy_event(
                        st, prefix, event, value, name, string_args, starting
                    )
                if starting:
                    if modified:
                        calls.append(self._legacy_close(st, current, tool_id))
                    modified = False
                    st.tool_index += 1
                    st.id_pending = True
                    current = ToolCallDelta(index=st.tool_index, type="function")
                if name is not None:
                    modified = True
                    current.name = name
                if string_args is not None:
                    modified = True
                    current.arguments = string_args
            if st.phase == PARSING_NAME_COMPLETED:
                st.phase = WAITING_FOR_TOOL_KEY
            if st.phase in (PARSING_ARGUMENTS, PARSING_ARGUMENTS_COMPLETED):
                if st.phase == PARSING_ARGUMENTS_COMPLETED:
                    st.phase = WAITING_FOR_TOOL_KEY
                modified = True
                current.arguments = piece if current.arguments is None else current.arguments + piece
                if before != PARSING_ARGUMENTS:  # the first argument text is left-stripped
                    current.arguments = current.arguments.lstrip()
        if modified:
            calls.append(self._legacy_close(st, current, tool_id))
        if content or calls:
            return Delta(content=content or None, tool_calls=calls)
        return Delta() if st.phase == ALL_TOOLS_COMPLETE else None

    @staticmethod
    def _legacy_close(st: MistralLegacyToolState, call: ToolCallDelta, tool_id: ToolIdFn) -> ToolCallDelta:
        if st.id_pending:
            call.id = tool_id(call.index)
            st.id_pending = False
        return call

    @staticmethod
    def _legacy_event(
        st: MistralLegacyToolState,
        prefix: str,
        event: str,
        value: Any,
        name: str | None,
        string_args: str | None,
        starting: bool,
    ) -> tuple[str | None, str | None, bool]:
        """vLLM's `update_stream_state_pre_v11_tokenizer` coroutine, one event."""
        if prefix == "" and event == "start_map":
            st.bare_object = True  # a bare top-level object is one call
        if st.bare_object:
            prefix = f"item.{prefix}" if prefix else "item"
        if prefix == "item" and event == "start_map":
            st.phase = WAITING_FOR_TOOL_KEY
            starting = True
        if prefix == "item" and event == "map_key" and value == "name":
            st.phase = PARSING_NAME
        if prefix == "item.name" and event == "string":
            name = value
            st.phase = PARSING_NAME_COMPLETED
        if prefix == "item" and event == "map_key" and value == "arguments":
            st.phase = WAITING_FOR_ARGUMENTS_START
        if prefix == "item.arguments" and event == "start_map":
            st.phase = PARSING_ARGUMENTS
        if prefix == "item.arguments" and event == "end_map":
            st.phase = PARSING_ARGUMENTS_COMPLETED
        if prefix == "item.arguments" and event == "string":
            string_args = value
        if prefix == "item" and event == "end_map":
            st.phase = ALL_TOOLS_COMPLETE if st.bare_object else TOOL_COMPLETE
        if prefix == "" and event == "end_array":
            st.phase = ALL_TOOLS_COMPLETE
        return name, string_args, starting
