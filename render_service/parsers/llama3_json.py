"""Llama 3.x / 4 JSON tool parser (`llama3_json`, and `llama4_json`, an alias of the same class in
vLLM 0.33): `Llama3JsonToolParser`.

Format: the assistant turn is one or more JSON objects `{"name": ..., "parameters"|"arguments": {...}}`
separated by "; ", optionally after `<|python_tag|>`.

vLLM's batch: every `{` outside an already decoded object must start a JSON object with a `name`
and `arguments`/`parameters`; any failure returns the whole text as content, any success drops all
text around the objects (the text before the first `{` too). vLLM's stream treats the tool phase
as a call list only when it starts with `<|python_tag|>` or `{` (else every delta is content) and
streams each object's arguments as it re-parses them. The two disagree (issue 16, docs/parsers.md
"Streaming accumulates to the batch answer"):

- a list whose later object is malformed, or text after the list that holds a `{`: vLLM's stream
  has sent calls that batch rejects. Ours holds a tool phase that starts a call list to the end of
  the stream (`held_calls.LeadingCallsHolder`: the text lives in a `HeldText` segment beside the
  snapshot, so a chunk is O(new text)), where the batch extractor decides: the calls arrive whole,
  or the text as content (ACC.md rule 1).
- content before the first `{`: vLLM's batch drops it and makes calls of the objects after it,
  which only the end of the output decides; a stream could match that only by holding the whole
  response's content. Our batch follows the stream's rule instead (ACC.md rule 2, a deliberate
  difference from vLLM's batch, `tests/parsers/deliberate.py`): a tool phase that does not start
  with `<|python_tag|>` or `{` is content, whatever it holds.
"""

from __future__ import annotations

import json
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn, json_schema_format
from render_service.parsers.held_calls import LeadingCallsHolder, LeadingCallsState
from render_service.parsers.protocols import ToolParser
from render_service.parsers.registry import register_tool_parser

BOT_TOKEN = "<|python_tag|>"

_DECODER = json.JSONDecoder()

TOOL_NAME_PREFIX = '{"name": "'
PARAMETERS_PREFIX = '", "parameters": '
TRIGGER = '{"name": '
THINK_EXCLUDES = ["<think>", "</think>"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def starts_call_list(text: str) -> bool:
    """vLLM's stream reads the tool phase as a call list when it starts so (no whitespace skipped)."""
    return text.startswith((BOT_TOKEN, "{"))


def _may_start(text: str) -> bool:
    """Nothing yet, or a proper prefix of the bot token (spelled as text, it may still come)."""
    return len(text) < len(BOT_TOKEN) and BOT_TOKEN.startswith(text)


class Llama3JsonState(LeadingCallsState, tag="llama3_json/2"):
    """The tool phase: undecided, content, or held (`held_calls.LeadingCallsState`)."""


@register_tool_parser("llama3_json", aliases=("llama4_json",))
class Llama3JsonToolParser(ToolParser):
    """Stateless; per-stream data in `Llama3JsonState`."""

    version = 2  # 2: calls held to the end of the stream, batch follows the stream's start rule
    state_type = Llama3JsonState
    holds_until_finish = True
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
        """Content, unless the tool phase starts a call list: then everything is held."""
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: Llama3JsonState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The batch decision on a held call list: every call whole, or all of it as content."""
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: Llama3JsonState) -> str:
        # Calls go out whole at the end: no argument text is ever left unstreamed.
        return ""

    # -- batch --------------------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`, behind the stream's start rule (see the module doc)."""
    if not starts_call_list(model_output):
        # vLLM would still read objects after the content (dropping it): deliberately not.
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


_HOLDER = LeadingCallsHolder(starts_call_list, _may_start, extract_calls)
