"""Anthropic Messages conversion: the pieces the parity goldens cannot isolate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from render_service.api import messages
from render_service.exceptions import BadRequestError, RequestValidationError
from render_service.model.loader import load_model
from render_service.render.pipeline import RenderContext
from render_service.settings import Settings

SYSTEM_FIRST = (Path(__file__).parents[1] / "parity" / "templates" / "system_first.jinja").read_text()
DEFAULTS = messages.MessagesDefaults(merge_inline_system=False, disabled_thinking_effort="none")


def request(**extra: object) -> dict:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
    body.update(extra)
    messages.validate_messages_request(body)
    return body


def test_inline_system_merge_detection(qwen3_model_dir: Path) -> None:
    qwen3 = (qwen3_model_dir / "tokenizer_config.json").read_text()
    assert messages.merge_inline_system(json.loads(qwen3)["chat_template"]) is False
    assert messages.merge_inline_system(SYSTEM_FIRST) is True  # raise_exception is undefined in the probe
    assert messages.merge_inline_system(None) is True
    assert messages.merge_inline_system("{% for %}") is True


def test_inline_system_messages_merged_into_the_leading_one() -> None:
    body = request(
        system="Top. ",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": "Late."},
            {"role": "user", "content": "Bye"},
        ],
    )
    merged = messages.to_chat_request(body, messages.MessagesDefaults(True, "none"))["messages"]
    assert merged == [
        {"role": "system", "content": "Top. Late."},
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": "Bye"},
    ]
    kept = messages.to_chat_request(body, DEFAULTS)["messages"]
    assert [m["role"] for m in kept] == ["system", "user", "system", "user"]


def test_tool_use_arguments_are_python_json_and_schema_type_appended() -> None:
    body = request(
        tools=[{"name": "t", "input_schema": {"properties": {"a": {"type": "string"}}}}],
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "t", "input": {"a": "Oslö"}}]},
        ],
    )
    chat = messages.to_chat_request(body, DEFAULTS)
    call = chat["messages"][1]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"a": "Osl\\u00f6"}'  # json.dumps: ASCII escapes, ": " separators
    assert list(chat["tools"][0]["function"]["parameters"]) == ["properties", "type"]
    assert chat["tool_choice"] == "auto"


def test_tool_additions_and_removals_resolve_in_order() -> None:
    weather = {"name": "weather", "input_schema": {"type": "object"}, "defer_loading": True}
    change = {
        "role": "system",
        "content": [
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "weather"}},
            {
                "type": "tool_addition",
                "tool": {"type": "tool_definition", "definition": {"name": "ping", "input_schema": {"type": "object"}}},
            },
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "ping"}},
        ],
    }
    body = request(tools=[weather], messages=[change, {"role": "user", "content": "Hi"}])
    tools = messages.to_chat_request(body, DEFAULTS)["tools"]
    assert [t["function"]["name"] for t in tools] == ["weather"]
    assert tools[0]["function"]["defer_loading"] is None
    body = request(
        tools=[weather],
        messages=[
            {
                "role": "system",
                "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "nope"}}],
            }
        ],
    )
    with pytest.raises(BadRequestError, match="not declared in tools"):
        messages.to_chat_request(body, DEFAULTS)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "body.model"),
        ({"model": "m", "messages": [], "max_tokens": 0}, "body.max_tokens"),
        (
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "body.messages.0.content",
        ),
        (
            {"model": "m", "max_tokens": 1, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 10}},
            "body.thinking.enabled.budget_tokens",
        ),
        ({"model": "m", "max_tokens": 1, "messages": [], "tool_choice": {"type": "tool"}}, "body.tool_choice"),
    ],
)
def test_schema_errors_name_pydantics_location(body: dict, param: str) -> None:
    with pytest.raises(RequestValidationError) as info:
        messages.validate_messages_request(body)
    assert info.value.param == param


def test_disabled_thinking_effort_probe(qwen3_model_dir: Path, tmp_path: Path) -> None:
    model = load_model(Settings(model=str(qwen3_model_dir)).validate())
    qwen3 = RenderContext(model, Settings(model=str(qwen3_model_dir)).validate())
    assert messages.messages_defaults(qwen3) == messages.MessagesDefaults(False, "none")
    template = tmp_path / "system_first.jinja"
    template.write_text(SYSTEM_FIRST)
    settings = Settings(model=str(qwen3_model_dir), chat_template=str(template)).validate()
    other = RenderContext(load_model(settings), settings)
    # the template ignores reasoning_effort: "none" renders like a real effort, so "low" is used
    assert messages.messages_defaults(other) == messages.MessagesDefaults(True, "low")


def test_odd_tool_result_items_are_skipped_not_500() -> None:
    body = request(
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "t", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "x",
                        "content": [
                            {"type": "image", "source": "not-a-dict"},
                            {"type": "text", "text": "ok"},
                            {"no_type": 1},
                        ],
                    }
                ],
            },
        ]
    )
    chat = messages.to_chat_request(body, DEFAULTS)
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "x", "content": "ok"}
    assert chat["messages"][3]["content"][0]["image_url"]["url"] == "data:image/jpeg;base64,"
