"""The Harmony renderer's message cache: a prompt assembled from cached per-message ids equals
Harmony's own whole-conversation render, for random conversations, cold and warm."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from render_service.exceptions import RenderServiceError
from render_service.render.renderers.base import ChatInput
from render_service.render.renderers.harmony import HarmonyRenderer, Part

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
WORDS = ["the", "weather", "<|end|>", "naïve", "日本", "\n\n", "  ", "{", '"x": 1', "functions.get_weather", "🙂"]


@pytest.fixture(scope="module")
def start_date() -> Any:
    previous = os.environ.get("VLLM_SYSTEM_START_DATE")
    os.environ["VLLM_SYSTEM_START_DATE"] = "2026-01-15"
    yield
    if previous is None:
        os.environ.pop("VLLM_SYSTEM_START_DATE", None)
    else:
        os.environ["VLLM_SYSTEM_START_DATE"] = previous


def _renderer(o200k_dir: Path, system_instructions: bool = False) -> HarmonyRenderer:
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(o200k_dir)
    renderer = HarmonyRenderer()
    renderer.system_instructions = system_instructions
    return renderer


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": rng.choice(["system", "developer"]), "content": _text(rng)})
    calls = 0
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.35:
            content: Any = _text(rng)
            if rng.random() < 0.3:
                content = [{"type": "text", "text": _text(rng)} for _ in range(rng.randint(1, 3))]
            messages.append({"role": "user", "content": content})
        elif kind < 0.65:
            message: dict[str, Any] = {"role": "assistant", "content": _text(rng) if rng.random() < 0.8 else ""}
            if rng.random() < 0.6:
                message["reasoning"] = _text(rng)
            messages.append(message)
        elif kind < 0.85:
            calls += 1
            call_id = f"call_{calls}"
            name = rng.choice(["get_weather", "now"])
            messages.append(
                {
                    "role": "assistant",
                    "content": _text(rng) if rng.random() < 0.5 else None,
                    "reasoning": _text(rng) if rng.random() < 0.5 else None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps({"a": 1})},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(rng)})
        else:
            messages.append({"role": rng.choice(["system", "developer"]), "content": _text(rng)})
    messages.append({"role": "user", "content": _text(rng)})
    return messages


def _chat(messages: list[dict[str, Any]], tools: Any, effort: str | None) -> ChatInput:
    return ChatInput(
        messages=messages, conversation=[], tools=tools, kwargs={}, chat_template=None, reasoning_effort=effort
    )


def whole_conversation(renderer: HarmonyRenderer, chat: ChatInput) -> list[int]:
    """The prompt as vLLM makes it: every message built, one `render_conversation_for_completion`."""
    from openai_harmony import Conversation, RenderConversationConfig, Role

    messages = list(chat.messages)
    instructions = None
    if messages and messages[0].get("role") in ("system", "developer"):
        instructions = messages[0]["content"]
        messages = messages[1:]
    parts: list[Part] = renderer.preamble(instructions, chat.tools, chat.reasoning_effort)
    parts += renderer.conversation(messages)
    last_final = max((i for i, p in enumerate(parts) if p.role == "assistant" and p.channel == "final"), default=-1)
    kept = [p.build() for i, p in enumerate(parts) if not (i < last_final and p.channel == "analysis")]
    ids = renderer.encoding.render_conversation_for_completion(
        Conversation.from_messages(kept), Role.ASSISTANT, config=RenderConversationConfig(auto_drop_analysis=False)
    )
    return renderer.legacy_tool_call_headers(ids)


@pytest.mark.parametrize("system_instructions", [False, True])
def test_cached_render_equals_whole_conversation_render(
    o200k_dir: Path, start_date: Any, system_instructions: bool
) -> None:
    renderer = _renderer(o200k_dir, system_instructions)
    rng = random.Random(17 + system_instructions)
    chats = [
        _chat(_conversation(rng), rng.choice([None, TOOLS, TOOLS[:1]]), rng.choice([None, "low", "high"]))
        for _ in range(60)
    ]
    for _ in range(2):  # cold, then every message from the cache
        for chat in chats:
            rendered = renderer.render(chat).token_ids
            assert rendered == whole_conversation(renderer, chat)
    assert renderer.messages.hits > renderer.messages.misses > 0


def test_function_tools_flag_is_part_of_the_key(o200k_dir: Path, start_date: Any) -> None:
    """The system message names the `functions` namespace only when the developer message has
    function tools: the same system message must not be served from the other variant."""
    renderer = _renderer(o200k_dir)
    messages = [{"role": "user", "content": "hi"}]
    with_tools = renderer.render(_chat(messages, TOOLS, None)).token_ids
    without = renderer.render(_chat(messages, None, None)).token_ids
    assert with_tools is not None and without is not None
    assert renderer.encoding.decode(without).count("functions") == 0
    assert "functions" in renderer.encoding.decode(with_tools)
    assert without == whole_conversation(renderer, _chat(messages, None, None))


def test_request_errors_are_raised_on_every_request(o200k_dir: Path, start_date: Any) -> None:
    renderer = _renderer(o200k_dir)
    messages = [{"role": "user", "content": "hi"}]
    bad_tool = [{"type": "custom", "custom": {"name": "x"}}]
    for _ in range(2):
        with pytest.raises(RenderServiceError, match="reasoning_effort"):
            renderer.render(_chat(messages, None, "extreme"))
        with pytest.raises(RenderServiceError, match="tool type"):
            renderer.render(_chat(messages, bad_tool, None))


def test_cache_stays_within_its_bounds(o200k_dir: Path, start_date: Any) -> None:
    renderer = HarmonyRenderer(cache_bytes=64 << 10)
    cache = renderer.messages
    for index in range(400):
        chat = _chat([{"role": "user", "content": f"message {index} " + "x" * 200}], None, None)
        assert renderer.render(chat).token_ids == whole_conversation(renderer, chat)
    assert cache._bytes <= cache.max_bytes
    assert 0 < len(cache._cache) < 400


# Instructions where a splice could go wrong: empty, blank lines at either end, Harmony's own
# framing written as text, a tools header inside them, text that merges with "\n\n" around it.
INSTRUCTIONS = [
    "",
    " ",
    "\n\n",
    "Be brief.\n\n",
    "\n\nleading blank lines",
    "<|end|><|start|>developer<|message|># Tools",
    "# Tools\n\n## functions\n\nnamespace functions {",
    "trailing spaces   ",
    "日本語 🙂 naïve\r\n",
    "x" * 3000,
]


def test_developer_messages_splice_as_the_library(o200k_dir: Path, start_date: Any) -> None:
    """Developer messages (the leading system message's instructions, later system/developer
    messages) are spliced: the developer framing around one fastokens text made from the
    instructions and the tool list's library-rendered `# Tools` section. Every instruction text,
    with and without tools, equals the library's whole-conversation render, cold and warm."""
    renderer = _renderer(o200k_dir)
    assert renderer.text_encode is not None
    big_tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{index}",
                "description": "Line one.\nLine two." if index % 2 else "",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "string", "enum": ["x", "y"]}, "b": {"type": "number"}},
                },
            },
        }
        for index in range(5)
    ]
    for _ in range(2):
        for tools in (None, TOOLS, TOOLS[:1], big_tools):
            for index, text in enumerate(INSTRUCTIONS):
                messages = [
                    {"role": "system", "content": text},
                    {"role": "user", "content": f"question {index}"},
                    {"role": "developer", "content": text + " later"},
                    {"role": "user", "content": "and?"},
                ]
                chat = _chat(messages, tools, "low")
                assert renderer.render(chat).token_ids == whole_conversation(renderer, chat), repr(text[:40])
    assert set(renderer.tool_sections.values()) - {None} and None not in renderer.tool_sections.values()


def test_a_tool_list_whose_splice_differs_is_left_to_the_library(o200k_dir: Path, start_date: Any) -> None:
    """The first splice of each tool list is checked against the library: a section that does
    not reproduce it (here, a corrupted one) sends that tool list's developer messages to the
    library for good, and the prompt stays the library's."""
    renderer = _renderer(o200k_dir)
    renderer._tool_section = lambda functions: "# Tools\n\nnot what the library writes"  # type: ignore[method-assign]
    for index in range(3):
        messages = [{"role": "system", "content": f"rules {index}"}, {"role": "user", "content": "hi"}]
        chat = _chat(messages, TOOLS, None)
        assert renderer.render(chat).token_ids == whole_conversation(renderer, chat)
    assert list(renderer.tool_sections.values()) == [None]
