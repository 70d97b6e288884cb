"""Phi-4-mini JSON tool parser (`phi4_mini_json`): vLLM 0.33's `Phi4MiniJsonToolParser`.

Format: `functools[{"name": ..., "arguments"|"parameters": {...}}, ...]` (`functools` is plain
text, not a token). vLLM's batch takes the first `functools[` and the text up to the first `]`
after it, loads it as a JSON list, and makes a call of each element; it drops all other text when
the marker is there (a list that does not load gives no calls and no content; an element without
a string name or arguments makes the whole text content). vLLM's stream sends nothing at all.

Ours streams the content up to the marker and holds everything from it on to the end of the
stream (`held_calls.CallsHolder`), where the batch extractor decides: the calls arrive whole, or
the held text goes out as content. The content before the marker has gone out by then, so our
batch keeps it too (ACC.md rule 2, a listed deliberate difference: vLLM's batch drops it, which
only the end of the output decides); blank content before the calls is dropped, as batch's is.
"""

from __future__ import annotations

import json
from typing import Any

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import ToolParser
from render_service.parsers.registry import register_tool_parser

MARKER = "functools["


def extract_held(text: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch on text that starts with the marker (`functools\\[(.*?)\\]`, DOTALL)."""
    end = text.find("]", len(MARKER))
    if end == -1:
        return False, [], text
    try:
        items = json.loads("[" + text[len(MARKER) : end] + "]")
    except json.JSONDecodeError:
        return True, [], None  # vLLM logs the error and makes no calls (and no content)
    calls: list[FunctionCall] = []
    try:
        for item in items:
            args: Any = item["arguments"] if "arguments" in item else item["parameters"]
            if not isinstance(item["name"], str):
                raise TypeError("name")  # vLLM's FunctionCall rejects it
            calls.append(FunctionCall(item["name"], json.dumps(args, ensure_ascii=False)))
    except Exception:
        return False, [], text
    return True, calls, None


_HOLDER = CallsHolder(MARKER, extract_held)


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """Our batch: vLLM's from the first marker on; the text before it stays content (non-blank)."""
    pos = model_output.find(MARKER)
    if pos == -1:
        return False, [], model_output
    called, calls, _ = extract_held(model_output[pos:])
    if not called:
        return False, [], model_output
    before = model_output[:pos]
    return True, calls, before if before.strip() else None


class Phi4MiniJsonState(HeldCallsState, tag="phi4_mini_json/1"):
    """Content up to the marker, then held (`held_calls.HeldCallsState`)."""


@register_tool_parser("phi4_mini_json")
class Phi4MiniJsonToolParser(ToolParser):
    """Stateless; per-stream data in `Phi4MiniJsonState`. No structural tag: required/named
    tool_choice take vLLM's JSON paths (`forced.py`)."""

    version = 1
    state_type = Phi4MiniJsonState
    holds_until_finish = True

    def feed(self, st: Phi4MiniJsonState, text: str, tool_id: ToolIdFn) -> Delta | None:
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: Phi4MiniJsonState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: Phi4MiniJsonState) -> str:
        return ""  # calls go out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)
