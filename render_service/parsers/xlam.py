"""xLAM tool parser (`xlam`): vLLM 0.33's `xLAMToolParser`.

Format: a JSON list `[{"name": ..., "arguments": {...}}, ...]`, bare, in a code fence
(`` ```json ... ``` ``), after `[TOOL_CALLS]` (to the end of the line), in `<tool_call>...</tool_call>`,
or after `</think>`. vLLM's batch (`preprocess_model_output`) tries, in order: the text after the
first `</think>` as JSON (or its first code block that loads), keeping the text up to `</think>`
stripped as content; the first block of each pattern over the whole output that loads, keeping the
output without that pattern's blocks, stripped, as content; the whole output when it starts (after
whitespace) with `[`. Elements without `name` and `arguments` are skipped; dict arguments are
dumped, string arguments kept as they are. Anything else is content, unchanged.

vLLM's stream re-parses the whole text each chunk with chunk-dependent results that do not add up
to its batch answer. Ours (`held_calls.MarkedCallsHolder`) streams content up to the first marker
(code fence, `[TOOL_CALLS]`, `<tool_call>`, `</think>`), holding whitespace at either end, holds
everything from the marker (or from a leading `[`) to the end of the stream, and there lets the
batch extractor decide. Batch strips the content when it finds a block; the content's leading
whitespace has been sent by then, so our batch keeps it (a listed deliberate difference).
"""

from __future__ import annotations

import json
from typing import Any

import regex as re  # type: ignore[import-untyped]

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.held_calls import MarkedCallsHolder, MarkedCallsState
from render_service.parsers.protocols import ToolParser
from render_service.parsers.registry import register_tool_parser

# vLLM's patterns (the `regex` module, as vLLM compiles them: its \s is Unicode whitespace).
BLOCK_PATTERNS = [
    re.compile(r"```(?:json)?\s*([\s\S]*?)```"),
    re.compile(r"\[TOOL_CALLS\]([\s\S]*?)(?=\n|$)"),
    re.compile(r"<tool_call>([\s\S]*?)</tool_call>"),
]
THINK_END = "</think>"
THINKING = re.compile(r"</think>([\s\S]*)")
# Every batch path but the leading `[` needs one of these in the text.
MARKERS = ("```", "[TOOL_CALLS]", "<tool_call>", THINK_END)


def _loads(text: str) -> bool:
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # deeply nested model output is text too
        return False
    return True


def preprocess(model_output: str) -> tuple[str | None, str | None]:
    """vLLM's `preprocess_model_output`: (content, the JSON text of the calls or None)."""
    thinking = THINKING.search(model_output)
    if thinking:
        content = model_output[: thinking.start() + len(THINK_END)].strip()
        after = thinking.group(1).strip()
        if _loads(after):
            return content, after
        for pattern in BLOCK_PATTERNS:
            for block in pattern.findall(after):
                if _loads(block):
                    return content, block
    for pattern in BLOCK_PATTERNS:
        for block in pattern.findall(model_output):
            if _loads(block):
                return pattern.sub("", model_output).strip(), block
    if model_output.strip().startswith("["):
        if _loads(model_output):
            return None, model_output
        if "{" in model_output and "name" in model_output and "arguments" in model_output:
            return None, model_output  # then json.loads fails below: all content
    return model_output, None


def vllm_extract(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`."""
    content, calls_json = preprocess(model_output)
    if not calls_json:
        return False, [], content
    try:
        data: Any = json.loads(calls_json)
    except (json.JSONDecodeError, RecursionError):  # deeply nested model output is text too
        return False, [], model_output
    if not isinstance(data, list):
        return False, [], content or model_output
    calls: list[FunctionCall] = []
    for call in data:
        if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
            continue
        name, args = call["name"], call["arguments"]
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        if not isinstance(name, str) or not isinstance(args, str):
            return False, [], model_output  # vLLM's FunctionCall rejects it: all content
        calls.append(FunctionCall(name, args))
    return bool(calls), calls, content


_HOLDER = MarkedCallsHolder(MARKERS, "[", vllm_extract)


class XlamState(MarkedCallsState, tag="xlam/1"):
    """Content up to the first marker, then held (`held_calls.MarkedCallsState`)."""


@register_tool_parser("xlam")
class XlamToolParser(ToolParser):
    """Stateless; per-stream data in `XlamState`. No structural tag: required/named tool_choice
    take vLLM's JSON paths (`forced.py`)."""

    version = 1
    state_type = XlamState
    holds_until_finish = True

    def feed(self, st: XlamState, text: str, tool_id: ToolIdFn) -> Delta | None:
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: XlamState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: XlamState) -> str:
        return ""  # calls go out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return _HOLDER.extract_with_leading_ws(model_output)
