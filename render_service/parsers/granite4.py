"""Granite 4 tool parser (`granite4`): vLLM 0.33's `Granite4ToolParser`.

Format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the text;
text outside them is content. Batch is all or nothing: every block must be closed, non-empty and
load as an object with `name` and `arguments` (and no `</tool_call>` may come without its start),
else the whole text is content; with calls, the content is the text outside the blocks.

vLLM's stream emits each call once its end tag arrives and never flushes an unterminated one, so it
does not add up to that batch answer when a later block fails or never closes. Ours holds instead
(`held_calls`, docs/parsers.md "Streaming accumulates to the batch answer"): content streams up to
the first `<tool_call>` (a split tag, and content that is only whitespace so far, held back; a
`</tool_call>` before it makes everything content, as batch does), everything from the tag on is
held, and at the end of the stream the batch extractor decides: the calls arrive whole (with the
content between and after them), or the held text as content.
"""

from __future__ import annotations

import json
from typing import Any

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

TC_START = "<tool_call>"
TC_END = "</tool_call>"


def _args_text(args: Any) -> str | None:
    """vLLM's `dump_args`."""
    if args is None or isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False)


class Granite4State(HeldCallsState, tag="granite4/3"):
    """Content before the first `<tool_call>`, then the held text from it on (`held_calls`)."""


def _collect(segments: list[str]) -> list[tuple[str, str | None]]:
    """`_collect_results`: every segment must load as an object with `name` and `arguments`
    (ValueError otherwise)."""
    out: list[tuple[str, str | None]] = []
    for tc in [json.loads(s) for s in segments]:
        if not isinstance(tc, dict) or "name" not in tc or "arguments" not in tc:
            raise ValueError("not a tool call object")
        if not isinstance(tc["name"], str):  # pydantic rejects it
            raise ValueError("tool name is not a string")
        out.append((tc["name"], _args_text(tc["arguments"])))
    return out


@register_tool_parser("granite4")
class Granite4ToolParser(ToolParser):
    """Stateless; per-stream data in `Granite4State`. No structural tag model, so vLLM's JSON
    paths serve tool_choice required/named (`forced.py`)."""

    version = 3  # state: held text (2); calls held to the end of the stream (3)
    state_type = Granite4State
    holds_until_finish = True

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # The tool-call markers are special tokens in some models: keep them for the parser.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    def feed(self, st: Granite4State, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Content up to the first `<tool_call>`; from there on everything is held."""
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: Granite4State, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The batch decision on the held text: every call whole, or all of it as content."""
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: Granite4State) -> str:
        # Calls go out whole at the end: nothing parsed is ever left unstreamed.
        return ""

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """Batch `extract_tool_calls`: (tools_called, calls, content)."""
        return extract_calls(model_output)


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`: every block or nothing."""
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
    except ValueError:
        return False, [], model_output
    return bool(calls), [FunctionCall(n, a) for n, a in calls], "".join(texts) or None  # type: ignore[arg-type]


_HOLDER = CallsHolder(TC_START, extract_calls, poison=TC_END)
