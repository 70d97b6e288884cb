"""The Mistral renderer parity corpus: Mistral-format models, rendered through mistral-common.

One server config per tokenizer generation, each on a folder `tests.mistral_fixture` builds
(mistral-common's own Tekken vocabulary, cut small), so vLLM picks the `mistral` renderer by
itself (`--tokenizer-mode auto`, a Mistral-format folder):

- `mv7`: v7 (`[TOOL_CALLS]` + JSON array), with `--tool-call-parser mistral
  --enable-auto-tool-choice --reasoning-parser mistral`;
- `mv11`: v11 (`[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`), no parsers;
- `mv13`: v13 (`[THINK]` reasoning history, no call ids), no parsers.

v11+ tokenizers are rendered without the parsers because vLLM 0.33's Mistral parser builds a
grammar for every such request with a mistral-common call that mistral-common 1.13 no longer
accepts (every request is a 400 there); see `docs` text in the report / parity page.

`record_mistral.py` records the goldens into `golden_mistral/`; `test_mistral_parity.py`
replays them without vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .corpus import CHAT, CMPL, MSG, RESP, Case, ServerConfig

GOLDEN_MISTRAL_DIR = Path(__file__).resolve().parent / "golden_mistral"

CONFIGS: dict[str, ServerConfig] = {
    c.name: c
    for c in (
        ServerConfig(
            "mv7",
            family="v7",
            served_model_name="tinymistral7",
            reasoning_parser="mistral",
            tool_call_parser="mistral",
            enable_auto_tool_choice=True,
        ),
        ServerConfig("mv11", family="v11", served_model_name="tinymistral11"),
        ServerConfig("mv13", family="v13", served_model_name="tinymistral13"),
    )
}

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
}


def U(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def A(text: str | None, reasoning: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if calls is not None:
        message["tool_calls"] = calls
    return message


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def tool_history(first: str, second: str) -> list[dict[str, Any]]:
    """Two parallel calls answered out of order, then a follow-up question."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        U("Weather in Paris for 3 days, and the time in Tokyo?"),
        A(
            "",
            calls=[
                call(first, "get_weather", {"city": "Paris", "days": 3}),
                call(second, "get_time", {"zone": "Asia/Tokyo", "extra": {"dst": False, "list": [1, "a"]}}),
            ],
        ),
        result(second, "09:30"),
        result(first, "Sunny, 21C"),
        A("Paris is sunny; it is 09:30 in Tokyo."),
        U("Thanks! And Berlin?"),
    ]


REASONING_HISTORY = [
    U("What is 2+2?"),
    A("4", reasoning="Simple arithmetic."),
    U("And 3+3?"),
    A("6", reasoning="Again simple."),
    U("Now 10*10?"),
]
ANTHROPIC_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ANTHROPIC_TOOL_TURNS = [
    U("What's the weather in Paris?"),
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01AbCdEfGh", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01AbCdEfGh", "content": "21C and clear"},
            {"type": "text", "text": "And tomorrow?"},
        ],
    },
]
RESPONSES_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
RESPONSES_TOOL_INPUT = [
    {"type": "message", "role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_Ab12Cd34E", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_Ab12Cd34E", "output": "21C and clear"},
]


def _chat(name: str, config: str, messages: list[dict[str, Any]], **extra: Any) -> Case:
    body: dict[str, Any] = {"model": CONFIGS[config].served_model_name, "messages": messages, "max_tokens": 64}
    body.update(extra)
    return Case(f"{config}_{name}", config, CHAT, body, {"X-Request-Id": name})


def _messages(name: str, config: str, messages: list[dict[str, Any]], **extra: Any) -> Case:
    body: dict[str, Any] = {"model": CONFIGS[config].served_model_name, "max_tokens": 64, "messages": messages}
    body.update(extra)
    return Case(f"{config}_{name}", config, MSG, body, {"X-Request-Id": name})


def _responses(name: str, config: str, input_: Any, **extra: Any) -> Case:
    body: dict[str, Any] = {"model": CONFIGS[config].served_model_name, "input": input_, "request_id": "resp_fixed"}
    body.update(extra)
    return Case(f"{config}_{name}", config, RESP, body, {})


def _cases(config: str) -> list[Case]:
    tools = {"tools": [WEATHER_TOOL, TIME_TOOL]}
    return [
        _chat("basic", config, [{"role": "system", "content": "Be brief."}, U("Hi there")]),
        _chat("no_system", config, [U("Hi there")]),
        _chat("multi_turn", config, [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")]),
        _chat("mid_system", config, [U("Hi"), A("Hello"), {"role": "system", "content": "Now be terse."}, U("Bye")]),
        _chat("developer", config, [{"role": "developer", "content": "Answer in French."}, U("Hi")]),
        _chat("unicode", config, [U("Grüße, 世界! 👋 — «ok»")]),
        _chat(
            "text_parts",
            config,
            [{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
        ),
        _chat("tools", config, [U("Weather in Paris?")], **tools),
        _chat("tools_required", config, [U("Weather in Paris?")], tool_choice="required", **tools),
        _chat(
            "tools_named",
            config,
            [U("Weather in Paris?")],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            **tools,
        ),
        _chat("tools_none", config, [U("Weather in Paris?")], tool_choice="none", **tools),
        _chat("tools_history", config, tool_history("Ab12Cd34E", "Zz98Yy76X"), **tools),
        # vLLM keeps the last 9 characters of longer ids.
        _chat("tools_history_long_ids", config, tool_history("call_0123456789abc", "call_zyxwvutsrq99"), **tools),
        _chat("tools_pending", config, tool_history("Ab12Cd34E", "Zz98Yy76X")[:5], **tools),
        _chat("tool_history_no_tools", config, tool_history("Ab12Cd34E", "Zz98Yy76X")),
        _chat("history_reasoning", config, REASONING_HISTORY),
        _chat(
            "reasoning_content_key",
            config,
            [U("Hi"), {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}, U("Bye")],
        ),
        _chat("effort_high", config, [U("Hi")], reasoning_effort="high"),
        _chat("effort_none", config, [U("Hi")], reasoning_effort="none"),
        _chat("continue_final", config, [U("Hi"), A("Hel")], add_generation_prompt=False, continue_final_message=True),
        _chat("no_generation_prompt", config, [U("Hi")], add_generation_prompt=False),
        _chat("add_special_tokens", config, [U("Hi")], add_special_tokens=True),
        _chat("err_ends_with_assistant", config, [U("Hi"), A("Hello")]),
        _chat(
            "err_continue_not_assistant", config, [U("Hi")], add_generation_prompt=False, continue_final_message=True
        ),
        _chat("err_both_flags", config, [U("Hi"), A("Hel")], continue_final_message=True),
        _chat("err_template_kwargs", config, [U("Hi")], chat_template_kwargs={"enable_thinking": True}),
        _chat("err_chat_template", config, [U("Hi")], chat_template="{{ 'x' }}"),
        _chat("err_effort", config, [U("Hi")], reasoning_effort="extreme"),
        _chat("err_short_tool_id", config, tool_history("call_1", "call_2"), **tools),
        _chat("err_tool_first", config, [result("Ab12Cd34E", "orphan"), U("Hi")]),
        _chat("err_system_only", config, [{"role": "system", "content": "Be brief."}]),
        _chat("err_empty_user", config, [U("")]),
        _chat(
            "err_image",
            config,
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
                }
            ],
        ),
        _messages("msg_basic", config, [U("Hi there")], system="Be brief."),
        _messages("msg_tools_history", config, ANTHROPIC_TOOL_TURNS, tools=[ANTHROPIC_TOOL]),
        _responses("resp_basic", config, "Hi there", instructions="Be brief."),
        _responses("resp_tools", config, RESPONSES_TOOL_INPUT, tools=[RESPONSES_TOOL]),
        Case(
            f"{config}_tokenize_chat",
            config,
            "/tokenize",
            {"model": CONFIGS[config].served_model_name, "messages": [U("Hi"), A("Hello"), U("Weather?")], **tools},
            {},
        ),
        Case(
            f"{config}_tokenize_prompt",
            config,
            "/tokenize",
            {"model": CONFIGS[config].served_model_name, "prompt": "Hello [INST] wörld", "return_token_strs": True},
            {},
        ),
        Case(
            f"{config}_detokenize",
            config,
            "/detokenize",
            {"model": CONFIGS[config].served_model_name, "tokens": [1, 3, 1072, 1105, 2156, 4, 9, 2]},
            {},
        ),
        Case(
            f"{config}_completion",
            config,
            CMPL,
            {"model": CONFIGS[config].served_model_name, "prompt": "Hello [INST] world", "max_tokens": 8},
            {},
        ),
    ]


CASES: dict[str, Case] = {case.name: case for config in CONFIGS for case in _cases(config)}


def golden_path(name: str) -> Path:
    return GOLDEN_MISTRAL_DIR / f"{name}.json"
