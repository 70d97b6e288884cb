"""The gpt-oss (Harmony) parity corpus: render and derender cases, recorded from vLLM 0.33.0.

Two server configs on the tiny gpt-oss folder (`tests/render/gpt_oss_model.py`): `gptoss` with
the flags gpt-oss is served with (`--reasoning-parser openai_gptoss --tool-call-parser openai
--enable-auto-tool-choice`) and `gptoss_noauto` (no flags: vLLM still defaults the reasoning
parser to `openai_gptoss` for gpt-oss, and no tool parser runs). Harmony's system message
carries the conversation start date; both sides pin it with `VLLM_SYSTEM_START_DATE`.

Render cases cover chat, Anthropic Messages and Responses: instructions from system and
developer messages, reasoning effort (and its errors), tools, tool history with reasoning,
multi-turn reasoning history (dropped before the last final answer), content parts, and a
~9k-token prompt. Derender cases are Harmony outputs (analysis, final, commentary preambles,
tool calls with and without `<|constrain|>json`, several calls, split UTF-8, truncation
mid-header) in batch, one-token-per-chunk and random-chunk streams.

`record_harmony.py` records them into `golden_harmony/`; `test_harmony_parity.py` replays them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent / "golden_harmony"
START_DATE = "2026-01-15"  # VLLM_SYSTEM_START_DATE on both sides
MODEL = "tinygptoss"
MAX_MODEL_LEN = 32768

CHAT, MSG, RESP = "/v1/chat/completions/render", "/v1/messages/render", "/v1/responses/render"
CHAT_DERENDER = "/v1/chat/completions/derender"


@dataclass(frozen=True)
class HarmonyConfig:
    name: str
    flags: tuple[str, ...] = ()

    def vllm_flags(self) -> list[str]:
        return ["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN), *self.flags]

    def settings_kwargs(self, model_dir: str | Path) -> dict[str, Any]:
        flags = self.flags
        return {
            "model": str(model_dir),
            "served_model_name": [MODEL],
            "max_model_len": MAX_MODEL_LEN,
            "reasoning_parser": flags[flags.index("--reasoning-parser") + 1] if "--reasoning-parser" in flags else None,
            "tool_call_parser": flags[flags.index("--tool-call-parser") + 1] if "--tool-call-parser" in flags else None,
            "enable_auto_tool_choice": "--enable-auto-tool-choice" in flags,
        }


CONFIGS = {
    c.name: c
    for c in (
        HarmonyConfig(
            "gptoss",
            ("--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"),
        ),
        HarmonyConfig("gptoss_noauto"),
    )
}


@dataclass(frozen=True)
class RenderCase:
    name: str
    path: str
    body: dict[str, Any]
    config: str = "gptoss"

    def request(self) -> dict[str, Any]:
        # vLLM's Responses render ignores X-Request-Id (its ids are random: the comparison masks them).
        headers = {} if self.path == RESP else {"X-Request-Id": self.name}
        return {"method": "POST", "path": self.path, "headers": headers, "json": self.body}


# A derender output: Harmony text (special tokens written out; the tokenizer maps them to ids).
@dataclass(frozen=True)
class DerenderCase:
    name: str
    chat_request: dict[str, Any]
    output: str
    finish_reason: str = "stop"
    kind: str = "batch"  # "batch" | "stream1" (one token per chunk) | "streamr" (random 1-7)
    config: str = "gptoss"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NO_PARAMS = {"type": "function", "function": {"name": "ping"}}


def U(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": list(messages), **extra}


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


LONG = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(560))

TOOL_HISTORY = [
    {"role": "system", "content": "You are a weather bot."},
    U("Weather in Paris and the time?"),
    {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning": "Two tools are needed.",
        "tool_calls": [call("c1", "get_weather", {"city": "Paris"}), call("c2", "get_time", {})],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "12:00"}]},
]

RENDER_CASES: list[RenderCase] = [
    RenderCase("chat_user", CHAT, chat(U("Hello!"))),
    RenderCase(
        "chat_system_effort_high",
        CHAT,
        chat({"role": "system", "content": "Be brief."}, U("Hi"), reasoning_effort="high"),
    ),
    RenderCase(
        "chat_developer_effort_low",
        CHAT,
        chat({"role": "developer", "content": "Answer in French."}, U("Hi"), reasoning_effort="low"),
    ),
    RenderCase("chat_effort_none", CHAT, chat(U("Hi"), reasoning_effort="none")),
    RenderCase("chat_effort_minimal", CHAT, chat(U("Hi"), reasoning_effort="minimal")),
    RenderCase("chat_tools_auto", CHAT, chat(U("Weather in Rome?"), tools=[WEATHER, TIME, NO_PARAMS])),
    RenderCase("chat_tools_choice_none", CHAT, chat(U("Weather in Rome?"), tools=[WEATHER], tool_choice="none")),
    RenderCase("chat_tools_required", CHAT, chat(U("Weather in Rome?"), tools=[WEATHER, TIME], tool_choice="required")),
    RenderCase(
        "chat_tools_named",
        CHAT,
        chat(
            U("Weather?"), tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}}
        ),
    ),
    RenderCase(
        "chat_tools_strict_auto_no_parallel",
        CHAT,
        chat(
            U("Weather?"),
            tools=[{**WEATHER, "function": {**WEATHER["function"], "strict": True}}, NO_PARAMS],
            parallel_tool_calls=False,
        ),
    ),
    RenderCase(
        "chat_response_format_json_schema",
        CHAT,
        chat(
            U("JSON please"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
            },
        ),
    ),
    RenderCase(
        "chat_response_format_json_object", CHAT, chat(U("JSON please"), response_format={"type": "json_object"})
    ),
    RenderCase("chat_structured_choice", CHAT, chat(U("Pick one"), structured_outputs={"choice": ["yes", "no"]})),
    RenderCase(
        "chat_structured_regex_strict_tool",
        CHAT,
        chat(
            U("Pick"),
            structured_outputs={"regex": "[a-z]+"},
            tools=[{**WEATHER, "function": {**WEATHER["function"], "strict": True}}],
        ),
    ),
    RenderCase("chat_tools_empty", CHAT, chat({"role": "system", "content": ""}, U("Hi"), tools=[])),
    RenderCase("chat_tool_history", CHAT, chat(*TOOL_HISTORY, tools=[WEATHER, TIME])),
    RenderCase(
        "chat_reasoning_history",
        CHAT,
        chat(
            U("What is 2+2?"),
            {"role": "assistant", "content": "4", "reasoning": "Simple arithmetic."},
            U("And 3+3?"),
            {"role": "assistant", "content": "6", "reasoning": "Again simple."},
            U("Thanks. Now 5+5?"),
        ),
    ),
    RenderCase(
        "chat_reasoning_after_final",
        CHAT,
        chat(
            U("Plan a trip."),
            {"role": "assistant", "content": "Sure.", "reasoning": "Start planning."},
            U("To Rome."),
            {
                "role": "assistant",
                "content": None,
                "reasoning": "Look up Rome.",
                "tool_calls": [call("r1", "get_weather", {"city": "Rome"})],
            },
            {"role": "tool", "tool_call_id": "r1", "content": "sunny"},
        ),
    ),
    RenderCase(
        "chat_content_parts",
        CHAT,
        chat(
            {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}]},
            U([{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]),
        ),
    ),
    RenderCase(
        "chat_mid_system",
        CHAT,
        chat(
            U("Hi"),
            {"role": "assistant", "content": "Hello!"},
            {"role": "system", "content": "Now speak German."},
            U("Wie geht's?"),
        ),
    ),
    RenderCase("chat_unicode", CHAT, chat(U("こんにちは 👋🏽 naïve café — ∑"))),
    RenderCase(
        "chat_no_generation_prompt", CHAT, chat(U("Hi"), add_generation_prompt=False, chat_template_kwargs={"x": 1})
    ),
    RenderCase("chat_long_9k", CHAT, chat(U(LONG))),
    RenderCase("chat_tools_noauto", CHAT, chat(U("Weather?"), tools=[WEATHER], tool_choice="auto"), "gptoss_noauto"),
    RenderCase("chat_user_noauto", CHAT, chat(U("Hello!")), "gptoss_noauto"),
    RenderCase(
        "msg_basic",
        MSG,
        {"model": MODEL, "max_tokens": 64, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]},
    ),
    RenderCase(
        "msg_tools_history",
        MSG,
        {
            "model": MODEL,
            "max_tokens": 64,
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Weather.",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ],
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                        {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "Oslo"}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "cold"}]},
            ],
        },
    ),
    RenderCase(
        "msg_thinking",
        MSG,
        {
            "model": MODEL,
            "max_tokens": 4096,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "Think about it."}],
        },
    ),
    RenderCase("resp_basic", RESP, {"model": MODEL, "input": "Hello!"}),
    RenderCase(
        "resp_instructions_effort_tools",
        RESP,
        {
            "model": MODEL,
            "instructions": "Be brief.",
            "input": "Weather in Rome?",
            "reasoning": {"effort": "high"},
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "Weather.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ],
        },
    ),
    RenderCase(
        "resp_function_history",
        RESP,
        {
            "model": MODEL,
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": "Weather in Rome?"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Need the tool."}],
                },
                {"type": "function_call", "call_id": "fc1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
                {"type": "function_call_output", "call_id": "fc1", "output": "sunny"},
            ],
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ],
        },
    ),
    RenderCase("resp_effort_none", RESP, {"model": MODEL, "input": "Hi", "reasoning": {"effort": "none"}}),
]

# -- derender -----------------------------------------------------------------------------------------

ANALYSIS_FINAL = "<|channel|>analysis<|message|>The user says hi. Reply kindly.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
TOOL_CALL = (
    "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris", "unit": "c"}<|call|>'
)
LEGACY_TOOL_CALL = (
    "<|channel|>analysis<|message|>Use the tool.<|end|>"
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}<|call|>'
)
TWO_CALLS = (
    "<|channel|>commentary<|message|>Checking both.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}<|call|>'
    "<|start|>assistant<|channel|>commentary to=functions.get_time<|message|>{}<|call|>"
)
UNICODE_FINAL = "<|channel|>analysis<|message|>Grüße 👋🏽 日本語<|end|><|start|>assistant<|channel|>final<|message|>こんにちは！🎉 naïve ☕<|return|>"
NON_JSON_ARGS = "<|channel|>commentary to=functions.get_weather <|constrain|>text<|message|>city=Paris<|call|>"
BAD_JSON_ARGS = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": <|call|>'
CUT_IN_HEADER = "<|channel|>analysis<|message|>Thinking.<|end|><|start|>assistant<|channel|>fin"
CUT_IN_CONTENT = "<|channel|>analysis<|message|>Thinking a lot about"
BUILTIN_RECIPIENT = '<|channel|>analysis<|message|>Browse.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{"q": 1}<|call|>'
GARBAGE_THEN_FINAL = "Hello<|end|>stray<|start|>assistant<|channel|>final<|message|>Recovered.<|return|>"

TOOLS_REQ = chat(U("Weather?"), tools=[WEATHER, TIME])


def _stream(request: dict[str, Any]) -> dict[str, Any]:
    return {**request, "stream": True}


def _derender_cases() -> list[DerenderCase]:
    base: list[tuple[str, dict[str, Any], str, str, str]] = [
        ("analysis_final", chat(U("Hi")), ANALYSIS_FINAL, "stop", "gptoss"),
        ("tool_call", TOOLS_REQ, TOOL_CALL, "stop", "gptoss"),
        ("legacy_tool_call", TOOLS_REQ, LEGACY_TOOL_CALL, "stop", "gptoss"),
        ("two_calls", TOOLS_REQ, TWO_CALLS, "stop", "gptoss"),
        ("two_calls_no_parallel", {**TOOLS_REQ, "parallel_tool_calls": False}, TWO_CALLS, "stop", "gptoss"),
        ("tool_choice_none", {**TOOLS_REQ, "tool_choice": "none"}, TOOL_CALL, "stop", "gptoss"),
        ("no_reasoning", {**chat(U("Hi")), "include_reasoning": False}, ANALYSIS_FINAL, "stop", "gptoss"),
        ("unicode", chat(U("Hi")), UNICODE_FINAL, "stop", "gptoss"),
        ("non_json_args", TOOLS_REQ, NON_JSON_ARGS, "stop", "gptoss"),
        ("bad_json_args", TOOLS_REQ, BAD_JSON_ARGS, "stop", "gptoss"),
        ("cut_in_header", chat(U("Hi")), CUT_IN_HEADER, "length", "gptoss"),
        ("cut_in_content", chat(U("Hi")), CUT_IN_CONTENT, "length", "gptoss"),
        ("builtin_recipient", TOOLS_REQ, BUILTIN_RECIPIENT, "stop", "gptoss"),
        ("garbage_then_final", chat(U("Hi")), GARBAGE_THEN_FINAL, "stop", "gptoss"),
        ("tool_call_noauto", TOOLS_REQ, TOOL_CALL, "stop", "gptoss_noauto"),
        ("analysis_final_noauto", chat(U("Hi")), ANALYSIS_FINAL, "stop", "gptoss_noauto"),
    ]
    out: list[DerenderCase] = []
    for name, request, text, finish, config in base:
        out.append(DerenderCase(f"{name}_batch", request, text, finish, "batch", config))
        out.append(DerenderCase(f"{name}_stream1", _stream(request), text, finish, "stream1", config))
        out.append(DerenderCase(f"{name}_streamr", _stream(request), text, finish, "streamr", config))
    return out


DERENDER_CASES = _derender_cases()


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"
