"""InternLM2 tool parser (`internlm`): vLLM 0.33's `Internlm2ToolParser`.

Format: `<|action_start|><|plugin|>` (special tokens, so `adjust_request` keeps them:
skip_special_tokens=False when the request has tools and tool_choice is not none), then one JSON
object `{"name": ..., "parameters"|"arguments": {...}}`, then `<|action_end|>`. vLLM's batch keeps
the text before the marker as content, reads the object from its first `{` up to `<|action_end|>`
(one call; the text after it is dropped); it raises (an error response) when the object does not
load, has no string name, or the marker comes twice. vLLM's stream sends content until it sees
`<|action_start|>` and then streams the arguments by re-dumping partial JSON.

Ours streams content up to the first `<|action_start|>` and holds the rest, with the content of
the chunk that brought it (vLLM's stream sends that content only later), to the end of the stream
(`held_calls.CallsHolder`), where the batch extractor decides: the call arrives whole, or (where
vLLM raises: a listed deliberate difference) the held text goes out as content.
"""

from __future__ import annotations

import json
from typing import Any

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

ACTION_START = "<|action_start|>"
MARKER = ACTION_START + "<|plugin|>"
END = "<|action_end|>"


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch; where it raises, no calls (the whole text is content)."""
    pos = model_output.find(MARKER)
    if pos == -1 or model_output.find(MARKER, pos + 1) != -1:
        return False, [], model_output  # vLLM: no marker, content; twice, ValueError
    action = model_output[pos + len(MARKER) :].split(END)[0]
    action = action[action.find("{") :]  # vLLM's slice: from the last character when there is no "{"
    try:
        obj: Any = json.loads(action)
        name = obj["name"]
        args = obj.get("parameters", obj.get("arguments", {}))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return False, [], model_output  # vLLM raises
    if not isinstance(name, str):
        return False, [], model_output  # vLLM's FunctionCall raises
    before = model_output[:pos]
    return True, [FunctionCall(name, json.dumps(args, ensure_ascii=False))], before or None


# Held from the first <|action_start|>, with its chunk's content: vLLM's stream sends nothing from
# there until <|action_start|><|plugin|> (then the content before it); batch decides on the rest.
_HOLDER = CallsHolder(ACTION_START, extract_calls, holds_marker_chunk=True)


class InternlmState(HeldCallsState, tag="internlm/1"):
    """Content up to the marker, then held (`held_calls.HeldCallsState`)."""


@register_tool_parser("internlm")
class InternlmToolParser(ToolParser):
    """Stateless; per-stream data in `InternlmState`. No structural tag: required/named
    tool_choice take vLLM's JSON paths (`forced.py`)."""

    version = 1
    state_type = InternlmState
    holds_until_finish = True

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # The action markers are special tokens: keep them for the parser.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    def feed(self, st: InternlmState, text: str, tool_id: ToolIdFn) -> Delta | None:
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: InternlmState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: InternlmState) -> str:
        return ""  # the call goes out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)
