"""Granite 4 tool parser (`granite4`): vLLM 0.33's `Granite4ToolParser`.

Format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the text;
text outside them is content. Streaming emits each call whole (name and arguments in one delta)
once its `</tool_call>` has arrived; text that may still become `<tool_call>` is held back, and
everything from `<tool_call>` on is buffered until the end tag (so the state holds at most one
call's text plus a tag prefix).

Kept exactly as vLLM behaves, quirks included:
- after a start and an end tag arrive in the same buffer, vLLM's `in_tc` flag stays set (it
  clears a different attribute), so content that precedes the next `<tool_call>` in the same
  buffer is dropped;
- a call whose JSON does not parse, is not an object, or has no `name`/`arguments` key loses the
  whole chunk's output; a missing key additionally breaks every later chunk (vLLM's bookkeeping
  assertion fails from then on);
- an unterminated call is never flushed in streaming; in batch it makes the whole text content.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from render_service.parsers.base import Delta, FunctionCall, ToolCallDelta, ToolIdFn
from render_service.parsers.held import HeldText
from render_service.parsers.protocols import ParserState, RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

TC_START = "<tool_call>"
TC_END = "</tool_call>"


def _partial_start(text: str) -> tuple[int, bool]:
    """`regex.search("<tool_call>", text, partial=True)`: (position, complete) of the first full
    match or of a tag prefix running to the end of `text`; (-1, False) when neither."""
    i = text.find("<")
    while i != -1:
        tail = text[i : i + len(TC_START)]
        if tail == TC_START:
            return i, True
        if TC_START.startswith(tail):  # runs to the end of the text
            return i, False
        i = text.find("<", i + 1)
    return -1, False


def _args_text(args: Any) -> str | None:
    """vLLM's `dump_args`."""
    if args is None or isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False)


class Granite4State(ParserState, tag="granite4/2"):
    """`look_ahead` + `held`: vLLM's buffer (a tag prefix, or a call from `<tool_call>` on);
    `held` is the tail of a buffered call that came while its end tag had not (held text, which
    snapshots keep beside the state; `_release_held` joins it to `look_ahead`). `in_tc`: vLLM's
    flag; `calls`: calls emitted; `broken`: vLLM's bookkeeping assertion now fails on every chunk."""

    look_ahead: str = ""
    in_tc: bool = False
    calls: int = 0
    broken: bool = False
    held: HeldText = msgspec.field(default_factory=HeldText)


class _CallError(Exception):
    def __init__(self, appended: int) -> None:
        self.appended = appended  # calls vLLM appended to prev_tool_call_arr before failing


def _collect(segments: list[str]) -> list[tuple[str, str | None]]:
    """`_collect_results`: every segment must load; then each is appended before its keys are read."""
    loaded = [json.loads(s) for s in segments]
    out: list[tuple[str, str | None]] = []
    for n, tc in enumerate(loaded):
        if not isinstance(tc, dict):
            raise _CallError(n)
        try:
            name, args = tc["name"], _args_text(tc["arguments"])
        except KeyError:
            raise _CallError(n + 1) from None
        if not isinstance(name, str):  # pydantic rejects it after the append
            raise _CallError(n + 1)
        out.append((name, args))
    return out


@register_tool_parser("granite4")
class Granite4ToolParser(ToolParser):
    """Stateless; per-stream data in `Granite4State`. No structural tag model, so vLLM's JSON
    paths serve tool_choice required/named (`forced.py`)."""

    version = 2  # state: held text (2)
    state_type = Granite4State

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # The tool-call markers are special tokens in some models: keep them for the parser.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    def _step(self, st: Granite4State, text: str) -> tuple[bool, str, str]:
        """`_tool_extraction_step`: (done, content, tool text); updates look_ahead / in_tc."""
        start, complete = _partial_start(text)
        end = text.find(TC_END)
        if not complete:
            if start >= 0:
                st.look_ahead = text[start:]
                return True, text[:start], ""
            return True, text, ""
        start_end = start + len(TC_START)
        if not st.in_tc:
            st.in_tc = True
            if end > 0:  # vLLM leaves in_tc set here
                st.look_ahead = text[end + len(TC_END) :]
                return False, text[:start], text[start_end:end]
            st.look_ahead = text[start:]
            return True, text[:start], ""
        if end < 0:
            st.look_ahead = text
            return True, "", ""
        st.in_tc = False
        st.look_ahead = text[end + len(TC_END) :]
        return False, "", text[start_end:end]

    def feed(self, st: Granite4State, text: str, tool_id: ToolIdFn) -> Delta | None:
        if st.in_tc and st.look_ahead.startswith(TC_START):
            buffered_tail = (st.look_ahead[1 - len(TC_END) :] + st.held.tail(len(TC_END) - 1))[1 - len(TC_END) :]
            if TC_END not in buffered_tail + text:
                # A call is being buffered and its end tag has not arrived: vLLM's step finds the
                # start tag at 0 and no end tag, keeps the buffer and returns nothing. Checking
                # the new text (plus the tag prefix it may complete) is enough; no re-scan.
                st.held.append(text)
                return None
        self._release_held(st)
        content_parts: list[str] = []
        segments: list[str] = []
        done = False
        while not done:
            buffer = st.look_ahead + text
            st.look_ahead = ""
            done, content, tc_text = self._step(st, buffer)
            if content:
                content_parts.append(content)
            if tc_text:
                segments.append(tc_text)
            text = ""
        if st.broken:
            return None
        try:
            calls = _collect(segments)
        except _CallError as err:
            if err.appended:
                st.broken = True
            return None
        except ValueError:  # json.loads
            return None
        deltas = []
        for name, args in calls:
            deltas.append(
                ToolCallDelta(index=st.calls, id=tool_id(st.calls), type="function", name=name, arguments=args)
            )
            st.calls += 1
        content = "".join(content_parts)
        if content or deltas:
            return Delta(content=content or None, tool_calls=deltas)
        return None

    @staticmethod
    def _release_held(st: Granite4State) -> None:
        """Join the held text to `look_ahead`: every read of the buffer but the fast path's needs it."""
        if st.held:
            st.look_ahead += st.held.text()
            st.held = HeldText()

    def remaining_args(self, st: Granite4State) -> str:
        # Calls are streamed whole: nothing parsed is ever left unstreamed.
        return ""

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """Batch `extract_tool_calls`: (tools_called, calls, content)."""
        texts: list[str] = []
        segments: list[str] = []
        in_tc = False
        cut = 0
        pos = 0
        try:
            while True:
                s = model_output.find(TC_START, pos)
                e = model_output.find(TC_END, pos)
                if s == -1 and e == -1:
                    break
                if e == -1 or (s != -1 and s < e):
                    if in_tc:
                        raise ValueError("two tool call starts in a row")
                    if model_output[cut:s]:
                        texts.append(model_output[cut:s])
                    in_tc = True
                    cut = pos = s + len(TC_START)
                else:
                    if not in_tc:
                        raise ValueError("tool call end without a start")
                    if not model_output[cut:e]:
                        raise ValueError("empty tool call")
                    segments.append(model_output[cut:e])
                    in_tc = False
                    cut = pos = e + len(TC_END)
            if in_tc:
                raise ValueError("incomplete tool call")
            if model_output[cut:]:
                texts.append(model_output[cut:])
            calls = _collect(segments)
            if any(args is None for _, args in calls):
                raise ValueError("FunctionCall.arguments must be a string")
        except (ValueError, _CallError):
            return False, [], model_output
        return bool(calls), [FunctionCall(n, a) for n, a in calls], "".join(texts) or None  # type: ignore[arg-type]
