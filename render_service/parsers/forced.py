"""vLLM's JSON paths for `tool_choice` required / named, used by every tool parser whose
`supports_required_and_named` is True (no structural tag model): the rendered request carries a
JSON-schema constraint, and the output is read as JSON instead of the family's format.

- named, streaming (`tool_parsers/streaming.extract_named_tool_call_streaming`): every chunk's
  text is argument text of call 0; the first chunk also carries the id and the forced name (ours:
  the first chunk that makes the output more than whitespace, see `named_feed`).
- required, streaming (`extract_required_tool_call_streaming`): the output is a JSON array of
  `{"name": ..., "parameters": ...}`; a call is announced (id, name, the parameters so far) once
  its name string has closed and its parameters value has started, and its later chunks carry
  only new parameter text. vLLM re-scans the whole text on every chunk with a prefix-stable
  scanner; `RequiredScan` is the same scanner fed only the new text (its state: nesting depth,
  string flags, where the current element is, and the key / name text while they are open).
- batch (`DelegatingParser._extract_tool_calls`): named -> one call whose arguments are the
  whole content; required -> pydantic `list[FunctionDefinition]` over the content (anything
  else: no calls), arguments `json.dumps(parameters)`.
"""

from __future__ import annotations

import json
from typing import Any

from render_service.parsers.base import Delta, FunctionCall, ToolCallDelta, ToolIdFn
from render_service.parsers.protocols import ParserState

EXPECT_KEY, EXPECT_COLON, EXPECT_VALUE, IN_STRING, IN_CONTAINER, IN_SCALAR, AFTER_VALUE = range(7)
MAX_KEY = len("parameters")  # longer keys can never be "name" or "parameters"


class RequiredScan(ParserState, tag="forced_required/2"):
    """The scanner of one stream. `pos`: characters seen; `index`: elements started (the
    current one is `index - 1`, live while `in_elem`); `key_text`/`name_text`: the open key /
    name string; `name`, `args_start`/`args_end`: the current element's name (once its string
    closed and decoded) and parameter span (-1 while unknown); `pending`: its parameter text not
    sent yet because it is not announced; `announced`: it was sent; `blocked`: an earlier
    element ended without ever being ready (vLLM stops at it); `done`: the array ended."""

    pos: int = 0
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    expect: int = EXPECT_KEY
    key: str | None = None
    key_text: str = ""
    in_elem: bool = False
    index: int = 0
    name: str | None = None
    name_text: str = ""
    args_start: int = -1
    args_end: int = -1
    pending: str = ""
    announced: bool = False
    blocked: bool = False
    done: bool = False
    named: bool = False  # named: the call's id and name were sent
    named_ws: str = ""  # named: the output so far while it is only whitespace (not sent yet)


def required_feed(st: RequiredScan, text: str, tool_id: ToolIdFn) -> Delta | None:
    """`extract_required_tool_call_streaming` for the new text only."""
    calls: list[ToolCallDelta] = []
    buf: list[str] = []
    for ch in text:
        if st.done:
            break
        i = st.pos
        st.pos += 1
        _step(st, ch, i, calls, buf, tool_id)
        if st.in_elem and 0 <= st.args_start <= i and (st.args_end < 0 or i < st.args_end):
            buf.append(ch)
    _flush(st, calls, buf, tool_id)
    return Delta(tool_calls=calls) if calls else None


def _flush(st: RequiredScan, calls: list[ToolCallDelta], buf: list[str], tool_id: ToolIdFn) -> None:
    """Send what the current element has (at its end and at the end of each chunk)."""
    args = "".join(buf)
    buf.clear()
    if not st.in_elem or st.blocked:
        return
    if st.name is None or st.args_start < 0:
        st.pending += args
        return
    index = st.index - 1
    if st.announced:
        if args:
            calls.append(ToolCallDelta(index=index, arguments=args))
        return
    args, st.pending = st.pending + args, ""
    calls.append(ToolCallDelta(index=index, id=tool_id(index), type="function", name=st.name, arguments=args))
    st.announced = True


def _end_value(st: RequiredScan, pos: int) -> None:
    if st.key == "parameters":
        st.args_end = pos
    elif st.key == "name" and st.expect == IN_STRING:
        try:
            st.name = json.loads(st.name_text)
        except json.JSONDecodeError:
            st.name = None  # never ready: vLLM's batch path rejects the array too
        st.name_text = ""
    st.expect = AFTER_VALUE


def _start_value(st: RequiredScan, pos: int, state: int) -> None:
    if st.key == "parameters":
        st.args_start = pos
    st.expect = state


def _step(st: RequiredScan, ch: str, i: int, calls: list[ToolCallDelta], buf: list[str], tool_id: ToolIdFn) -> None:
    """vLLM's `_scan_required_tool_calls` for one character."""
    if st.in_string:
        if st.depth == 2 and st.in_elem:
            if st.expect == IN_STRING and st.key == "name":
                st.name_text += ch
            elif st.expect == EXPECT_KEY and len(st.key_text) < MAX_KEY + 2:
                st.key_text += ch  # raw key text and its closing quote (capped)
        if st.escaped:
            st.escaped = False
        elif ch == "\\":
            st.escaped = True
        elif ch == '"':
            st.in_string = False
            if st.depth == 2 and st.in_elem:
                if st.expect == EXPECT_KEY:
                    st.key = st.key_text[:-1] if len(st.key_text) <= MAX_KEY + 1 else None
                    st.key_text = ""
                    st.expect = EXPECT_COLON
                elif st.expect == IN_STRING:
                    _end_value(st, i + 1)
        return
    if ch == '"':
        st.in_string = True
        if st.depth == 2 and st.in_elem:
            if st.expect == EXPECT_VALUE:
                _start_value(st, i, IN_STRING)
                st.name_text = ch
            elif st.expect == EXPECT_KEY:
                st.key_text = ""
        return
    if ch in "{[":
        if st.depth == 0:
            if ch != "[":
                st.done = True
                return
        elif st.depth == 1:
            if ch != "{":
                st.done = True
                return
            st.in_elem = True
            st.index += 1
            st.name, st.name_text, st.pending = None, "", ""
            st.args_start = st.args_end = -1
            st.announced = False
            st.expect = EXPECT_KEY
            st.key = None
        elif st.depth == 2 and st.in_elem and st.expect == EXPECT_VALUE:
            _start_value(st, i, IN_CONTAINER)
        st.depth += 1
        return
    if ch in "}]":
        if st.depth == 2 and st.in_elem and st.expect == IN_SCALAR:
            _end_value(st, i)
        st.depth -= 1
        if st.depth == 2 and st.in_elem and st.expect == IN_CONTAINER:
            _end_value(st, i + 1)
        elif st.depth == 1:
            if st.in_elem:
                _flush(st, calls, buf, tool_id)
                if not st.announced:
                    st.blocked = True
            st.in_elem = False
        elif st.depth <= 0:
            st.done = True
        return
    if st.depth != 2 or not st.in_elem:
        return
    if ch == ":":
        if st.expect == EXPECT_COLON:
            st.expect = EXPECT_VALUE
    elif ch == ",":
        if st.expect == IN_SCALAR:
            _end_value(st, i)
        st.expect = EXPECT_KEY
        st.key = None
    elif ch.isspace():
        if st.expect == IN_SCALAR:
            _end_value(st, i)
    elif st.expect == EXPECT_VALUE:
        _start_value(st, i, IN_SCALAR)


# -- named ------------------------------------------------------------------------------------------


def named_feed(st: RequiredScan, text: str, name: str, tool_id: ToolIdFn) -> Delta | None:
    """`extract_named_tool_call_streaming` (array index 0), except that the call is announced
    only once the output holds more than whitespace: batch makes no call of a blank output
    (`ChatParser._extract_tool_calls`), and vLLM's stream would already have sent one (issue 16,
    docs/parsers.md). The whitespace so far waits in the state and leads the call's arguments."""
    if st.named:
        return Delta(tool_calls=[ToolCallDelta(index=0, arguments=text)])
    text = st.named_ws + text
    if not text.strip():
        st.named_ws = text
        return None
    st.named_ws, st.named = "", True
    return Delta(tool_calls=[ToolCallDelta(index=0, id=tool_id(0), type="function", name=name, arguments=text)])


# -- batch --------------------------------------------------------------------------------------------

_LAX_TRUE = {"1", "on", "t", "true", "y", "yes"}
_LAX_FALSE = {"0", "off", "f", "false", "n", "no"}


def _lax_bool_or_none(value: Any) -> bool:
    """Does pydantic's lax `bool | None` accept this JSON value?"""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int) and not isinstance(value, bool):
        return value in (0, 1)
    if isinstance(value, float):
        return value in (0.0, 1.0)
    if isinstance(value, str):
        return value.strip().lower() in _LAX_TRUE | _LAX_FALSE
    return False


def required_calls(content: str | None) -> list[FunctionCall]:
    """`TypeAdapter(list[FunctionDefinition]).validate_json(content)` -> calls ([] if invalid)."""
    try:
        items = json.loads(content or "")
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        if not (item.get("description") is None or isinstance(item.get("description"), str)):
            return []
        params = item.get("parameters")
        if not (params is None or isinstance(params, dict)):
            return []
        if not (_lax_bool_or_none(item.get("strict")) and _lax_bool_or_none(item.get("defer_loading"))):
            return []
        calls.append(FunctionCall(item["name"], json.dumps(params, ensure_ascii=False)))
    return calls
