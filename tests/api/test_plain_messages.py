"""`requests.plain_message`: the messages whose validation skips vLLM's message union must be
exactly ones the union takes unchanged (same object back, no error), whatever else they hold."""

from __future__ import annotations

import itertools
import random
from typing import Any

from render_service.api import generated
from render_service.api.requests import plain_message, validate_chat_request
from render_service.api.schema import INVALID

ABSENT = object()
ROLES = ["system", "developer", "user", "assistant", "tool", "function", "custom", "", None, 3, ["user"]]
VALUES: list[Any] = [ABSENT, None, "", "text", 0, 1.5, True, [], [{"type": "text", "text": "x"}], {}, {"a": 1}]
FIELDS = ["content", "name", "tool_calls", "tool_call_id", "audio", "function_call", "refusal", "reasoning"]


def _message(rng: random.Random) -> Any:
    if rng.random() < 0.03:
        return rng.choice([None, "user", 3, ["role"]])
    message: dict[str, Any] = {}
    role = rng.choice(ROLES)
    if role is not None or rng.random() < 0.5:
        message["role"] = role
    for name in FIELDS:
        value = rng.choice(VALUES)
        if value is not ABSENT:
            message[name] = value
    return message


def test_plain_messages_are_what_the_union_takes_unchanged() -> None:
    union = generated.field_type("chat.messages").item
    rng = random.Random(20261201)
    plain = 0
    for _ in range(20000):
        message = _message(rng)
        if not plain_message(message):
            continue
        plain += 1
        errors: list[Any] = []
        result = union.check(message, ("body", "messages", 0), errors)
        assert result is message and not errors, message
    assert plain > 200  # the corpus reaches the fast path often


def test_every_role_and_content_shape_agrees() -> None:
    """The shapes chats are made of, exhaustively: plain ones pass the union unchanged."""
    union = generated.field_type("chat.messages").item
    for role, content, calls, call_id in itertools.product(
        ["system", "developer", "user", "assistant", "tool"],
        [ABSENT, None, "hi", [{"type": "text", "text": "hi"}]],
        [ABSENT, None, [], [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]],
        [ABSENT, None, "c1"],
    ):
        message: dict[str, Any] = {"role": role}
        for key, value in (("content", content), ("tool_calls", calls), ("tool_call_id", call_id)):
            if value is not ABSENT:
                message[key] = value
        if plain_message(message):
            errors: list[Any] = []
            assert union.check(message, ("body", "messages", 0), errors) is message and not errors, message


def test_a_request_with_a_non_plain_message_keeps_the_unions_errors() -> None:
    """One message off the fast path sends the whole list through the union: its errors stay vLLM's."""
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 5}], "model": "m"}
    try:
        validate_chat_request(body)
    except Exception as exc:  # the union's report, every member's error
        assert "body.messages.1" in str(exc)
    else:  # pragma: no cover - the request is invalid
        raise AssertionError("an int content must fail validation")
    assert generated.field_type("chat.messages").check(body["messages"], ("body", "messages"), []) is INVALID
