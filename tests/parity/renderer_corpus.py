"""The renderer parity corpus: models vLLM 0.33 renders without a Jinja template.

One server config per renderer (`deepseek_v32`, `deepseek_v4`, `deepseek_v41`, `kimi_k3`),
each on the fixture folder `render_service.model.example_renderers` builds for it, so vLLM
picks the renderer from `config.json` exactly as it would for the real model. The cases cover
chat, Messages and Responses; tools and tool results; multi-turn reasoning history with
thinking on and off; reasoning effort; continuation; errors. `record_renderers.py` records
them from the oracle into `golden_renderers/`; `test_renderer_parity.py` replays them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .corpus import CHAT, CMPL, MSG, RESP, Case, ServerConfig

GOLDEN_RENDERERS_DIR = Path(__file__).resolve().parent / "golden_renderers"

CONFIGS: dict[str, ServerConfig] = {
    c.name: c
    for c in (
        ServerConfig("dsv32", family="deepseek_v32", served_model_name="tinydsv32"),
        ServerConfig("dsv4", family="deepseek_v4", served_model_name="tinydsv4"),
        ServerConfig("dsv41", family="deepseek_v41", served_model_name="tinydsv41"),
        ServerConfig("k3", family="kimi_k3", served_model_name="tinyk3"),
        # K3 with its own parsers: their render-side effects (special tokens kept and unspaced,
        # the `kimi_k3` structural tag for required / named / strict tools).
        ServerConfig(
            "k3p",
            family="kimi_k3",
            served_model_name="tinyk3",
            reasoning_parser="kimi_k3",
            tool_call_parser="kimi_k3",
            enable_auto_tool_choice=True,
        ),
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


# Two parallel calls answered out of order, then a follow-up question.
TOOL_HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    U("Weather in Paris for 3 days, and the time in Tokyo?"),
    A(
        "Checking both.",
        reasoning="I need two tools.",
        calls=[
            call("call_w", "get_weather", {"city": "Paris", "days": 3}),
            call("call_t", "get_time", {"zone": "Asia/Tokyo", "extra": {"dst": False, "list": [1, "a"]}}),
        ],
    ),
    result("call_t", "09:30"),
    result("call_w", "Sunny, 21C"),
    A("Paris is sunny; it is 09:30 in Tokyo.", reasoning="Both answered."),
    U("Thanks! And Berlin?"),
]
# The same, ending right after the tool results (the model continues from them).
TOOL_PENDING = TOOL_HISTORY[:5]
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
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C and clear"},
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
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Call the weather tool."}],
    },
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "21C and clear"},
]


def _chat(name: str, config: str, messages: list[dict[str, Any]], **extra: Any) -> Case:
    body: dict[str, Any] = {"model": CONFIGS[config].served_model_name, "messages": messages, "max_tokens": 64}
    body.update(extra)
    return Case(name, config, CHAT, body, {"X-Request-Id": name})


def _messages(name: str, config: str, messages: list[dict[str, Any]], **extra: Any) -> Case:
    body: dict[str, Any] = {"model": CONFIGS[config].served_model_name, "max_tokens": 64, "messages": messages}
    body.update(extra)
    return Case(name, config, MSG, body, {"X-Request-Id": name})


def _responses(name: str, config: str, input_: Any, **extra: Any) -> Case:
    body: dict[str, Any] = {"model": CONFIGS[config].served_model_name, "input": input_, "request_id": "resp_fixed"}
    body.update(extra)
    return Case(name, config, RESP, body, {})


def _common_cases(config: str) -> list[Case]:
    """What every renderer is asked: the same requests, named `<config>_<what>`."""
    tools = {"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": "none"}
    cases = [
        _chat("basic", config, [{"role": "system", "content": "Be brief."}, U("Hi there")]),
        _chat("no_system", config, [U("Hi there")]),
        _chat("history_thinking", config, REASONING_HISTORY, chat_template_kwargs={"thinking": True}),
        _chat("history_enable_thinking", config, REASONING_HISTORY, chat_template_kwargs={"enable_thinking": True}),
        _chat("history_no_thinking", config, REASONING_HISTORY, chat_template_kwargs={"thinking": False}),
        _chat("history_default", config, REASONING_HISTORY),
        _chat("tools", config, [U("Weather in Paris?")], **tools),
        _chat("tools_history", config, TOOL_HISTORY, **tools),
        _chat("tools_history_thinking", config, TOOL_HISTORY, chat_template_kwargs={"thinking": True}, **tools),
        _chat("tools_pending", config, TOOL_PENDING, **tools),
        _chat("tools_pending_thinking", config, TOOL_PENDING, chat_template_kwargs={"thinking": True}, **tools),
        _chat("tool_history_no_tools", config, TOOL_HISTORY, chat_template_kwargs={"thinking": False}),
        _chat("effort_low", config, REASONING_HISTORY, reasoning_effort="low"),
        _chat("effort_high", config, REASONING_HISTORY, reasoning_effort="high"),
        _chat("effort_max", config, REASONING_HISTORY, reasoning_effort="max"),
        _chat("effort_none", config, REASONING_HISTORY, reasoning_effort="none"),
        _chat("effort_medium", config, [U("Hi")], reasoning_effort="medium"),
        _chat("kwargs_effort_int", config, [U("Hi")], chat_template_kwargs={"reasoning_effort": 30}),
        _chat("drop_thinking_false", config, REASONING_HISTORY, chat_template_kwargs={"drop_thinking": False}),
        _chat("developer", config, [{"role": "developer", "content": "Answer in French."}, U("Hi")]),
        _chat(
            "developer_history",
            config,
            [{"role": "developer", "content": "Be terse."}, U("Hi"), A("Hello", reasoning="greet"), U("Bye")],
            chat_template_kwargs={"thinking": True},
        ),
        _chat("ends_with_assistant", config, [U("Hi"), A("Hello", reasoning="hm")]),
        _chat(
            "continue_final",
            config,
            [U("Hi"), A("Hel")],
            add_generation_prompt=False,
            continue_final_message=True,
            chat_template_kwargs={"thinking": False},
        ),
        _chat("no_generation_prompt", config, [U("Hi")], add_generation_prompt=False),
        _chat(
            "text_parts",
            config,
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}],
                }
            ],
        ),
        _chat("consecutive_users", config, [U("First."), U("Second.")]),
        _chat("system_last", config, [U("Hi"), A("Hello"), {"role": "system", "content": "Now be formal."}]),
        _chat("mid_system", config, [U("Hi"), A("Hello"), {"role": "system", "content": "Be formal."}, U("Bye")]),
        _chat("bad_arguments", config, [U("Hi"), A(None, calls=[call("c", "get_time", {})]), result("c", "x")]),
        _chat(
            "unicode",
            config,
            [
                U("Grüße, 東京 and emoji 🙂?"),
                A("ok", calls=[call("c1", "get_weather", {"city": "東京"})]),
                result("c1", "晴れ"),
            ],
            **tools,
        ),
        _chat("add_special_tokens", config, [U("Hi")], add_special_tokens=True),
        _chat(
            "reasoning_content_key",
            config,
            [U("Hi"), {"role": "assistant", "content": "Hello", "reasoning_content": "old name"}, U("Bye")],
            chat_template_kwargs={"drop_thinking": False},
        ),
        _chat(
            "content_parts_everywhere",
            config,
            [
                U("Go"),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
                    "tool_calls": [call("c1", "get_time", {"zone": "UTC"})],
                },
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": "UTC"}],
                },
            ],
        ),
        _chat(
            "double_encoded_arguments",
            config,
            [
                U("Go"),
                A(
                    None,
                    calls=[
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_time", "arguments": json.dumps(json.dumps({"zone": "UTC"}))},
                        }
                    ],
                ),
                result("c1", "12:00"),
            ],
        ),
        _chat("task_query", config, [{"role": "user", "content": "Find flights", "task": "query"}]),
        _chat(
            "task_action",
            config,
            [{"role": "user", "content": "Book it", "task": "action"}],
            chat_template_kwargs={"thinking": False},
        ),
        _chat(
            "task_history",
            config,
            [{"role": "user", "content": "Q", "task": "title"}, A("A title", reasoning="r"), U("Next")],
        ),
        _chat("response_format", config, [U("Hi")], response_format={"type": "json_object"}),
        _chat(
            "response_format_schema",
            config,
            [U("Hi")],
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                },
            },
            **tools,
        ),
        _chat("err_tool_choice_auto", config, [U("Hi")], tools=[WEATHER_TOOL]),
        _chat("err_tool_without_call", config, [U("Hi"), result("nope", "orphan")]),
        _chat("err_orphan_tool_first", config, [result("nope", "orphan"), U("Hi")]),
        _chat(
            "err_thinking_plain_assistant",
            config,
            [U("Hi"), A("Hello")],
            chat_template_kwargs={"thinking": True},
        ),
        _chat("err_developer_empty", config, [{"role": "developer", "content": ""}, U("Hi")]),
        _chat(
            "err_image",
            config,
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
        ),
        _messages("msg_basic", config, [U("Hi")], system="You are terse."),
        _messages(
            "msg_tools_history", config, ANTHROPIC_TOOL_TURNS, tools=[ANTHROPIC_TOOL], tool_choice={"type": "none"}
        ),
        _messages(
            "msg_thinking",
            config,
            ANTHROPIC_TOOL_TURNS,
            max_tokens=4096,
            thinking={"type": "enabled", "budget_tokens": 2048},
            tools=[ANTHROPIC_TOOL],
            tool_choice={"type": "none"},
        ),
        _messages("msg_thinking_disabled", config, [U("Hi"), A("Hello"), U("Bye")], thinking={"type": "disabled"}),
        _messages(
            "msg_inline_system",
            config,
            [U("Hi"), A("Hello"), {"role": "system", "content": "Be brief."}, U("Bye")],
            system="Top.",
        ),
        _responses("resp_basic", config, "Hi", instructions="You are terse."),
        _responses("resp_tools", config, RESPONSES_TOOL_INPUT, tools=[RESPONSES_TOOL], tool_choice="none"),
        _responses("resp_effort_low", config, "Hi", reasoning={"effort": "low"}),
        _responses("resp_effort_none", config, "Hi", reasoning={"effort": "none"}),
        Case(
            "tokenize",
            config,
            "/tokenize",
            {"model": CONFIGS[config].served_model_name, "messages": TOOL_HISTORY, "tools": [WEATHER_TOOL]},
        ),
        Case(
            "fim",
            config,
            CMPL,
            {"model": CONFIGS[config].served_model_name, "prompt": "def add(a, b):\n", "suffix": "\n    return c\n"},
            {"X-Request-Id": "fim"},
        ),
        Case(
            "fim_list",
            config,
            CMPL,
            {"model": CONFIGS[config].served_model_name, "prompt": ["x = ", "y = "], "suffix": ";"},
            {"X-Request-Id": "fim_list"},
        ),
    ]
    if config in ("dsv41", "k3"):
        # A documented difference: vLLM serves V4.1 and K3 as vision-language models (it loads
        # the image); this service renders them text only (400 "not a multimodal model").
        cases = [c for c in cases if c.name != "err_image"]
    return [Case(f"{config}_{c.name}", c.config, c.path, c.body, c.headers) for c in cases]


def _k3_cases() -> list[Case]:
    k3 = "k3"
    cases = [
        _chat("thinking_effort_kwarg", k3, [U("Hi")], chat_template_kwargs={"thinking_effort": "max"}),
        _chat("err_thinking_effort_kwarg", k3, [U("Hi")], chat_template_kwargs={"thinking_effort": "extreme"}),
        _chat(
            "effort_and_kwarg", k3, [U("Hi")], reasoning_effort="low", chat_template_kwargs={"thinking_effort": "max"}
        ),
        _chat(
            "unmatched_tool_results",
            k3,
            [
                U("Hi"),
                A(None, calls=[call("a", "get_weather", {"city": "X"}), call("b", "get_time", {})]),
                result("zzz", "one"),
                result("a", "two"),
            ],
            **{"tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": "none"},
        ),
        _chat(
            "alias_tool_results",
            k3,
            [
                U("Hi"),
                A(None, calls=[call("id_t", "get_time", {}), call("id_w", "get_weather", {})]),
                result("get_weather:1", "w"),
                result("get_time:0", "t"),
            ],
        ),
    ]
    return [Case(f"k3_{c.name}", c.config, c.path, c.body, c.headers) for c in cases]


def _k3_parser_cases() -> list[Case]:
    k3p = "k3p"
    tools = [WEATHER_TOOL, TIME_TOOL]
    strict = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "strict": True}}
    enum_tool: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "pick",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "color": {"type": "string", "enum": ["red", "green"]},
                    "label": {"type": "string", "maxLength": 8},
                    "n": {"type": "integer"},
                    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
                    "any": {"type": ["string", "null"]},
                },
                "required": ["color"],
                "$defs": {"tag": {"type": "string"}},
            },
        },
    }
    cases = [
        _chat("plain", k3p, [U("Hi")]),
        _chat("thinking_off", k3p, [U("Hi")], chat_template_kwargs={"thinking": False}),
        _chat("auto", k3p, [U("Weather?")], tools=tools),
        _chat("auto_strict", k3p, [U("Weather?")], tools=[strict, TIME_TOOL]),
        _chat("required", k3p, [U("Weather?")], tools=tools, tool_choice="required"),
        _chat("required_enum", k3p, [U("Pick")], tools=[enum_tool], tool_choice="required"),
        _chat(
            "named",
            k3p,
            [U("Weather?")],
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        ),
        _chat("none", k3p, [U("Weather?")], tools=tools, tool_choice="none"),
        _chat("noparallel", k3p, [U("Weather?")], tools=tools, tool_choice="required", parallel_tool_calls=False),
        _chat("spaces_kept_by_request", k3p, [U("Hi")], spaces_between_special_tokens=True, skip_special_tokens=True),
        _responses("resp_tools", k3p, "Weather?", tools=[{"type": "function", **WEATHER_TOOL["function"]}]),
    ]
    return [Case(f"k3p_{c.name}", c.config, c.path, c.body, c.headers) for c in cases]


CASES: dict[str, Case] = {c.name: c for config in CONFIGS if config != "k3p" for c in _common_cases(config)}
CASES.update({c.name: c for c in _k3_cases()})
CASES.update({c.name: c for c in _k3_parser_cases()})


def golden_path(name: str) -> Path:
    return GOLDEN_RENDERERS_DIR / f"{name}.json"
