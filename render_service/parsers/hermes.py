"""Hermes tool parser (`hermes`, alias `qwen3_json`): `<tool_call>{json}</tool_call>`.

vLLM 0.33's `Hermes2ProToolParser` (`tool_parsers/hermes_tool_parser.py`). Its batch answer is
all or nothing: every `<tool_call>` region (closed, or the last one running to the end) must load
as a JSON object with a string `name` and an `arguments` key, else there are no calls and the
whole text is content; with calls, the content is the text before the first `<tool_call>` and
each call's arguments are `json.dumps(arguments, ensure_ascii=False)`.

vLLM's stream re-parses the text on every chunk and streams a region's raw argument text as it
arrives: it does not add up to that batch answer when a later region is malformed, the JSON is
not spelled as `json.dumps` spells it, or the content before the calls is only whitespace. Ours
holds instead (`held_calls`, issue 16 / docs/parsers.md "Streaming accumulates to the batch
answer"): content streams up to the first `<tool_call>` (a split tag, and content that is only
whitespace so far, held back), everything from the tag on is held, and at the end of the stream
the batch extractor decides: the calls arrive whole, or the held text as content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn, json_schema_format
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class HermesState(HeldCallsState, tag="hermes/3"):
    """Per-stream state: content before the first `<tool_call>` (held while it may still be a
    split tag or is only whitespace), then the held text from the tag on (`held_calls`)."""


@register_tool_parser("hermes", aliases=("qwen3_json",))
class HermesToolParser(ToolParser):
    """Stateless code; all per-stream data lives in `HermesState`."""

    version = 3  # 3: calls held to the end of the stream (held_calls)
    state_type = HermesState
    holds_until_finish = True
    # VLLM_ENFORCE_STRICT_TOOL_CALLING (default on) + this structural tag model: vLLM treats
    # required/named tool_choice like auto for this parser.
    structural_tag_model = "hermes"

    # -- render side ----------------------------------------------------------------------------

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # The tool-call markers are special tokens in some models: keep them for the parser.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """`_hermes_style_structural_tag(...).format` dumped: one tag per tool, with and without
        the newlines around the JSON, behind the `<tool_call>` trigger for auto."""
        formats = (
            (TOOL_CALL_START + '\n{"name": "', "}\n" + TOOL_CALL_END),
            (TOOL_CALL_START + '{"name": "', "}" + TOOL_CALL_END),
        )
        tag_list = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            for begin, finish in formats:
                tag_list.append(
                    {
                        "type": "tag",
                        "begin": begin + function["name"] + '", "arguments": ',
                        "content": json_schema_format(schema),
                        "end": finish,
                    }
                )
        if choice == "auto":
            return {
                "type": "triggered_tags",
                "triggers": [TOOL_CALL_START],
                "tags": tag_list,
                "at_least_one": False,
                "stop_after_first": False,
                "excludes": [],
            }
        return {
            "type": "tags_with_separator",
            "tags": tag_list,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": choice == "forced",
        }

    # -- streaming ------------------------------------------------------------------------------

    def feed(self, st: HermesState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Content up to the first `<tool_call>`; from there on everything is held."""
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: HermesState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The batch decision on the held text: every call whole, or all of it as content."""
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: HermesState) -> str:
        # Calls go out whole at the end: no argument text is ever left unstreamed.
        return ""

    # -- batch ----------------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """`extract_tool_calls`: (tools_called, calls, content)."""
        return extract_calls(model_output)


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`: every region or nothing."""
    if TOOL_CALL_START not in model_output:
        return False, [], model_output
    try:
        calls = []
        for match in _TOOL_CALL_RE.findall(model_output):
            obj = json.loads(match[0] if match[0] else match[1])
            name = obj["name"]
            if not isinstance(name, str):  # pydantic's FunctionCall(name: str) rejects it
                raise TypeError("tool name is not a string")
            calls.append(FunctionCall(name=name, arguments=json.dumps(obj["arguments"], ensure_ascii=False)))
    except Exception:
        return False, [], model_output
    content = model_output[: model_output.find(TOOL_CALL_START)]
    return True, calls, content or None


_HOLDER = CallsHolder(TOOL_CALL_START, extract_calls)
