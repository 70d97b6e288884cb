"""Llama 3.x / 4 JSON tool parser (`llama3_json`, and `llama4_json`, an alias of the same class in
vLLM 0.33): `Llama3JsonToolParser`.

Format: the assistant turn is one or more JSON objects `{"name": ..., "parameters"|"arguments": {...}}`
separated by "; ", optionally after `<|python_tag|>`.

Streaming (as vLLM): the tool phase is a call list only when its text starts with `<|python_tag|>`
or `{`; otherwise every delta is content. In a call list each chunk re-reads the objects with
`partial_json_parser` (incomplete strings refused until the name has been sent), emits the name
(with the id) once it is complete, then argument text as the common prefix of the canonical JSON
(`json.dumps`) of the previous and current partial arguments, all of it once the object is
complete; a new object first flushes what is left of the previous call's arguments. Text after
the last object that is not another object makes every later chunk produce nothing.

Unlike vLLM, the text before the object of the current call is not kept: the state holds the
current (and, until it is flushed, the previous) object's text, the counters, and what was sent.
Objects before the current one are read once, when they complete (vLLM re-reads them on every
chunk; a later malformed object makes both return nothing for that chunk). Inside a string value
of the current call's arguments (the bulk of a long call) a chunk of plain text costs O(new text):
no parse (`_enter_open_string`), and the value's streamed middle is elided from the state.

Batch (as vLLM): every `{` outside an already decoded object must start a JSON object with a
`name` and `arguments`/`parameters`; any failure returns the whole text as content, and any
success drops all text around the objects.
"""

from __future__ import annotations

import json
import re
from typing import Any

import partial_json_parser  # type: ignore[import-untyped]
from partial_json_parser.core.options import Allow  # type: ignore[import-untyped]

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, ToolCallDelta, ToolIdFn, json_schema_format
from render_service.parsers.protocols import ParserState, ToolParser
from render_service.parsers.registry import register_tool_parser

BOT_TOKEN = "<|python_tag|>"
SEPARATOR_LEN = len("; ")  # vLLM skips two characters after each object, whatever they are

UNDECIDED, CONTENT, CALLS = 0, 1, 2

_DECODER = json.JSONDecoder()
# Text that `json.dumps(..., ensure_ascii=False)` writes as it is inside a string, and that
# cannot end one.
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_UNCLEAN = re.compile(r'["\\\x00-\x1f]')
_PROBE = "\ue003"
ELIDED = "\ue000\ue001\ue002"  # stands for the streamed middle of a long string value
ELIDE_MIN_CHARS = 64
# The partial parser looks for the last "," / ":" in ranges that may cover earlier strings:
# the elided text keeps them, in order.
_COUNTED = frozenset(",:")


def _elided(text: str) -> str:
    """The marker that stands for `text` (an earlier marker in it is absorbed)."""
    return ELIDED + "".join(c for c in text if c in _COUNTED)


def _open_string_start(text: str) -> int:
    """Index just after the opening quote of the JSON string `text` ends inside."""
    i = text.rfind('"')
    while i > 0 and (len(text[:i]) - len(text[:i].rstrip("\\"))) % 2:
        i = text.rfind('"', 0, i)
    return i + 1


def _partial_loads(text: str, flags: Allow) -> tuple[Any, int]:
    """vLLM's `partial_json_loads`: a partial parse of the whole text, or the first complete value
    when more follows."""
    try:
        return partial_json_parser.loads(text, flags), len(text)
    except json.JSONDecodeError as err:
        if "Extra data" in err.msg:
            return _DECODER.raw_decode(text)
        raise


def _is_complete(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _common_prefix(a: str, b: str) -> str:
    """vLLM's `find_common_prefix`, by halving (C-speed slice compares, not a Python loop)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # invariant: a[:lo] == b[:lo]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return a[:lo]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class Llama3JsonState(ParserState, tag="llama3_json/1"):
    """`head`: the tool-phase text while it is still undecided (a proper prefix of the bot token);
    `buf`: the call-list text from the start of object `base_index` on; `cur`: vLLM's
    current_tool_id; `sent`: argument text streamed for `cur`; `prev_*`: what vLLM reads from
    `prev_tool_call_arr` (its length, and its last entry's arguments: truthy, canonical JSON,
    and the text `get_remaining_unstreamed_args` expects); `prev_tool_sent`: what was streamed
    for the tool `prev_len - 1` when that is not `cur`."""

    mode: int = UNDECIDED
    head: str = ""
    buf: str = ""
    base_index: int = 0
    cur: int = -1
    name_sent: bool = False
    sent: str = ""
    prev_len: int = 0
    prev_truthy: bool = False
    prev_json: str = ""
    prev_expected: str = ""
    prev_tool_sent: str = ""
    # In an open string value (see `_enter_open_string`): the prev_* fields are not kept, they
    # are `sent + pending + closers`; `pending` is canonical text not streamed yet (vLLM streams
    # a string value one chunk late: its common prefix with the previous parse).
    in_open_string: bool = False
    pending: str = ""
    closers: str = ""
    ws: str = ""  # trailing whitespace of the text, which the partial parse strips
    clean: bool = False  # the open string's text so far reads the same raw and canonical
    raw_start: int = 0  # where that text starts in `buf`
    sent_start: int = 0  # ... and in `sent`


class _Stop(Exception):
    """vLLM returned None for this chunk (malformed JSON, or an exception it swallowed)."""


TOOL_NAME_PREFIX = '{"name": "'
PARAMETERS_PREFIX = '", "parameters": '
TRIGGER = '{"name": '
THINK_EXCLUDES = ["<think>", "</think>"]


@register_tool_parser("llama3_json", aliases=("llama4_json",))
class Llama3JsonToolParser(ToolParser):
    """Stateless; per-stream data in `Llama3JsonState`."""

    version = 1
    state_type = Llama3JsonState
    # xgrammar's builtin "llama" tag: with VLLM_ENFORCE_STRICT_TOOL_CALLING (default on) vLLM
    # parses required/named tool_choice like auto for this parser.
    structural_tag_model = "llama"

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        if tokenizer.token_to_id(BOT_TOKEN) is None:
            raise ValueError(f"Llama3JsonToolParser could not locate the bot token '{BOT_TOKEN}' in the tokenizer.")

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """xgrammar's `get_llama_structural_tag(...).format`, dumped."""
        tags = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            tags.append(
                {
                    "type": "tag",
                    "begin": TOOL_NAME_PREFIX + function["name"] + PARAMETERS_PREFIX,
                    "content": json_schema_format(schema),
                    "end": "}",
                }
            )
        if choice == "forced":
            return tags[0]
        return {
            "type": "triggered_tags",
            "triggers": [TRIGGER],
            "tags": tags,
            "at_least_one": choice == "required",
            "stop_after_first": False,
            "excludes": list(THINK_EXCLUDES),
        }

    # -- streaming ----------------------------------------------------------------------------------

    def feed(self, st: Llama3JsonState, text: str, tool_id: ToolIdFn) -> Delta | None:
        if st.mode == CONTENT:
            return Delta(content=text)
        if st.mode == UNDECIDED:
            current = st.head + text
            if current.startswith(BOT_TOKEN):
                st.mode, st.head, st.buf = CALLS, "", current[len(BOT_TOKEN) :]
            elif current.startswith("{"):
                st.mode, st.head, st.buf = CALLS, "", current
            else:
                if len(current) >= len(BOT_TOKEN) or not BOT_TOKEN.startswith(current):
                    st.mode, st.head = CONTENT, ""
                else:
                    st.head = current  # may still become the bot token (as plain text)
                return Delta(content=text)
        else:
            if st.in_open_string:
                if text and _PLAIN.fullmatch(text):
                    return self._extend_open_string(st, text)
                self._leave_open_string(st)
            st.buf += text
        try:
            delta = self._calls_step(st, tool_id)
        except _Stop:
            return None
        self._enter_open_string(st)
        return delta

    # -- an open string value, in O(new text) ---------------------------------------------------

    def _enter_open_string(self, st: Llama3JsonState) -> None:
        """After a full parse: when the current call's text ends inside a string value of its
        arguments, text without a quote, backslash or control character appended there lands
        verbatim at one place of the canonical arguments JSON (checked once, by parsing with a
        probe character appended), so later chunks of such text need no parse: the new
        canonical JSON is `B + text + closers` where the previous one was `B + closers`, and
        vLLM's common prefix of the two is `B` (trailing whitespace of the text waits: the
        partial parse strips it)."""
        if not st.name_sent or not st.prev_truthy or st.prev_len != st.cur + 1 or st.prev_json != st.prev_expected:
            return
        try:
            objects = self._parse(st, st.buf + _PROBE)
        except _Stop:
            return
        if len(objects) != st.cur - st.base_index + 1 or objects[-1][1]:
            return
        args = objects[-1][0].get("arguments") if isinstance(objects[-1][0], dict) else None
        if not isinstance(args, (dict, list)):
            return
        probed = _dumps(args)
        at = probed.find(_PROBE)
        if at < 0 or probed.find(_PROBE, at + 1) >= 0:
            return
        before, closers = probed[:at], probed[at + 1 :]
        ws = st.buf[len(st.buf.rstrip()) :]  # before the probe, not stripped
        if ws:
            if not before.endswith(ws):
                return
            before = before[: len(before) - len(ws)]
        if not closers.startswith('"') or before + closers != st.prev_json or not before.startswith(st.sent):
            return
        st.in_open_string = True
        st.pending = before[len(st.sent) :]
        st.closers = closers
        st.ws = ws
        st.prev_json = st.prev_expected = ""
        raw = st.buf[_open_string_start(st.buf) : len(st.buf) - len(ws)]
        st.clean = _UNCLEAN.search(raw) is None and before.endswith(raw)
        st.raw_start = len(st.buf) - len(ws) - len(raw)
        st.sent_start = len(before) - len(raw)

    def _leave_open_string(self, st: Llama3JsonState) -> None:
        st.in_open_string = False
        st.prev_json = st.prev_expected = st.sent + st.pending + st.closers
        st.pending = st.closers = st.ws = ""

    def _extend_open_string(self, st: Llama3JsonState, text: str) -> Delta | None:
        st.buf += text
        kept = text.rstrip()
        if not kept:  # the parse strips it: the same JSON as before, nothing to stream
            st.ws += text
            return None
        diff = st.pending
        st.sent += diff
        st.pending = st.ws + kept
        st.ws = text[len(kept) :]
        if st.clean and len(st.sent) - st.sent_start >= ELIDE_MIN_CHARS:
            # The string's streamed text is plain: nothing reads it again except as part of
            # later parses, where one marker stands for it in the raw and the streamed text
            # alike (every later answer is the same; only this stream's state is affected).
            streamed = len(st.sent) - st.sent_start
            if st.sent_start >= len(st.sent) - streamed and st.raw_start + streamed <= len(st.buf):
                marker = _elided(st.sent[st.sent_start :])
                st.buf = st.buf[: st.raw_start] + marker + st.buf[st.raw_start + streamed :]
                st.sent = st.sent[: st.sent_start] + marker
        return Delta(tool_calls=[ToolCallDelta(index=st.cur, arguments=diff)])

    def _parse(self, st: Llama3JsonState, buf: str | None = None) -> list[tuple[Any, bool, int]]:
        """The objects from `base_index` on: (object, complete, start offset in buf)."""
        flags = Allow.ALL if st.name_sent else Allow.ALL & ~Allow.STR
        out: list[tuple[Any, bool, int]] = []
        idx = 0
        buf = st.buf if buf is None else buf
        while idx < len(buf):
            try:
                obj, end = _partial_loads(buf[idx:], flags)
            except partial_json_parser.core.exceptions.MalformedJSON:
                raise _Stop from None
            except Exception:  # vLLM's outer handler
                raise _Stop from None
            complete = _is_complete(buf[idx : idx + end])
            try:
                if "parameters" in obj:
                    if "arguments" in obj:
                        raise _Stop
                    obj["arguments"] = obj["parameters"]
            except TypeError:
                raise _Stop from None
            out.append((obj, complete, idx))
            idx += end + SEPARATOR_LEN
        return out

    def _calls_step(self, st: Llama3JsonState, tool_id: ToolIdFn) -> Delta | None:
        objects = self._parse(st)
        if not objects:
            return None
        total = st.base_index + len(objects)
        local = st.cur - st.base_index
        current = objects[local][0] if st.cur >= 0 else objects[-1][0]  # vLLM: arr[-1] when cur == -1
        if not isinstance(current, dict) and (st.cur >= 0 or total <= st.cur + 1):
            raise _Stop  # vLLM's `.get` on a non-object raises
        if total > st.cur + 1:
            delta = None
            if st.cur >= 0:
                args = current.get("arguments")
                if args:
                    rest = _dumps(args)[len(st.sent) :]
                    delta = Delta(tool_calls=[ToolCallDelta(index=st.cur, arguments=rest)])
                    st.sent += rest
            # objects before the new current one are never read again
            st.prev_tool_sent = st.sent if st.prev_len - 1 == st.cur else st.prev_tool_sent
            new = total - 1
            cut = objects[new - st.base_index][2]
            st.buf = st.buf[cut:]
            st.base_index = new
            st.cur = new
            st.name_sent = False
            st.sent = ""
            return delta
        delta = None
        if not st.name_sent:
            name = current.get("name")
            if name:
                if not isinstance(name, str):
                    raise _Stop  # pydantic rejects a non-string name
                delta = Delta(tool_calls=[ToolCallDelta(index=st.cur, id=tool_id(st.cur), type="function", name=name)])
                st.name_sent = True
        else:
            args = current.get("arguments")
            if args:
                cur_json = _dumps(args)
                diff: str | None = None
                if objects[local][1]:
                    diff = cur_json[len(st.sent) :]
                elif st.prev_truthy and cur_json != st.prev_json:
                    diff = _common_prefix(st.prev_json, cur_json)[len(st.sent) :]
                if diff is not None:
                    delta = Delta(tool_calls=[ToolCallDelta(index=st.cur, arguments=diff)])
                    st.sent += diff
        # prev_tool_call_arr = tool_call_arr
        args = current.get("arguments", {})
        st.prev_len = total
        st.prev_truthy = bool(current.get("arguments"))
        st.prev_json = _dumps(current.get("arguments"))
        st.prev_expected = args if isinstance(args, str) else _dumps(args)
        return delta

    def remaining_args(self, st: Llama3JsonState) -> str:
        """`get_remaining_unstreamed_args`."""
        if st.in_open_string:
            self._leave_open_string(st)
        if not st.prev_len:
            return ""
        actual = st.sent if st.prev_len - 1 == st.cur else st.prev_tool_sent
        if st.prev_expected.startswith(actual):
            return st.prev_expected[len(actual) :]
        return ""

    # -- batch --------------------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        if BOT_TOKEN not in model_output and "{" not in model_output:
            return False, [], model_output
        calls: list[FunctionCall] = []
        end = -1
        pos = model_output.find("{")
        while pos != -1:
            if pos > end:
                try:
                    obj, length = _DECODER.raw_decode(model_output[pos:])
                    end = pos + length
                    name = obj["name"]
                    args = obj["arguments"] if "arguments" in obj else obj["parameters"]
                    if not isinstance(name, str):
                        raise TypeError("name")
                    calls.append(FunctionCall(name, _dumps(args)))
                except Exception:
                    return False, [], model_output
            pos = model_output.find("{", pos + 1)
        if calls:
            return True, calls, None
        return False, [], model_output
