"""Granite 3.x tool parser (`granite`): vLLM 0.33's `GraniteEngineToolParser`, the parser-engine
adapter over `GraniteParser` (`parser/granite.py`).

Format: `<|tool_call|>` (one special token, Granite 3.0) or the text `<tool_call>` (3.1), then a
JSON array `[{"name": ..., "arguments": {...}}, ...]` with no closing marker; prose around it is
content. The engine (`engine.py`, `tool_call_body_array`) splits the array into one call per
element, names each call from the element's `"name"` and converts the verbatim `arguments` object
(`arguments_span`). There is no structural tag model, so tool_choice required/named take vLLM's
JSON paths (`forced.py`). Granite has no reasoning here (the `granite` reasoning parser is a
separate, text-based family).

vLLM's stream sends the arguments by prefix as they arrive and the text after the array; its batch
fixes argument types against the tool schema, strips the content and drops the text after the
calls, and behind the granite reasoning parser returns the raw content when no call is accepted.
Ours accumulates to the batch answer (issue 16): each call goes out whole once its element closes
or the output ends (`calls_whole`, the engine's `WholeCallsState`: held text beside the snapshot),
the text after the array is held until a call drops it, and behind the granite reasoning parser
the raw-content shadow (`raw_content.py`) keeps the raw text until a call is accepted.
"""

from __future__ import annotations

from render_service.parsers.engine import (
    CONTENT,
    JSON_TOKENS,
    TOOL_ARGS,
    EngineConfig,
    EngineToolParser,
    Transition,
    WholeCallsState,
)
from render_service.parsers.registry import register_tool_parser

TOOL_TOKEN = "<|tool_call|>"  # Granite 3.0: one special token
TOOL_STRING = "<tool_call>"  # Granite 3.1: plain text
JSON_WS = " \t\r\n"


def _object_end(raw: str, start: int) -> int | None:
    """End (exclusive) of the JSON object at `raw[start]` ("{"), or None while unterminated
    (braces only, strings skipped: vLLM's `scan_json_object_end`)."""
    depth = 0
    for m in JSON_TOKENS.finditer(raw, start):
        c = raw[m.start()]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return m.end()
    return None


def member_object(raw: str, key: str) -> str | None:
    """vLLM's `extract_json_member_object`: the verbatim text of the top-level member `key`'s
    object value in a (possibly unterminated) `{...}`: a prefix of it while it is open, None
    before it starts. ValueError when the member is not an object. Strings are skipped whole
    by one regex (the element is re-read on every chunk, so this must not loop per character)."""
    depth = 0
    last_string: str | None = None
    for m in JSON_TOKENS.finditer(raw):
        c = raw[m.start()]
        if c == '"':
            if m.group(2) is not None and depth == 1:
                last_string = m.group(1)
        elif c == ":":
            if depth == 1 and last_string == key:
                start = m.end()
                while start < len(raw) and raw[start] in JSON_WS:
                    start += 1
                if start >= len(raw):
                    return None
                if raw[start] != "{":
                    raise ValueError(f"member {key!r} must be a JSON object")
                end = _object_end(raw, start)
                return raw[start:] if end is None else raw[start:end]
        elif c in "{[":
            depth += 1
        else:
            depth -= 1
    return None


def arguments_span(raw_args: str, partial: bool) -> str:
    """`_granite_arg_converter`: the element's `arguments` object text."""
    span = member_object(raw_args, "arguments")
    if span is None:
        return "" if partial else "{}"
    return span


GRANITE_CONFIG = EngineConfig(
    name="granite",
    terminals={"TOOL_TOKEN": TOOL_TOKEN, "TOOL_STRING": TOOL_STRING},
    token_id_terminals={"TOOL_TOKEN": TOOL_TOKEN},
    # The marker only opens the tool region; the array splitter starts one call per element.
    transitions={
        (CONTENT, "TOOL_TOKEN"): Transition(TOOL_ARGS),
        (CONTENT, "TOOL_STRING"): Transition(TOOL_ARGS),
    },
    arg_converter=arguments_span,
    tool_call_body_array=True,
    stream_arg_deltas=True,
    verbatim_json_args=True,
)


class GraniteState(WholeCallsState, tag="granite/2"):
    """The engine's stream, each call held until batch's decision about it is known."""


@register_tool_parser("granite")
class GraniteToolParser(EngineToolParser):
    version = 2  # 2: each call sent whole, the stream accumulates to the batch answer
    calls_whole = True
    state_type = GraniteState
    config = GRANITE_CONFIG
