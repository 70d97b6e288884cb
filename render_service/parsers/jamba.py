"""Jamba tool parser (`jamba`): vLLM 0.33's `JambaToolParser`.

Format: `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>` (special tokens, so
`adjust_request` keeps them: skip_special_tokens=False when the request has tools and tool_choice
is not none; the tokenizer must have both, as vLLM requires). vLLM's batch reads the first closed
region as a JSON list (anything that fails, a missing close included, makes the whole text
content), keeps the text before the first `<tool_calls>` as content and drops the rest. vLLM's
stream sends content until `<tool_calls>` (dropping the text before it in the same chunk) and then
streams partial-JSON argument diffs.

Ours streams content up to the marker and holds the rest to the end of the stream
(`held_calls.CallsHolder`), where the batch extractor decides: the calls arrive whole, or the held
text goes out as content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

START = "<tool_calls>"
END = "</tool_calls>"
_REGION = re.compile(re.escape(START) + "(.*?)" + re.escape(END), re.DOTALL)


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`."""
    if START not in model_output:
        return False, [], model_output
    region = _REGION.search(model_output)
    if region is None:
        return False, [], model_output
    try:
        items: Any = json.loads(region.group(1))
        calls = []
        for item in items:
            name, args = item["name"], item["arguments"]
            if not isinstance(name, str):
                raise TypeError("name")  # vLLM's FunctionCall rejects it
            calls.append(FunctionCall(name, json.dumps(args, ensure_ascii=False)))
    except Exception:
        return False, [], model_output
    content = model_output[: model_output.find(START)]
    return True, calls, content if content and content != " " else None


_HOLDER = CallsHolder(START, extract_calls)


class JambaState(HeldCallsState, tag="jamba/1"):
    """Content up to the marker, then held (`held_calls.HeldCallsState`)."""


@register_tool_parser("jamba")
class JambaToolParser(ToolParser):
    """Stateless; per-stream data in `JambaState`. No structural tag: required/named tool_choice
    take vLLM's JSON paths (`forced.py`)."""

    version = 1
    state_type = JambaState
    holds_until_finish = True

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        if tokenizer.token_to_id(START) is None or tokenizer.token_to_id(END) is None:
            raise ValueError("Jamba Tool parser could not locate tool calls start/end tokens in the tokenizer!")

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # The tool-call markers are special tokens: keep them for the parser.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    def feed(self, st: JambaState, text: str, tool_id: ToolIdFn) -> Delta | None:
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: JambaState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: JambaState) -> str:
        return ""  # calls go out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)
