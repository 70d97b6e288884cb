"""Bad bodies for the union-typed fields (tests/api/golden/unions.json): chat `messages` (chat
render and /tokenize) and the Responses `input`, `tools`, `tool_choice` and `text`, whose errors
vLLM lists for every member of openai's unions. Recorded from vLLM 0.33 by
`python -m tests.api.record_unions`; compared by test_unions.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "golden" / "unions.json"
CHAT = "/v1/chat/completions/render"
TOKENIZE = "/tokenize"
RESPONSES = "/v1/responses/render"

HI = {"role": "user", "content": "Hi"}

BAD_MESSAGES: list[Any] = [
    5,
    "x",
    [5],
    [{}],
    [{"role": "user"}],
    [{"content": "x"}],
    [{"role": "bogus", "content": "x"}],
    [{"role": 5, "content": "x"}],
    [{"role": "user", "content": 5}],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": "x", "name": 5}],
    [{"role": "system", "content": [5]}],
    [{"role": "assistant", "content": "x", "tool_calls": 5}],
    [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": 5}}]}],
    [{"role": "tool", "content": "x"}],
    [{"role": "tool", "content": "x", "tool_call_id": 5}],
    [{"role": "developer", "content": {"a": 1}}],
    [{"role": "function", "content": "x"}],
    [HI, {"role": "user", "content": 1.5}, {"role": "nope"}],
    [{"role": "user", "content": "x", "reasoning": 5}],
]

BAD_INPUT: list[Any] = [
    5,
    None,
    {},
    [5],
    [{}],
    ["x"],
    [{"role": "user"}],
    [{"role": "bogus", "content": "x"}],
    [{"type": "message", "role": "user", "content": 5}],
    [{"type": "function_call", "name": "f"}],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}],
    [{"type": "function_call_output", "call_id": "c"}],
    [{"type": "reasoning"}],
    [{"type": "reasoning", "summary": "x"}],
    [{"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}],
    [{"type": "message", "role": "assistant", "content": 5}],
    [{"type": "bogus"}],
    [HI, {"role": "user", "content": [{"type": "input_text", "text": 5}]}],
    [{"type": "reasoning", "summary": ["not a part"]}],
    [{"type": "reasoning", "summary": [], "content": [1]}],
    [{"type": "function_call", "call_id": "a", "name": "w"}],
    [{"role": "user", "content": [1]}],
    [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}, HI],
    [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}, HI],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, HI],
]

BAD_TOOLS: list[Any] = [
    5,
    "x",
    [5],
    [{}],
    [{"type": "function"}],
    [{"type": "function", "name": 5}],
    [{"type": "function", "name": "f", "parameters": 5}],
    [{"type": "bogus"}],
    [{"type": "custom"}],
    [{"type": "web_search", "search_context_size": "huge"}],
]

BAD_TOOL_CHOICE: list[Any] = [
    5,
    "x",
    None,
    [],
    {},
    {"type": "function"},
    {"type": "function", "name": 5},
    {"type": "bogus"},
    {"type": "allowed_tools", "mode": "auto"},
]

BAD_TEXT: list[Any] = [
    5,
    "x",
    [],
    {"format": 5},
    {"format": {}},
    {"format": {"type": "bogus"}},
    {"format": {"type": "json_schema"}},
    {"format": {"type": "json_schema", "name": "n", "schema": 5}},
    {"verbosity": "loud"},
]


def cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for messages in BAD_MESSAGES:
        out.append({"path": CHAT, "body": {"model": "tinyqwen3", "messages": messages}})
        out.append({"path": TOKENIZE, "body": {"model": "tinyqwen3", "messages": messages}})
    out.append({"path": CHAT, "body": {"messages": [{"role": "bogus"}], "max_tokens": "x", "temperature": "y"}})
    for value in BAD_INPUT:
        out.append({"path": RESPONSES, "body": {"model": "tinyqwen3", "input": value}})
    for name, values in (("tools", BAD_TOOLS), ("tool_choice", BAD_TOOL_CHOICE), ("text", BAD_TEXT)):
        for value in values:
            out.append({"path": RESPONSES, "body": {"model": "tinyqwen3", "input": "Hi", name: value}})
    out.append({"path": RESPONSES, "body": {"input": [5], "tools": [5], "tool_choice": 5, "text": 5}})
    return out


# Where ours still differs from vLLM (every one a 4xx on our side), with the reason:
KNOWN_DIFFERENT: dict[str, str] = {
    # vLLM reads `tool_calls` and content parts lazily (`Iterable`) and reports them as they are
    # read; ours stands in with the first error (render.pipeline.check_messages)
    '[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": 5}}]}]': "lazy",
    '[{"role": "developer", "content": {"a": 1}}]': "lazy",
    # vLLM's before validators iterate or size the raw value first (a TypeError, answered as a 400
    # with Python's message); ours is the schema error
    "5": "TypeError in a vLLM validator",
    '[{"role": "assistant", "content": "x", "tool_calls": 5}]': "TypeError in a vLLM validator",
    # vLLM's own message type admits a message without content (and any role); check_messages
    # refuses it (ours needs content to render)
    '[{"role": "user"}]': "content required",
    '[{"role": "bogus"}]': "content required",
}


def known_different(case: dict[str, Any]) -> str | None:
    body = case["body"]
    if "messages" in body:
        return KNOWN_DIFFERENT.get(json.dumps(body["messages"]))
    if body.get("tools") == 5:
        return "TypeError in a vLLM validator"
    return None


def request(case: dict[str, Any]) -> dict[str, Any]:
    headers = {} if case["path"] == RESPONSES else {"X-Request-Id": "unions"}
    return {"method": "POST", "path": case["path"], "headers": headers, "json": case["body"]}
