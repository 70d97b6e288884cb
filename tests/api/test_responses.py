"""Responses input items -> chat messages, and the request checks render runs first."""

from __future__ import annotations

import pytest

from render_service.api import responses
from render_service.exceptions import BadRequestError, RequestValidationError


def test_reasoning_and_calls_merge_into_one_assistant_message() -> None:
    body = {
        "instructions": "Sys.",
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "two"}]},
            {"type": "function_call", "call_id": "a", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "w", "arguments": "{}", "namespace": "ns"},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "custom_tool_call", "call_id": "c", "name": "sh", "input": "ls é"},
        ],
    }
    out = responses.input_messages(body)
    assert out[0] == {"role": "system", "content": "Sys."}
    assistant = out[2]
    assert assistant["reasoning"] == "two"
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["w", "ns__w"]
    assert out[3] == {"role": "tool", "content": "1", "tool_call_id": "a"}
    assert out[4]["tool_calls"][0]["function"]["arguments"] == '{"input": "ls é"}'


def test_partial_assistant_message_is_continued() -> None:
    assert responses._continue_final(
        [
            {"role": "user", "content": "x"},
            {
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [{"type": "output_text", "text": "Hi"}],
            },
        ]
    )
    assert not responses._continue_final("text")
    assert not responses._continue_final(
        [{"type": "function_call_output", "call_id": "a", "output": "", "status": "incomplete"}]
    )


@pytest.mark.parametrize(
    "body, error, param",
    [
        ({"input": None}, RequestValidationError, "body.input"),
        ({"input": [{"type": "web_search_call", "id": "w"}]}, RequestValidationError, "body.input"),
        ({"input": "x", "prompt": {"id": "p"}}, BadRequestError, "prompt"),
        ({"input": "x", "background": True, "store": False}, BadRequestError, "background"),
        ({"input": "x", "presence_penalty": -3}, RequestValidationError, "body.presence_penalty"),
    ],
)
def test_request_checks(body: dict, error: type, param: str) -> None:
    with pytest.raises(error) as info:
        responses.validate_responses_request(body)
    assert info.value.param == param


def test_encrypted_reasoning_refused() -> None:
    with pytest.raises(BadRequestError, match="Encrypted content"):
        responses.input_messages({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]})


@pytest.mark.parametrize(
    "item",
    [
        {"type": "function_call", "call_id": "a", "name": "w"},
        {"role": "user", "content": [1]},
    ],
)
def test_malformed_items_fail_the_input_union(item: dict) -> None:
    with pytest.raises(RequestValidationError) as info:
        responses.validate_responses_request({"input": [item]})
    assert info.value.param == "body.input"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        # the union admits them as openai's TypedDict (lazy `Iterable` parts); vLLM then refuses the dict
        ({"type": "reasoning", "summary": ["not a part"]}, "Unsupported input item type: reasoning"),
        ({"type": "reasoning", "summary": [], "content": [1]}, "Unsupported input item type: reasoning"),
        # vLLM fails with an IndexError (a 500); ours is a 400
        ({"type": "message", "role": "assistant", "content": []}, "at least one content part"),
    ],
)
def test_items_the_union_admits_but_vllm_refuses(item: dict, message: str) -> None:
    body = {"input": [item]}
    responses.validate_responses_request(body)
    with pytest.raises(BadRequestError, match=message):
        responses.input_messages(body)
