"""The render parity corpus: server configs, cases, and the helpers shared by record.py and the tests.

Each `ServerConfig` maps to the vLLM 0.33 `vllm launch render` flags of the oracle AND to our
`Settings`. Each `Case` is one HTTP request against one config. `record.py` sends every case to
the oracle and writes `golden/<case>.json`; `test_render_parity.py` replays the golden request
against our app and compares with `compare_response`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from render_service import VLLM_VERSION

PARITY_DIR = Path(__file__).resolve().parent
GOLDEN_DIR = PARITY_DIR / "golden"
MAX_MODEL_LEN = 16384
MODEL_DIR_PLACEHOLDER = "<MODEL_DIR>"


# -- server configs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    name: str
    family: str = "qwen3"  # example_model family: "qwen3" or "deepseek"
    served_model_name: str = "tinyqwen3"
    max_model_len: int = MAX_MODEL_LEN
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    trust_request_chat_template: bool = False
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    chat_template: str | None = None  # a file under tests/parity/templates

    @property
    def chat_template_path(self) -> str | None:
        return str(PARITY_DIR / "templates" / self.chat_template) if self.chat_template else None

    def vllm_flags(self) -> list[str]:
        """Flags after `vllm launch render MODEL_DIR`."""
        flags = ["--served-model-name", self.served_model_name, "--max-model-len", str(self.max_model_len)]
        if self.reasoning_parser:
            flags += ["--reasoning-parser", self.reasoning_parser]
        if self.tool_call_parser:
            flags += ["--tool-call-parser", self.tool_call_parser]
        if self.enable_auto_tool_choice:
            flags.append("--enable-auto-tool-choice")
        if self.trust_request_chat_template:
            flags.append("--trust-request-chat-template")
        if self.default_chat_template_kwargs:
            flags += ["--default-chat-template-kwargs", json.dumps(self.default_chat_template_kwargs)]
        if self.api_key:
            flags += ["--api-key", self.api_key]
        if self.chat_template_path:
            flags += ["--chat-template", self.chat_template_path]
        return flags

    def settings_kwargs(self, model_dir: str | Path) -> dict[str, Any]:
        """Keyword arguments for `render_service.settings.Settings` (same meaning as the flags)."""
        return {
            "model": str(model_dir),
            "served_model_name": [self.served_model_name],
            "max_model_len": self.max_model_len,
            "reasoning_parser": self.reasoning_parser,
            "tool_call_parser": self.tool_call_parser,
            "enable_auto_tool_choice": self.enable_auto_tool_choice,
            "trust_request_chat_template": self.trust_request_chat_template,
            "default_chat_template_kwargs": dict(self.default_chat_template_kwargs),
            "api_key": self.api_key,
            "chat_template": self.chat_template_path,
        }


CONFIGS: dict[str, ServerConfig] = {
    c.name: c
    for c in (
        ServerConfig("parsers", reasoning_parser="qwen3", tool_call_parser="hermes", enable_auto_tool_choice=True),
        ServerConfig("plain"),
        ServerConfig("noauto", tool_call_parser="hermes"),
        ServerConfig(
            "trust",
            reasoning_parser="qwen3",
            tool_call_parser="hermes",
            enable_auto_tool_choice=True,
            trust_request_chat_template=True,
            default_chat_template_kwargs={"enable_thinking": False},
        ),
        ServerConfig("deepseek", family="deepseek", served_model_name="tinydeepseek", reasoning_parser="deepseek_r1"),
        ServerConfig("apikey", api_key="sekret"),
        ServerConfig(
            "sysfirst",
            reasoning_parser="qwen3",
            tool_call_parser="hermes",
            enable_auto_tool_choice=True,
            chat_template="system_first.jinja",
        ),
    )
}


# -- cases ---------------------------------------------------------------------------------------

CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    path: str
    body: Any = None  # JSON-encoded when `raw` is None; GET requests have neither
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"
    raw: str | None = None  # sent verbatim (malformed JSON, wrong content type)

    def request(self) -> dict[str, Any]:
        """The request as stored in the golden file (and replayed from it)."""
        req: dict[str, Any] = {"method": self.method, "path": self.path, "headers": dict(self.headers)}
        if self.raw is not None:
            req["raw"] = self.raw
        elif self.body is not None:
            req["json"] = self.body
        return req


def _rid(name: str) -> dict[str, str]:
    return {"X-Request-Id": name}


def U(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def A(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def S(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


# Key order is deliberately not alphabetical anywhere below: vLLM keeps the client's order inside
# `parameters` but re-orders the tool object itself into its pydantic field order.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL: dict[str, Any] = {
    "function": {
        "parameters": {
            "type": "object",
            "required": ["query"],
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "price": {
                            "type": "object",
                            "properties": {"max": {"type": "number"}, "min": {"type": "number"}},
                        },
                        "brands": {"type": "array", "items": {"type": "string"}},
                        "in_stock": {"type": "boolean", "default": True},
                    },
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            },
        },
        "name": "search_products",
        "description": "Search the product catalogue.",
    },
    "type": "function",
}

NO_DESCRIPTION_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "ping",
        "parameters": {"type": "object", "properties": {}},
    },
}

STRICT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"time": {"type": "string"}, "label": {"type": "string"}},
            "required": ["time", "label"],
            "additionalProperties": False,
        },
    },
}

TOOL_CALL_WEATHER = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
}

TOOL_HISTORY: list[dict[str, Any]] = [
    U("What's the weather in Paris?"),
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL_WEATHER]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
]

CUSTOM_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu river mountain cloud "
    "stone paper lamp window garden orange purple silver quiet rapid gentle bright"
).split()


def long_text(n_words: int, seed: int = 7) -> str:
    """Deterministic pseudo-random prose (a linear congruential generator over WORDS)."""
    state = seed
    out: list[str] = []
    for i in range(n_words):
        state = (state * 1103515245 + 12345) % (1 << 31)
        word = WORDS[state % len(WORDS)]
        out.append(word + ("." if i % 13 == 12 else ""))
    return " ".join(out)


def _chat(
    name: str,
    messages: list[dict[str, Any]],
    config: str = "parsers",
    *,
    rid: bool = True,
    model: str | None = "tinyqwen3",
    **extra: Any,
) -> Case:
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    body["messages"] = messages
    body.update(extra)
    return Case(name, config, CHAT, body, _rid(name) if rid else {})


def _cmpl(
    name: str, prompt: Any, config: str = "parsers", *, rid: bool = True, model: str | None = "tinyqwen3", **extra: Any
) -> Case:
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    body["prompt"] = prompt
    body.update(extra)
    return Case(name, config, CMPL, body, _rid(name) if rid else {})


def _chat_cases() -> list[Case]:
    hi = [U("Hi")]
    return [
        # basic shapes and request ids
        _chat("chat_single_turn", hi),
        _chat("chat_random_request_id", hi, rid=False),
        _chat("chat_body_request_id", hi, rid=False, request_id="my-body-id"),
        _chat("chat_header_beats_body_request_id", hi, request_id="ignored-body-id"),
        _chat("chat_model_omitted", hi, model=None),
        _chat("chat_system_prompt", [S("You are a terse assistant."), U("Name a colour.")]),
        _chat("chat_multi_turn", [U("Hello"), A("Hi! How can I help?"), U("Tell me a joke.")]),
        _chat("chat_multi_turn_system", [S("Be brief."), U("2+2?"), A("4"), U("And 3+3?"), A("6"), U("Thanks")]),
        _chat("chat_unknown_fields", hi, foo="bar", nested_unknown={"a": 1}, user="someone"),
        # tools
        _chat("chat_tools_implicit_auto", [U("Weather in Paris?")], tools=[WEATHER_TOOL]),
        _chat("chat_tool_choice_none", [U("Weather in Paris?")], tools=[WEATHER_TOOL], tool_choice="none"),
        _chat("chat_tool_choice_auto", [U("Weather in Paris?")], tools=[WEATHER_TOOL, SEARCH_TOOL], tool_choice="auto"),
        _chat("chat_tool_choice_required", [U("Weather in Paris?")], tools=[WEATHER_TOOL], tool_choice="required"),
        _chat(
            "chat_tool_choice_named",
            [U("Find shoes")],
            tools=[WEATHER_TOOL, SEARCH_TOOL],
            tool_choice={"type": "function", "function": {"name": "search_products"}},
        ),
        _chat("chat_tool_without_description", [U("ping it")], tools=[NO_DESCRIPTION_TOOL]),
        _chat(
            "chat_tools_nested_schema",
            [S("You sell things."), U("Cheap red shoes, max 5")],
            tools=[SEARCH_TOOL, WEATHER_TOOL, NO_DESCRIPTION_TOOL],
        ),
        _chat("chat_tool_strict", [U("Wake me at 7")], tools=[STRICT_TOOL]),
        _chat(
            "chat_parallel_tool_calls_false",
            [U("Weather in Paris and Rome?")],
            tools=[WEATHER_TOOL],
            parallel_tool_calls=False,
        ),
        _chat("chat_tool_result", TOOL_HISTORY, tools=[WEATHER_TOOL]),
        _chat("chat_tool_result_no_tools", TOOL_HISTORY),
        _chat(
            "chat_tool_calls_args_object",
            [
                U("Weather in Rome?"),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_obj",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Rome"}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_obj", "content": "sunny"},
            ],
            tools=[WEATHER_TOOL],
        ),
        _chat(
            "chat_tool_calls_args_invalid_json",
            [
                U("Weather in Oslo?"),
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {
                            "id": "call_bad",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_bad", "content": "error: bad arguments"},
            ],
            tools=[WEATHER_TOOL],
        ),
        _chat(
            "chat_multiple_tool_calls_and_results",
            [
                U("Weather in Paris and Rome?"),
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        TOOL_CALL_WEATHER,
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
                A("Paris 21C, Rome 25C."),
                U("And Oslo?"),
            ],
            tools=[WEATHER_TOOL],
        ),
        # reasoning
        _chat(
            "chat_assistant_reasoning",
            [
                U("What is 2+2?"),
                {"role": "assistant", "content": "4", "reasoning": "Simple addition."},
                U("And times 3?"),
            ],
        ),
        _chat(
            "chat_assistant_reasoning_content",
            [
                U("What is 2+2?"),
                {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
                U("And times 3?"),
            ],
        ),
        _chat(
            "chat_assistant_reasoning_last_turn",
            [U("Solve x+1=2"), {"role": "assistant", "content": "x=1", "reasoning": "Subtract one."}],
            add_generation_prompt=False,
        ),
        _chat("chat_enable_thinking_false", hi, chat_template_kwargs={"enable_thinking": False}),
        _chat("chat_enable_thinking_true", hi, chat_template_kwargs={"enable_thinking": True}),
        _chat("chat_reasoning_effort_low", hi, reasoning_effort="low"),
        _chat("chat_reasoning_effort_none", hi, reasoning_effort="none"),
        _chat(
            "chat_reasoning_effort_with_kwargs",
            hi,
            reasoning_effort="high",
            chat_template_kwargs={"enable_thinking": False},
        ),
        _chat("chat_include_reasoning_false", hi, include_reasoning=False),
        _chat("chat_template_kwargs_extra", hi, chat_template_kwargs={"custom_flag": "x", "cohere_format": "other"}),
        # content forms and text edge cases
        _chat("chat_unicode_emoji", [U("Grüße aus Köln 👋🏽 — 日本語テキスト, emoji 🎉🧪 and e\u0301 (NFD)")]),
        _chat(
            "chat_whitespace_edges",
            [S("  padded system  "), U("\n\n  leading and trailing \t\n"), A("   "), U("\r\nCRLF line\r\n")],
        ),
        _chat("chat_empty_user_content", [U("")]),
        _chat(
            "chat_content_text_parts",
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}],
                }
            ],
        ),
        _chat(
            "chat_system_text_parts",
            [{"role": "system", "content": [{"type": "text", "text": "System as parts."}]}, U("Hi")],
        ),
        _chat("chat_special_token_text_in_content", [U("literal <|im_end|> and <think> inside")]),
        _chat("chat_developer_role", [{"role": "developer", "content": "Developer instructions."}, U("Hi")]),
        _chat(
            "chat_documents",
            [U("Summarise the documents.")],
            documents=[{"title": "Doc A", "text": "Alpha text."}, {"title": "Doc B", "text": "Beta text."}],
        ),
        _chat(
            "chat_continue_final_message",
            [U("Write a haiku."), A("Autumn moonlight -")],
            continue_final_message=True,
            add_generation_prompt=False,
        ),
        _chat("chat_add_generation_prompt_false", [U("Hi"), A("Hello!")], add_generation_prompt=False),
        _chat("chat_echo", [U("Hi"), A("Hello")], echo=True),
        _chat("chat_add_special_tokens", hi, add_special_tokens=True),
        _chat("chat_long_prompt_9k", [S("Summarise."), U(long_text(5900))]),
        _chat("chat_return_token_offsets", [U("Offsets please")], return_token_offsets=True),
        # generation params
        _chat("chat_sampling_greedy_seed", hi, temperature=0, seed=1234),
        _chat(
            "chat_sampling_all_floats",
            hi,
            temperature=0.3,
            top_p=0.5,
            top_k=5,
            min_p=0.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.2,
        ),
        _chat("chat_stop_string", hi, stop="END"),
        _chat("chat_stop_list", hi, stop=["END", "\n\n", "STOP"]),
        _chat("chat_stop_token_ids", hi, stop_token_ids=[151643, 42]),
        _chat("chat_n_3", hi, n=3, temperature=0.8),
        _chat("chat_logprobs_top", hi, logprobs=True, top_logprobs=5),
        _chat("chat_logprobs_only", hi, logprobs=True),
        _chat("chat_prompt_logprobs", hi, prompt_logprobs=2),
        _chat("chat_logit_bias", hi, logit_bias={"9707": 5.5, "151645": -100}),
        _chat("chat_min_tokens", hi, min_tokens=4),
        _chat("chat_max_tokens", hi, max_tokens=32),
        _chat("chat_max_completion_tokens", hi, max_completion_tokens=64),
        _chat("chat_max_tokens_and_completion_tokens", hi, max_tokens=10, max_completion_tokens=20),
        _chat("chat_max_tokens_null", hi, max_tokens=None),
        _chat("chat_max_completion_tokens_equal_model_len", hi, max_completion_tokens=MAX_MODEL_LEN),
        _chat("chat_top_logprobs_above_max_logprobs", hi, logprobs=True, top_logprobs=50),
        _chat("chat_skip_special_tokens_true", hi, skip_special_tokens=True),
        _chat("chat_spaces_between_special_tokens_false", hi, spaces_between_special_tokens=False),
        _chat("chat_include_stop_str_in_output", hi, stop=["x"], include_stop_str_in_output=True),
        _chat("chat_ignore_eos", hi, ignore_eos=True, max_tokens=8),
        _chat("chat_bad_words", hi, bad_words=["hello", " world"]),
        _chat("chat_allowed_token_ids", hi, allowed_token_ids=[1, 2, 3]),
        _chat("chat_cache_salt", hi, cache_salt="salt-123"),
        _chat("chat_priority", hi, priority=-5),
        _chat(
            "chat_kv_transfer_params",
            hi,
            kv_transfer_params={"do_remote_decode": True, "remote_host": "10.0.0.1", "remote_port": 5555},
        ),
        _chat("chat_vllm_xargs", hi, vllm_xargs={"custom": "x", "level": 2, "weights": [1, 2.5]}),
        _chat("chat_vllm_xargs_and_kv", hi, vllm_xargs={"z_last": 1}, kv_transfer_params={"do_remote_prefill": True}),
        _chat("chat_return_token_ids", hi, return_token_ids=True),
        _chat("chat_stream", hi, stream=True),
        _chat(
            "chat_stream_options",
            hi,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": False},
        ),
        _chat("chat_stream_false_with_null_options", hi, stream=False, stream_options=None),
        _chat("chat_truncate_prompt_tokens", [U(long_text(60))], truncate_prompt_tokens=10),
        _chat(
            "chat_truncate_prompt_tokens_left", [U(long_text(60))], truncate_prompt_tokens=10, truncation_side="left"
        ),
        _chat("chat_response_format_text", hi, response_format={"type": "text"}),
        # response_format, structured_outputs, required/named tool choice and strict tools all put
        # `structured_outputs` into sampling_params: a --tokens-only engine rejects such requests
        # ("Structured outputs requires a tokenizer ...", vllm/sampling_params.py), so the README
        # must say so.
        _chat("chat_response_format_json_object", hi, response_format={"type": "json_object"}),
        _chat(
            "chat_response_format_json_schema",
            hi,
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                        "required": ["b", "a"],
                    },
                },
            },
        ),
        _chat("chat_structured_outputs_choice", hi, structured_outputs={"choice": ["yes", "no"]}),
        _chat("chat_thinking_token_budget", hi, thinking_token_budget=64),
        _chat("chat_stream_interval", hi, stream=True, stream_interval=4),
        Case(
            "chat_empty_request_id_header",
            "parsers",
            CHAT,
            {"model": "tinyqwen3", "messages": hi},
            {"X-Request-Id": ""},
        ),
        _chat("chat_model_empty_string", hi, model=""),
        _chat("chat_user_name_field", [{"role": "user", "content": "Hi", "name": "alice"}]),
        _chat(
            "chat_assistant_content_parts",
            [
                U("Hi"),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}],
                },
                U("Again"),
            ],
        ),
        _chat(
            "chat_tool_content_parts",
            [
                *TOOL_HISTORY[:2],
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21C"}]},
            ],
            tools=[WEATHER_TOOL],
        ),
        _chat(
            "chat_kv_transfer_prompt_token_ids",
            hi,
            kv_transfer_params={"do_remote_decode": False, "prompt_token_ids": [151644, 872, 198, 9707]},
        ),
        _chat("chat_temperature_tiny", hi, temperature=0.001),
        _chat("chat_seed_negative_one", hi, seed=-1),
        _chat("chat_duplicate_stop_ids_and_bad_words", hi, stop_token_ids=[5, 5, 7], bad_words=["a", "a"]),
        _chat("err_chat_max_tokens_zero", hi, max_tokens=0),
        _chat("chat_truncate_prompt_tokens_minus_one", hi, truncate_prompt_tokens=-1),
        _chat("chat_top_logprobs_minus_one", hi, logprobs=True, top_logprobs=-1),
        _chat("chat_logit_bias_out_of_vocab", hi, logit_bias={"999999": 1.0}),
        _chat("chat_long_prompt_with_max_tokens", [U(long_text(5900))], max_tokens=8000),
    ]


def _chat_error_cases() -> list[Case]:
    hi = [U("Hi")]
    return [
        _chat("err_chat_unknown_model", hi, model="gpt-4o"),
        _chat("err_chat_prompt_too_long", [U(long_text(11500))]),
        _chat("err_chat_max_tokens_too_large", hi, max_tokens=20000),
        _chat("err_chat_template_untrusted", hi, chat_template=CUSTOM_TEMPLATE),
        _chat(
            "err_chat_template_kwargs_template_untrusted", hi, chat_template_kwargs={"chat_template": CUSTOM_TEMPLATE}
        ),
        Case(
            "err_chat_malformed_json",
            "parsers",
            CHAT,
            headers={"Content-Type": "application/json"},
            raw='{"model": "tinyqwen3", "messages": [}',
        ),
        Case(
            "err_chat_wrong_content_type",
            "parsers",
            CHAT,
            headers={"Content-Type": "text/plain"},
            raw='{"messages": [{"role": "user", "content": "Hi"}]}',
        ),
        Case("err_chat_body_is_array", "parsers", CHAT, body=[{"role": "user", "content": "Hi"}]),
        Case("err_chat_messages_missing", "parsers", CHAT, {"model": "tinyqwen3"}, _rid("x")),
        _chat("err_chat_messages_not_list", "Hi"),  # type: ignore[arg-type]
        _chat("err_chat_bad_role_type", [{"role": 123, "content": "Hi"}]),
        _chat("err_chat_temperature_string", hi, temperature="hot"),
        # pydantic validates in declaration order: max_tokens is reported before temperature
        _chat("err_chat_max_tokens_and_temperature_strings", hi, max_tokens="x", temperature="y"),
        _chat("err_chat_several_field_errors", hi, n="two", stop=[1], seed=2**63, top_k=1.5, logit_bias={"1": "a"}),
        _chat("chat_lax_bool_and_number_strings", hi, stream="true", max_tokens="12", temperature="0.5", echo="no"),
        _chat("err_chat_tools_empty", hi, tools=[]),
        _chat("err_chat_tool_choice_without_tools", hi, tool_choice="auto"),
        _chat("err_chat_tool_choice_invalid", hi, tools=[WEATHER_TOOL], tool_choice="sometimes"),
        _chat(
            "err_chat_tool_choice_named_unknown",
            hi,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        ),
        _chat("err_chat_stream_options_without_stream", hi, stream_options={"include_usage": True}),
        _chat("err_chat_top_logprobs_without_logprobs", hi, top_logprobs=3),
        _chat(
            "err_chat_continue_and_add_generation_prompt",
            [U("Hi"), A("Hel")],
            continue_final_message=True,
            add_generation_prompt=True,
        ),
        _chat("err_chat_use_beam_search", hi, use_beam_search=True),
        _chat("err_chat_json_schema_missing", hi, response_format={"type": "json_schema"}),
        _chat("err_chat_cache_salt_slash", hi, cache_salt="bad/salt"),
        _chat("err_chat_too_many_stop_strings", hi, stop=["a", "b", "c", "d", "e"]),
        _chat("err_chat_n_zero", hi, n=0),
        _chat("err_chat_greedy_n2", hi, n=2, temperature=0),
        _chat("err_chat_temperature_negative", hi, temperature=-1.0),
        _chat("err_chat_top_p_zero", hi, top_p=0.0),
        _chat("err_chat_logit_bias_bad_key", hi, logit_bias={"abc": 1.0}),
        _chat("err_chat_truncate_above_model_len", hi, truncate_prompt_tokens=MAX_MODEL_LEN + 1),
        _chat("chat_prompt_plus_max_tokens_over_model_len", [U(long_text(5900))], max_tokens=12000),
        _chat("err_chat_mm_processor_kwargs_untrusted", hi, mm_processor_kwargs={"size": 3}),
        _chat("err_chat_logprob_token_ids_without_logprobs", hi, logprob_token_ids=[1, 2]),
        _chat("chat_allowed_token_ids_empty", hi, allowed_token_ids=[]),
        _chat("err_chat_min_tokens_above_max_tokens", hi, min_tokens=10, max_tokens=5),
        _chat("err_chat_frequency_penalty_range", hi, frequency_penalty=3),
        _chat("err_chat_repetition_penalty_zero", hi, repetition_penalty=0),
        _chat("err_chat_top_k_invalid", hi, top_k=-2),
        _chat("err_chat_min_p_range", hi, min_p=2),
        _chat("err_chat_prompt_logprobs_with_stream", hi, prompt_logprobs=1, stream=True),
        _chat("err_chat_request_id_int", hi, request_id=5),
        _chat("err_chat_user_content_null", [{"role": "user", "content": None}]),
        _chat("err_chat_messages_empty", []),
        _chat("err_chat_stream_options_stream_false", hi, stream=False, stream_options={"include_usage": True}),
        Case(
            "err_unknown_route_generate",
            "parsers",
            "/inference/v1/generate",
            {"token_ids": [1, 2], "sampling_params": {}},
        ),
    ]


def _cmpl_cases() -> list[Case]:
    return [
        _cmpl("cmpl_string", "Once upon a time"),
        _cmpl("cmpl_string_random_id", "Once upon a time", rid=False),
        _cmpl("cmpl_list_of_strings", ["First prompt", "Second prompt", "Third"]),
        _cmpl("cmpl_list_of_strings_random_id", ["First prompt", "Second prompt"], rid=False),
        _cmpl("cmpl_single_string_in_list", ["Only one"]),
        _cmpl("cmpl_token_ids", [9707, 1879, 0, 151643]),
        _cmpl("cmpl_list_of_token_ids", [[9707, 1879], [1, 2, 3]]),
        _cmpl("cmpl_body_request_id", "Hello", rid=False, request_id="cmpl-body-id"),
        _cmpl("cmpl_model_omitted", "Hello", model=None),
        _cmpl("cmpl_unicode", "Grüße 👋🏽 日本語"),
        _cmpl("cmpl_echo", "Echo me", echo=True),
        _cmpl("cmpl_echo_max_tokens_0", "Echo me", echo=True, max_tokens=0),
        _cmpl("cmpl_max_tokens_null", "Hello", max_tokens=None),
        _cmpl("err_cmpl_greedy_n2", "Hello", temperature=0, n=2),
        _cmpl(
            "cmpl_sampling",
            "Hello",
            temperature=0.7,
            seed=7,
            top_p=0.9,
            top_k=3,
            stop=["\n"],
            n=2,
            logprobs=3,
            max_tokens=5,
            presence_penalty=0.1,
        ),
        _cmpl(
            "cmpl_logit_bias_min_tokens",
            "Hello",
            logit_bias={"42": 1.0},
            min_tokens=2,
            ignore_eos=True,
            skip_special_tokens=False,
            include_stop_str_in_output=True,
        ),
        _cmpl("cmpl_stream_options", "Hello", stream=True, stream_options={"include_usage": True}),
        _cmpl("cmpl_truncate_prompt_tokens", long_text(40), truncate_prompt_tokens=5),
        _cmpl("cmpl_response_format_json_object", "Hello", response_format={"type": "json_object"}),
        _cmpl(
            "cmpl_kv_transfer_params",
            "Hello",
            kv_transfer_params={"do_remote_decode": True},
            cache_salt="s",
            priority=3,
        ),
        _cmpl("cmpl_return_token_ids", "Hello", return_token_ids=True, bad_words=["foo"]),
        _cmpl("cmpl_plain_config", "Hello", config="plain"),
        _cmpl("cmpl_return_token_offsets", "Hello world", return_token_offsets=True),
        _cmpl("cmpl_list_echo", ["a", "b"], echo=True, max_tokens=3),
        _cmpl("cmpl_special_tokens_in_text", "<|im_start|>user\nHi<|im_end|>"),
        _cmpl("cmpl_truncate_left", long_text(40), truncate_prompt_tokens=5, truncation_side="left"),
        _cmpl("err_cmpl_token_ids_and_strings_mixed", ["a", [1, 2]]),
        _cmpl("err_cmpl_echo_suffix", "x", echo=True, suffix="y"),
        _cmpl("err_cmpl_n_zero", "Hello", n=0),
        _cmpl("err_cmpl_unknown_model", "Hello", model="nope"),
        _cmpl("err_cmpl_prompt_too_long", [1] * (MAX_MODEL_LEN + 1)),
        _cmpl("err_cmpl_max_tokens_too_large", "Hello", max_tokens=MAX_MODEL_LEN + 10),
        _cmpl("err_cmpl_empty_string", ""),
        _cmpl("err_cmpl_empty_list", []),
        Case("err_cmpl_prompt_missing", "parsers", CMPL, {"model": "tinyqwen3"}, _rid("x")),
        _cmpl("err_cmpl_use_beam_search", "Hello", use_beam_search=True),
        _cmpl("err_cmpl_suffix", "def f(", suffix="return 1"),
        _cmpl("err_cmpl_stream_options_without_stream", "Hello", stream_options={"include_usage": True}),
        _cmpl("err_cmpl_negative_token_id", [1, -5]),
    ]


def _config_cases() -> list[Case]:
    hi = [U("Hi")]
    weather = [U("Weather in Paris?")]
    named = {"type": "function", "function": {"name": "get_weather"}}
    return [
        # noauto: --tool-call-parser hermes without --enable-auto-tool-choice
        _chat("noauto_tools_implicit_auto", weather, "noauto", tools=[WEATHER_TOOL]),
        _chat("noauto_tool_choice_auto", weather, "noauto", tools=[WEATHER_TOOL], tool_choice="auto"),
        _chat("noauto_tool_choice_none", weather, "noauto", tools=[WEATHER_TOOL], tool_choice="none"),
        _chat("noauto_tool_choice_required", weather, "noauto", tools=[WEATHER_TOOL], tool_choice="required"),
        _chat("noauto_tool_choice_named", weather, "noauto", tools=[WEATHER_TOOL], tool_choice=named),
        _chat("noauto_single_turn", hi, "noauto"),
        # plain: no parsers
        _chat("plain_single_turn", hi, "plain"),
        _chat("plain_tool_choice_named", weather, "plain", tools=[WEATHER_TOOL], tool_choice=named),
        _chat("plain_tool_choice_required", weather, "plain", tools=[WEATHER_TOOL], tool_choice="required"),
        _chat("plain_tool_choice_auto", weather, "plain", tools=[WEATHER_TOOL], tool_choice="auto"),
        _chat("plain_tool_choice_none", weather, "plain", tools=[WEATHER_TOOL], tool_choice="none"),
        _chat("plain_enable_thinking_false", hi, "plain", chat_template_kwargs={"enable_thinking": False}),
        _chat("plain_include_reasoning_false", hi, "plain", include_reasoning=False),
        _chat(
            "plain_response_format_json_schema",
            hi,
            "plain",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        ),
        _chat("plain_skip_special_tokens_default", hi, "plain"),
        _chat("plain_tool_history", TOOL_HISTORY, "plain"),
        # trust: --trust-request-chat-template, default kwargs enable_thinking false
        _chat("trust_default_kwargs", hi, "trust"),
        _chat("trust_request_chat_template", [S("sys"), U("Hi")], "trust", chat_template=CUSTOM_TEMPLATE),
        _chat(
            "trust_chat_template_kwargs_template", hi, "trust", chat_template_kwargs={"chat_template": CUSTOM_TEMPLATE}
        ),
        _chat("trust_override_enable_thinking", hi, "trust", chat_template_kwargs={"enable_thinking": True}),
        _chat("trust_reasoning_effort", hi, "trust", reasoning_effort="medium"),
        _chat("trust_tools", weather, "trust", tools=[WEATHER_TOOL]),
        # deepseek tokenizer family + deepseek_r1 reasoning parser
        _chat("deepseek_single_turn", hi, "deepseek", model="tinydeepseek"),
        _chat(
            "deepseek_thinking_false",
            hi,
            "deepseek",
            model="tinydeepseek",
            chat_template_kwargs={"enable_thinking": False},
        ),
        _chat(
            "deepseek_multi_turn_system",
            [S("Be nice."), U("Hi"), A("Hello!"), U("Bye")],
            "deepseek",
            model="tinydeepseek",
        ),
        _chat(
            "deepseek_tools_none", weather, "deepseek", model="tinydeepseek", tools=[WEATHER_TOOL], tool_choice="none"
        ),
        _chat("deepseek_tools_implicit_auto", weather, "deepseek", model="tinydeepseek", tools=[WEATHER_TOOL]),
        _chat("deepseek_unicode", [U("Grüße 👋🏽 日本語")], "deepseek", model="tinydeepseek"),
        _cmpl("deepseek_completion", "Once upon a time", "deepseek", model="tinydeepseek"),
        _cmpl(
            "deepseek_completion_no_special",
            "Once upon a time",
            "deepseek",
            model="tinydeepseek",
            add_special_tokens=False,
        ),
        _chat("err_deepseek_wrong_model", hi, "deepseek", model="tinyqwen3"),
        Case("deepseek_tokenize_prompt", "deepseek", "/tokenize", {"prompt": "Hello world"}),
        # apikey: --api-key sekret
        _chat("apikey_missing", hi, "apikey"),
        Case(
            "apikey_wrong",
            "apikey",
            CHAT,
            {"model": "tinyqwen3", "messages": hi},
            {"X-Request-Id": "apikey_wrong", "Authorization": "Bearer wrong"},
        ),
        Case(
            "apikey_bad_scheme",
            "apikey",
            CHAT,
            {"model": "tinyqwen3", "messages": hi},
            {"X-Request-Id": "apikey_bad_scheme", "Authorization": "Basic sekret"},
        ),
        Case(
            "apikey_ok",
            "apikey",
            CHAT,
            {"model": "tinyqwen3", "messages": hi},
            {"X-Request-Id": "apikey_ok", "Authorization": "Bearer sekret"},
        ),
        Case(
            "apikey_ok_completions",
            "apikey",
            CMPL,
            {"model": "tinyqwen3", "prompt": "Hi"},
            {"X-Request-Id": "apikey_ok_completions", "Authorization": "Bearer sekret"},
        ),
        Case("apikey_models_missing", "apikey", "/v1/models", method="GET"),
        Case("apikey_tokenize_unguarded", "apikey", "/tokenize", {"prompt": "Hi"}),
        Case("apikey_version_unguarded", "apikey", "/version", method="GET"),
    ]


def _misc_cases() -> list[Case]:
    return [
        Case("models", "parsers", "/v1/models", method="GET"),
        Case("version", "parsers", "/version", method="GET"),
        Case("health", "parsers", "/health", method="GET"),
        Case("load", "parsers", "/load", method="GET"),
        Case("tokenize_prompt", "parsers", "/tokenize", {"model": "tinyqwen3", "prompt": "Hello world"}),
        Case(
            "tokenize_prompt_token_strs",
            "parsers",
            "/tokenize",
            {"prompt": "Grüße 👋🏽 <|im_end|>", "return_token_strs": True},
        ),
        Case("tokenize_prompt_no_special", "parsers", "/tokenize", {"prompt": "Hi", "add_special_tokens": False}),
        Case(
            "tokenize_messages",
            "parsers",
            "/tokenize",
            {"model": "tinyqwen3", "messages": [S("sys"), U("Hi")], "return_token_strs": True},
        ),
        Case(
            "tokenize_messages_no_generation_prompt",
            "parsers",
            "/tokenize",
            {"messages": [U("Hi"), A("Hello")], "add_generation_prompt": False},
        ),
        Case("tokenize_messages_tools", "parsers", "/tokenize", {"messages": [U("Weather?")], "tools": [WEATHER_TOOL]}),
        Case(
            "tokenize_messages_thinking_false",
            "parsers",
            "/tokenize",
            {"messages": [U("Hi")], "chat_template_kwargs": {"enable_thinking": False}},
        ),
        Case("err_tokenize_unknown_model", "parsers", "/tokenize", {"model": "nope", "prompt": "Hi"}),
        Case("err_tokenize_no_prompt", "parsers", "/tokenize", {"model": "tinyqwen3"}),
        Case("detokenize", "parsers", "/detokenize", {"model": "tinyqwen3", "tokens": [9707, 1879]}),
        Case(
            "detokenize_special",
            "parsers",
            "/detokenize",
            {"tokens": [151644, 872, 198, 13048, 151645, 151667, 151668]},
        ),
        Case("detokenize_empty", "parsers", "/detokenize", {"tokens": []}),
        Case("detokenize_out_of_vocab", "parsers", "/detokenize", {"tokens": [9707, 999999]}),
        Case("tokenize_messages_empty_tools", "parsers", "/tokenize", {"messages": [U("Hi")], "tools": []}),
        Case(
            "tokenize_messages_continue_final",
            "parsers",
            "/tokenize",
            {"messages": [U("Hi"), A("Hel")], "continue_final_message": True, "add_generation_prompt": False},
        ),
        Case("err_detokenize_negative", "parsers", "/detokenize", {"tokens": [1, -1]}),
        Case("err_detokenize_unknown_model", "parsers", "/detokenize", {"model": "nope", "tokens": [1]}),
    ]


MSG = "/v1/messages/render"
RESP = "/v1/responses/render"

ANTHROPIC_WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"],
    },
}

RESPONSES_WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"],
    },
}


def _msg(
    name: str,
    messages: Any,
    config: str = "parsers",
    *,
    rid: bool = True,
    model: str | None = "tinyqwen3",
    max_tokens: Any = 64,
    **extra: Any,
) -> Case:
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body["messages"] = messages
    body.update(extra)
    return Case(name, config, MSG, body, _rid(name) if rid else {})


def _resp(
    name: str,
    input_: Any,
    config: str = "parsers",
    *,
    model: str | None = "tinyqwen3",
    request_id: str | None = "resp_fixed",
    **extra: Any,
) -> Case:
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    body["input"] = input_
    if request_id is not None:
        body["request_id"] = request_id
    body.update(extra)
    return Case(name, config, RESP, body, {})


def _messages_cases() -> list[Case]:
    hi = [U("Hi")]
    tool_turns = [
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
    return [
        _msg("msg_hi", hi),
        _msg("msg_hi_plain", hi, "plain"),
        _msg("msg_no_rid", hi, rid=False),
        _msg("msg_system_string", hi, system="You are terse."),
        _msg(
            "msg_system_blocks",
            hi,
            system=[
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
                {"type": "text", "text": "You are terse. "},
                {"type": "text", "text": "Answer in French."},
            ],
        ),
        _msg("msg_inline_system", [U("Hi"), A("Hello"), {"role": "system", "content": "Be brief."}, U("Bye")]),
        _msg(
            "msg_inline_system_blocks",
            [{"role": "system", "content": [{"type": "text", "text": "Rule 1."}]}, U("Hi")],
            system="Top.",
        ),
        _msg("msg_multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke")]),
        _msg(
            "msg_text_blocks",
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}],
                }
            ],
        ),
        _msg("msg_single_text_block", [{"role": "user", "content": [{"type": "text", "text": "Only."}]}]),
        _msg("msg_empty_text_block", [{"role": "user", "content": [{"type": "text", "text": ""}]}, U("Hi")]),
        _msg(
            "msg_thinking_history",
            [
                U("2+2?"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Simple sum.", "signature": "s"},
                        {"type": "redacted_thinking", "data": "b64"},
                        {"type": "text", "text": "4"},
                    ],
                },
                U("3+3?"),
            ],
        ),
        _msg("msg_tools_auto", [U("Weather in Paris?")], tools=[ANTHROPIC_WEATHER_TOOL]),
        _msg("msg_tools_history", tool_turns, tools=[ANTHROPIC_WEATHER_TOOL]),
        _msg(
            "msg_tool_result_blocks",
            [
                U("Weather?"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo", "unit": "c"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}],
                        }
                    ],
                },
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg("msg_tool_schema_no_type", [U("Ping")], tools=[{"name": "ping", "input_schema": {"properties": {}}}]),
        _msg("msg_tool_choice_any", [U("Weather?")], tools=[ANTHROPIC_WEATHER_TOOL], tool_choice={"type": "any"}),
        _msg(
            "msg_tool_choice_tool",
            [U("Weather?")],
            tools=[ANTHROPIC_WEATHER_TOOL],
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
        _msg("msg_tool_choice_none", [U("Weather?")], tools=[ANTHROPIC_WEATHER_TOOL], tool_choice={"type": "none"}),
        _msg(
            "msg_tool_choice_auto_noparallel",
            [U("Weather?")],
            tools=[ANTHROPIC_WEATHER_TOOL],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        ),
        _msg("msg_tools_noauto", [U("Weather?")], "noauto", tools=[ANTHROPIC_WEATHER_TOOL]),
        _msg("msg_tools_plain", [U("Weather?")], "plain", tools=[ANTHROPIC_WEATHER_TOOL]),
        _msg(
            "msg_tool_addition",
            [
                {
                    "role": "system",
                    "content": [
                        {
                            "type": "tool_addition",
                            "tool": {
                                "type": "tool_definition",
                                "definition": {"name": "ping", "input_schema": {"type": "object"}},
                            },
                        }
                    ],
                },
                U("Ping?"),
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg(
            "msg_tool_removal",
            [
                {
                    "role": "system",
                    "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}}],
                },
                U("Weather?"),
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg("msg_thinking_enabled", hi, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048}),
        _msg("msg_thinking_disabled", hi, thinking={"type": "disabled"}),
        _msg("msg_thinking_adaptive", hi, thinking={"type": "adaptive"}, output_config={"effort": "high"}),
        _msg(
            "msg_output_format",
            hi,
            output_config={
                "format": {
                    "type": "json_schema",
                    "schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
                }
            },
        ),
        _msg(
            "msg_sampling",
            hi,
            temperature=0.2,
            top_p=0.9,
            top_k=20,
            stop_sequences=["\n\n", "END"],
            metadata={"user_id": "u1"},
        ),
        _msg("msg_stream", hi, stream=True),
        _msg(
            "msg_cache_salt_kv", hi, cache_salt="salt-123", kv_transfer_params={"do_remote_decode": True}, max_tokens=1
        ),
        _msg("msg_chat_template_kwargs", hi, chat_template_kwargs={"enable_thinking": False}),
        _msg("msg_assistant_prefill", [U("Say hi"), A("Hi")]),
        _msg("msg_unicode", [U("Grüße 👋🏽 — 日本語")]),
        _msg("msg_deepseek", [U("Hi"), A("Hello"), U("Bye")], "deepseek", model="tinydeepseek", system="Sys."),
        _msg("msg_deepseek_thinking_disabled", hi, "deepseek", model="tinydeepseek", thinking={"type": "disabled"}),
        _msg(
            "msg_assistant_tool_result",
            [
                U("Hi"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t9", "content": [{"type": "text", "text": "odd"}]}
                    ],
                },
                U("Go"),
            ],
        ),
        _msg(
            "msg_tool_result_reference",
            [
                U("Find tools"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "content": [
                                {"type": "text", "text": "found"},
                                {"type": "tool_reference", "tool_name": "get_weather"},
                            ],
                        }
                    ],
                },
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg(
            "msg_parallel_tool_use",
            [
                U("Weather in Paris and Oslo?"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "a", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "b", "name": "get_weather", "input": {"city": "Oslö"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "a", "content": "20C"},
                        {"type": "tool_result", "tool_use_id": "b", "content": "5C"},
                    ],
                },
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg("msg_trust_defaults", hi, "trust", thinking={"type": "adaptive"}, output_config={"effort": "low"}),
        _msg(
            "msg_deepseek_tools_history",
            [
                U("2+2?"),
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "add"}, {"type": "text", "text": "4"}],
                },
                U("ok"),
            ],
            "deepseek",
            model="tinydeepseek",
        ),
        _msg("msg_long", [U(long_text(1500))]),
        # a template that rejects non-leading system messages: they are merged into the first one,
        # and thinking "disabled" maps to effort "low" (the template ignores reasoning_effort)
        _msg(
            "msg_sysfirst_inline_system",
            [U("Hi"), A("Hello"), {"role": "system", "content": "Be brief."}, U("Bye")],
            "sysfirst",
            system="Top. ",
        ),
        _msg(
            "msg_sysfirst_inline_system_only",
            [
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "x-anthropic-billing-header: a"},
                        {"type": "text", "text": "Only."},
                    ],
                },
                U("Hi"),
            ],
            "sysfirst",
        ),
        _msg("msg_sysfirst_thinking_disabled", [U("Hi")], "sysfirst", thinking={"type": "disabled"}),
        _chat("err_chat_sysfirst_inline_system", [U("Hi"), S("Late")], "sysfirst"),
        _resp("resp_sysfirst", [{"role": "user", "content": "Hi"}], "sysfirst", instructions="Sys."),
        _msg(
            "err_msg_tool_result_image",
            [
                U("Look"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t3", "name": "get_weather", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t3",
                            "content": [
                                {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:9/x.png"}}
                            ],
                        }
                    ],
                },
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg("err_msg_tool_no_schema", hi, tools=[{"name": "x"}]),
        _msg("err_msg_bad_thinking_type", hi, thinking={"type": "sometimes"}),
        _msg("err_msg_bad_effort", hi, output_config={"effort": "extreme"}),
        _msg(
            "err_msg_system_tool_change",
            hi,
            system=[{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}}],
        ),
        _msg("err_msg_content_not_list", [{"role": "user", "content": 5}]),
        # errors
        _msg("err_msg_missing_max_tokens", hi, max_tokens=None),
        _msg("err_msg_zero_max_tokens", hi, max_tokens=0),
        _msg("err_msg_unknown_model", hi, model="nope"),
        _msg("err_msg_missing_messages", None),
        _msg("err_msg_bad_role", [{"role": "tool", "content": "x"}]),
        _msg("err_msg_bad_block_type", [{"role": "user", "content": [{"type": "video", "text": "x"}]}]),
        _msg("err_msg_tool_choice_no_name", hi, tools=[ANTHROPIC_WEATHER_TOOL], tool_choice={"type": "tool"}),
        _msg("err_msg_thinking_budget_small", hi, thinking={"type": "enabled", "budget_tokens": 100}),
        _msg(
            "err_msg_thinking_budget_over_max", hi, max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2048}
        ),
        _msg(
            "err_msg_tool_change_in_user",
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}}],
                }
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg(
            "err_msg_tool_addition_unknown",
            [
                {
                    "role": "system",
                    "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "missing"}}],
                },
                U("Hi"),
            ],
            tools=[ANTHROPIC_WEATHER_TOOL],
        ),
        _msg("err_msg_too_many_stops", hi, stop_sequences=["a", "b", "c", "d", "e"]),
        _msg("err_msg_max_tokens_over_len", hi, max_tokens=100000),
        _msg("err_msg_empty_model", hi, model=""),
        _msg(
            "err_msg_image",
            [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        },
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
        ),
        Case("err_msg_invalid_json", "parsers", MSG, raw="{not json", headers={"Content-Type": "application/json"}),
        _msg("err_msg_no_api_key", hi, "apikey", model=None, rid=False),
        Case(
            "msg_api_key",
            "apikey",
            MSG,
            {"model": "tinyqwen3", "max_tokens": 8, "messages": hi},
            {"Authorization": "Bearer sekret", "X-Request-Id": "msg_api_key"},
        ),
        Case(
            "resp_api_key",
            "apikey",
            RESP,
            {"input": "Hi", "request_id": "resp_fixed"},
            {"Authorization": "Bearer sekret"},
        ),
    ]


def _responses_cases() -> list[Case]:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "21C and clear"}
    return [
        _resp("resp_string", "Hi"),
        _resp("resp_string_plain", "Hi", "plain"),
        _resp("resp_no_request_id", "Hi", request_id=None),
        _resp("resp_instructions", "Hi", instructions="You are terse."),
        _resp(
            "resp_message_items",
            [
                {"role": "system", "content": "Sys."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"},
            ],
        ),
        _resp(
            "resp_input_text_parts",
            [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Part one."},
                        {"type": "input_text", "text": "Part two."},
                    ],
                }
            ],
        ),
        _resp(
            "resp_output_message",
            [
                {"role": "user", "content": "Hi"},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
                },
                {"role": "user", "content": "Again"},
            ],
        ),
        _resp(
            "resp_reasoning_item",
            [
                {"role": "user", "content": "2+2?"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Sum."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
                {"role": "user", "content": "3+3?"},
            ],
        ),
        _resp("resp_tools", "Weather in Paris?", tools=[RESPONSES_WEATHER_TOOL]),
        _resp(
            "resp_tool_history",
            [{"role": "user", "content": "Weather in Paris?"}, call, output],
            tools=[RESPONSES_WEATHER_TOOL],
        ),
        _resp("resp_tool_choice_none", "Weather?", tools=[RESPONSES_WEATHER_TOOL], tool_choice="none"),
        _resp("resp_tool_choice_required", "Weather?", tools=[RESPONSES_WEATHER_TOOL], tool_choice="required"),
        _resp(
            "resp_tool_choice_named",
            "Weather?",
            tools=[RESPONSES_WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
        ),
        _resp("resp_tools_noauto", "Weather?", "noauto", tools=[RESPONSES_WEATHER_TOOL]),
        _resp("resp_reasoning_effort", "Hi", reasoning={"effort": "low"}),
        _resp("resp_reasoning_none", "Hi", reasoning={"effort": "none"}),
        _resp(
            "resp_text_json_schema",
            "Hi",
            text={
                "format": {
                    "type": "json_schema",
                    "name": "a",
                    "schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
                }
            },
        ),
        _resp("resp_text_json_object", "Hi", text={"format": {"type": "json_object"}}),
        _resp(
            "resp_sampling",
            "Hi",
            max_output_tokens=32,
            temperature=0.3,
            top_p=0.8,
            top_k=5,
            seed=7,
            stop=["END"],
            frequency_penalty=0.1,
        ),
        _resp("resp_logprobs", "Hi", include=["message.output_text.logprobs"], top_logprobs=3),
        _resp("resp_stream", "Hi", stream=True),
        _resp("resp_truncation_auto", "Hi", truncation="auto"),
        _resp(
            "resp_kv_params",
            "Hi",
            kv_transfer_params={"do_remote_decode": True},
            max_output_tokens=1,
            cache_salt="salt",
        ),
        _resp("resp_chat_template_kwargs", "Hi", chat_template_kwargs={"enable_thinking": False}),
        _resp(
            "resp_partial_assistant",
            [
                {"role": "user", "content": "Say hi"},
                {
                    "type": "message",
                    "role": "assistant",
                    "status": "in_progress",
                    "content": [{"type": "output_text", "text": "Hi"}],
                },
            ],
        ),
        _resp("resp_deepseek", "Hi", "deepseek", model="tinydeepseek", instructions="Sys."),
        _resp("resp_store_metadata", "Hi", store=False, metadata={"k": "v"}, user="u1", service_tier="auto"),
        _resp(
            "resp_developer_role",
            [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            instructions="Sys.",
        ),
        _resp(
            "resp_two_calls_merged",
            [
                {"role": "user", "content": "Weather in Paris and Oslo?"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Two cities."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "20C"},
                {"type": "function_call_output", "call_id": "c2", "output": "5C"},
            ],
            tools=[RESPONSES_WEATHER_TOOL],
        ),
        _resp(
            "resp_assistant_then_call",
            [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            tools=[RESPONSES_WEATHER_TOOL],
        ),
        _resp(
            "resp_custom_tool_call",
            [
                {"role": "user", "content": "Run it"},
                {"type": "custom_tool_call", "call_id": "k1", "name": "shell", "input": "ls -la"},
                {"type": "custom_tool_call_output", "call_id": "k1", "output": "a.txt"},
            ],
        ),
        _resp("resp_text_format_text", "Hi", text={"format": {"type": "text"}}),
        _resp("resp_web_search_tool", "Hi", tools=[{"type": "web_search"}, RESPONSES_WEATHER_TOOL]),
        _resp("resp_strict_tool", "Weather?", tools=[{**RESPONSES_WEATHER_TOOL, "strict": True}]),
        _resp("resp_no_parallel", "Weather?", tools=[RESPONSES_WEATHER_TOOL], parallel_tool_calls=False),
        _resp("resp_trust_defaults", "Hi", "trust", reasoning={"effort": "high"}),
        _resp("resp_deepseek_effort", "Hi", "deepseek", model="tinydeepseek", reasoning={"effort": "none"}),
        _resp("resp_long_truncated", long_text(30000), truncation="auto", max_output_tokens=16),
        _resp("err_resp_long_not_truncated", long_text(30000)),
        _resp(
            "resp_logit_bias_penalties",
            "Hi",
            logit_bias={"15": 5.0},
            presence_penalty=1.5,
            min_p=0.05,
            repetition_penalty=1.1,
            ignore_eos=True,
            stop_token_ids=[1, 2],
            skip_special_tokens=True,
        ),
        _resp(
            "err_resp_input_image",
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                        {"type": "input_text", "text": "What is it?"},
                    ],
                }
            ],
        ),
        _resp("err_resp_bad_penalty", "Hi", presence_penalty=3),
        _resp("err_resp_bad_effort", "Hi", reasoning={"effort": "maximum"}),
        _resp("err_resp_bad_include", "Hi", include=["everything"]),
        _resp("err_resp_bad_tool_choice", "Hi", tool_choice="sometimes"),
        _resp("err_resp_item_not_object", ["Hi"]),
        # errors
        _resp("err_resp_previous_response_id", "Hi", previous_response_id="resp_123"),
        _resp("err_resp_unknown_model", "Hi", model="nope"),
        _resp("err_resp_missing_input", None),
        _resp(
            "err_resp_encrypted_reasoning",
            [{"role": "user", "content": "Hi"}, {"type": "reasoning", "summary": [], "encrypted_content": "abc"}],
        ),
        _resp("err_resp_unsupported_item", [{"type": "web_search_call", "id": "ws_1", "status": "completed"}]),
        _resp("err_resp_prompt_template", "Hi", prompt={"id": "pmpt_1"}),
        _resp("err_resp_background_no_store", "Hi", background=True, store=False),
        _resp("err_resp_max_output_over_len", "Hi", max_output_tokens=100000),
        _resp("err_resp_bad_temperature_type", "Hi", temperature="hot"),
        _resp(
            "err_resp_both_structured",
            "Hi",
            text={"format": {"type": "json_object"}},
            structured_outputs={"json_object": True},
        ),
        _resp("err_resp_untrusted_template_kwargs", "Hi", chat_template_kwargs={"chat_template": "{{ 1 }}"}),
        Case("err_resp_invalid_json", "parsers", RESP, raw="[1,", headers={"Content-Type": "application/json"}),
    ]


def all_cases() -> list[Case]:
    cases = (
        _chat_cases()
        + _chat_error_cases()
        + _cmpl_cases()
        + _config_cases()
        + _misc_cases()
        + _messages_cases()
        + _responses_cases()
    )
    names = [c.name for c in cases]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"duplicate case names: {duplicates}"
    for case in cases:
        assert case.config in CONFIGS, case
    return cases


CASES: dict[str, Case] = {c.name: c for c in all_cases()}


# -- sending a request ---------------------------------------------------------------------------


def encode_request(request: dict[str, Any]) -> tuple[str, str, dict[str, str], bytes | None]:
    """(method, path, headers, body bytes) for a stored request; identical bytes for both servers."""
    headers = dict(request.get("headers") or {})
    content: bytes | None = None
    if "raw" in request:
        content = request["raw"].encode("utf-8")
    elif "json" in request:
        content = json.dumps(request["json"], ensure_ascii=False).encode("utf-8")
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    return request["method"], request["path"], headers, content


def decode_response(status: int, content_type: str, body: bytes) -> Any:
    if "json" in content_type.lower():
        try:
            return json.loads(body)
        except ValueError:
            pass
    return body.decode("utf-8", errors="replace")


def send(client: Any, request: dict[str, Any]) -> tuple[int, Any]:
    """Send with an httpx.Client or a starlette TestClient; return (status, parsed body)."""
    method, path, headers, content = encode_request(request)
    response = client.request(method, path, headers=headers, content=content)
    return response.status_code, decode_response(
        response.status_code, response.headers.get("content-type", ""), response.content
    )


# -- comparison ----------------------------------------------------------------------------------

_RANDOM_ID = re.compile(r"^(chatcmpl-|cmpl-|resp_)([0-9a-f]{16})((?:-\d+)?)$")
_PERM_ID = re.compile(r"^modelperm-[0-9a-f]{16}$")


def has_fixed_request_id(request: dict[str, Any]) -> bool:
    if any(k.lower() == "x-request-id" for k in request.get("headers") or {}):
        return True
    body = request.get("json")
    return isinstance(body, dict) and body.get("request_id") is not None


def normalize(value: Any, request: dict[str, Any], model_dir: str | None = None) -> Any:
    """Replace what legitimately differs run to run: random request ids (only when the request fixed
    none), `created` timestamps, `/v1/models` permission ids, and the model folder's path."""
    random_ids: dict[str, str] = {}
    randomize = not has_fixed_request_id(request)

    def walk(v: Any, key: str | None) -> Any:
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, key) for x in v]
        if key == "created" and isinstance(v, int) and not isinstance(v, bool):
            return "<created>"
        if isinstance(v, str):
            if randomize and key == "request_id" and (m := _RANDOM_ID.match(v)):
                token = random_ids.setdefault(m.group(2), f"<random-{len(random_ids) + 1}>")
                return f"{m.group(1)}{token}{m.group(3)}"
            if key == "id" and _PERM_ID.match(v):
                return "modelperm-<random>"
            if model_dir and v == model_dir:
                return MODEL_DIR_PLACEHOLDER
        return v

    return walk(copy.deepcopy(value), None)


def _kind(v: Any) -> str:
    return "bool" if isinstance(v, bool) else type(v).__name__


def _short(v: Any, limit: int = 160) -> str:
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"...<{len(text)} chars>"


def diff_json(expected: Any, actual: Any, path: str = "$") -> list[str]:
    """Exact structural diff, key order and int/float/bool kinds included. Lines read `path: ours X, vLLM Y`."""
    out: list[str] = []
    if isinstance(expected, dict) and isinstance(actual, dict):
        missing = [k for k in expected if k not in actual]
        extra = [k for k in actual if k not in expected]
        for k in missing:
            out.append(f"{path}.{k}: missing in ours, vLLM {_short(expected[k])}")
        for k in extra:
            out.append(f"{path}.{k}: extra in ours {_short(actual[k])}, absent in vLLM")
        common_e = [k for k in expected if k in actual]
        common_a = [k for k in actual if k in expected]
        if common_e != common_a:
            out.append(f"{path}: key order ours {common_a}, vLLM {common_e}")
        for k in common_e:
            out.extend(diff_json(expected[k], actual[k], f"{path}.{k}"))
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            if all(not isinstance(x, dict | list) for x in expected + actual):
                return [f"{path}: ours {_short(actual)}, vLLM {_short(expected)}"]
            out.append(f"{path}: length ours {len(actual)}, vLLM {len(expected)}")
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            out.extend(diff_json(e, a, f"{path}[{i}]"))
        return out
    if _kind(expected) != _kind(actual) or expected != actual:
        return [f"{path}: ours {_short(actual)}, vLLM {_short(expected)}"]
    return out


def _summary(body: Any) -> str:
    if _is_error_body(body):
        err = body["error"]
        return (
            f"error type={err.get('type')!r} param={err.get('param')!r} code={err.get('code')!r} "
            f"message={_short(err.get('message'), 400)}"
        )
    return _short(body, 300)


def _is_error_body(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


def compare_response(
    request: dict[str, Any],
    expected_status: int,
    expected: Any,
    actual_status: int,
    actual: Any,
    *,
    expected_model_dir: str | None = None,
    actual_model_dir: str | None = None,
) -> list[str]:
    """Differences between vLLM's (`expected`) and our (`actual`) response; empty when at parity."""
    diffs: list[str] = []
    if expected_status != actual_status:
        diffs.append(f"status: ours {actual_status}, vLLM {expected_status}")
        if _is_error_body(expected) or _is_error_body(actual):
            # one side succeeded and the other failed, or both failed differently: show both, no field diff
            return [*diffs, f"vLLM body: {_summary(expected)}", f"ours body: {_summary(actual)}"]
    if 200 <= expected_status < 300:
        diffs += diff_json(
            normalize(expected, request, expected_model_dir), normalize(actual, request, actual_model_dir)
        )
        return diffs
    if not _is_error_body(expected):
        # non-standard error bodies ({"error": "Unauthorized"}, {"detail": "Not Found"}): exact
        return diffs + diff_json(expected, actual)
    if not _is_error_body(actual):
        return [*diffs, f"$: ours {_short(actual)}, vLLM error body {_short(expected)}"]
    exp_err, act_err = expected["error"], actual["error"]
    for key in ("type", "param", "code"):
        if key not in act_err:
            diffs.append(f"$.error.{key}: missing in ours, vLLM {_short(exp_err.get(key))}")
        elif _kind(exp_err.get(key)) != _kind(act_err[key]) or exp_err.get(key) != act_err[key]:
            diffs.append(f"$.error.{key}: ours {_short(act_err[key])}, vLLM {_short(exp_err.get(key))}")
    exp_msg, act_msg = exp_err.get("message", ""), act_err.get("message")
    if exp_err.get("type") in ("BadRequestError", "NotFoundError"):
        if exp_msg != act_msg:
            diffs.append(f"$.error.message: ours {_short(act_msg, 400)}, vLLM {_short(exp_msg, 400)}")
    elif exp_err.get("type") == "Bad Request":
        # A documented difference: pydantic lists one error per member of a union type (e.g. 11
        # for a bad message role); we report the first one. Type, param and code match exactly.
        # The first error's location and message must be identical.
        prefix = exp_msg.split(":", 1)[0]
        if re.fullmatch(r"\d+ validation errors?", prefix):
            ok = (
                isinstance(act_msg, str)
                and re.match(r"\d+ validation errors?:", act_msg) is not None
                and _first_error(act_msg) == _first_error(exp_msg)
            )
        else:
            ok = act_msg == exp_msg
        if not ok:
            diffs.append(
                f"$.error.message: ours {_short(act_msg, 400)}, first error differs from vLLM's {_short(exp_msg, 400)}"
            )
    elif exp_msg != act_msg:
        diffs.append(f"$.error.message: ours {_short(act_msg, 400)}, vLLM {_short(exp_msg, 400)}")
    if list(exp_err) != list(act_err):
        diffs.append(f"$.error: keys ours {list(act_err)}, vLLM {list(exp_err)}")
    if list(expected) != list(actual):
        diffs.append(f"$: keys ours {list(actual)}, vLLM {list(expected)}")
    return diffs


# -- golden files --------------------------------------------------------------------------------

_FIRST_ERROR = re.compile(r"""'type': '([a-z_]+)', 'loc': '([^']*)', 'msg': ("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")


def _first_error(message: str) -> tuple[str, str, str] | None:
    """(type, loc, msg) of the first error in a pydantic "N validation errors" message."""
    match = _FIRST_ERROR.search(message)
    return match.groups() if match else None  # type: ignore[return-value]


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def iter_goldens() -> Iterator[dict[str, Any]]:
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        yield json.loads(path.read_text(encoding="utf-8"))


def golden_record(case: Case, status: int, response: Any, model_dir: str) -> dict[str, Any]:
    config = CONFIGS[case.config]
    return {
        "case": case.name,
        "config": case.config,
        "vllm_flags": config.vllm_flags(),
        "vllm_version": VLLM_VERSION,
        "model_dir": model_dir,
        "request": case.request(),
        "status": status,
        "response": response,
    }


# -- the vLLM oracle ------------------------------------------------------------------------------


def oracle_python() -> str | None:
    """The python of a vLLM 0.33 env (VLLM_ORACLE_PYTHON; fixtures.md section 3B), or None when unset."""
    return os.environ.get("VLLM_ORACLE_PYTHON") or None


@dataclass
class Oracle:
    pid: int
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop this oracle (and only it) by its PID."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            try:  # reap it if it is our child
                if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
                    return
            except ChildProcessError:
                pass
            time.sleep(0.2)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_oracle(config: ServerConfig, model_dir: str | Path, port: int, timeout: float = 240.0) -> Oracle:
    """Start vLLM 0.33's render tier for `config` with the python of VLLM_ORACLE_PYTHON, in its own
    session (stopped by its PID). Waits for GET /health = 200."""
    import socket

    import httpx

    with socket.socket() as probe:  # a server already there would answer the health check for the oracle
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is already in use; pick another with --port")
    scratch = Path(tempfile.gettempdir())
    log = scratch / f"oracle-{port}.log"
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    env.setdefault("VLLM_CACHE_ROOT", str(scratch / "vllmcache"))
    python = oracle_python()
    if not python:
        raise RuntimeError("no vLLM 0.33 environment: set VLLM_ORACLE_PYTHON")
    cmd = [
        python,
        "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())",
        "launch",
        "render",
        str(model_dir),
        "--port",
        str(port),
        *config.vllm_flags(),
    ]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=scratch, start_new_session=True)
    oracle = Oracle(proc.pid, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"oracle for {config.name} exited: see {log}")
        try:
            if httpx.get(f"{oracle.base_url}/health", timeout=2).status_code == 200:
                return oracle
        except httpx.HTTPError:
            pass
        time.sleep(1)
    oracle.stop()
    raise RuntimeError(f"oracle for {config.name} not healthy after {timeout}s: see {log}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
