"""Our Mistral chat encoder against mistral-common, on generated conversations.

`MistralChatEncoder` (render_service/model/mistral_encoder.py) writes the prompt ids of the
common request shapes itself and returns None for anything else. Here, for each fixture version,
thousands of generated conversations (valid ones, and ones with a mistake the library rejects)
go through both: whenever ours answers, the library must give the same ids (never an error), and
ours must answer for most of the conversations the library accepts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from render_service.model.mistral import MistralTokenizer
from render_service.model.mistral_encoder import MistralChatEncoder
from tests.mistral_fixture import build_mistral_model

TEXTS = [
    "",
    " ",
    "Hello",
    "trailing spaces   ",
    " leading space",
    "line\nbreaks\n\n",
    "naïve café 東京 🎉",
    "[INST] not a marker [/INST] </s> [TOOL_CALLS] [THINK]",
    '{"json": "as text", "n": 1}',
    "word " * 40,
    "x" * 300,
]
ARGUMENTS = [
    '{"a": 1}',
    "",
    "not json",
    '{"u": "é", "l": [1, 2.5, null]}',
    "[1,2]",
    '"s"',
    "NaN",
    '{"a":1,"a":2}',
    "{}",
]
GOOD_IDS = ["call12345", "abcDEF789", "A1b2C3d4E"]
BAD_IDS = ["null", "short", "call_123456", "", "abc-12345"]
NAMES = ["read_file", "get-weather", "f"]
BAD_NAMES = ["bad name", "f\n", "x" * 65]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get-weather", "parameters": {"type": "object"}, "strict": True}},
]
BAD_TOOL = [{"type": "function", "function": {"name": "bad name", "parameters": {"type": "object"}}}]


def _call(rng: random.Random, call_id: str) -> dict[str, Any]:
    name = rng.choice(BAD_NAMES) if rng.random() < 0.03 else rng.choice(NAMES)
    call: dict[str, Any] = {"id": call_id, "type": "function", "function": {"name": name}}
    call["function"]["arguments"] = rng.choice(ARGUMENTS) if rng.random() > 0.03 else {"a": 1}
    if rng.random() < 0.03:
        del call["id"]
    return call


def _assistant(rng: random.Random, reasoning: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice([*TEXTS, None])}
    if reasoning and rng.random() < 0.5:
        key = rng.choice(["reasoning", "reasoning_content"])
        message[key] = rng.choice(TEXTS)
        if rng.random() < 0.05:
            message["reasoning" if key == "reasoning_content" else "reasoning_content"] = rng.choice(TEXTS)
    if message["content"] is None and rng.random() < 0.3:
        del message["content"]
    return message


def conversation(rng: random.Random, version: str) -> tuple[list[dict[str, Any]], Any, bool]:
    """A plausible chat (system prompts, turns, reasoning, tool rounds), sometimes broken."""
    reasoning = version == "v13" or rng.random() < 0.05
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": rng.choice(["system", "developer"]), "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 4)):
        for _ in range(1 if rng.random() < 0.85 else 2):  # now and then two in a row (merged)
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
        if rng.random() < 0.1:
            messages.append({"role": "system", "content": rng.choice(TEXTS)})
        for _ in range(1 if rng.random() < 0.85 else 2):
            messages.append(_assistant(rng, reasoning))
        if rng.random() < 0.4:
            ids = rng.sample(GOOD_IDS, rng.randint(1, 3))
            if rng.random() < 0.05:
                ids[0] = rng.choice(BAD_IDS)
            calls = [_call(rng, call_id) for call_id in ids]
            messages[-1]["tool_calls"] = calls
            results = list(ids)
            if rng.random() < 0.4:
                rng.shuffle(results)  # v11+ put them back in call order
            if rng.random() < 0.05:
                results = results[:-1]
            for call_id in results:
                result: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": rng.choice(TEXTS)}
                if rng.random() < 0.3:
                    result["name"] = rng.choice(NAMES + BAD_NAMES[:1])
                messages.append(result)
            if rng.random() < 0.5:
                messages.append(_assistant(rng, reasoning))
    continue_final = False
    if messages[-1]["role"] == "assistant":
        if rng.random() < 0.5:
            continue_final = True
        elif rng.random() < 0.9:
            messages.append({"role": "user", "content": rng.choice(TEXTS)})
    elif rng.random() < 0.05:
        messages.append({"role": "assistant", "content": "dangling"})
    if rng.random() < 0.03:
        messages.insert(rng.randrange(len(messages)), {"role": "tool", "tool_call_id": "call12345", "content": "x"})
    for message in messages:  # text parts instead of a string, now and then
        if isinstance(message.get("content"), str) and rng.random() < 0.1:
            message["content"] = [{"type": "text", "text": rng.choice(TEXTS)} for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.02:
        messages[rng.randrange(len(messages))]["content"] = [{"type": "image_url", "image_url": {"url": "x"}}]
    if rng.random() < 0.02:
        messages[rng.randrange(len(messages))]["content"] = [{"text": "no type"}]
    if rng.random() < 0.02:
        messages = messages[:1]
    tools = rng.choice([None, [], TOOLS, TOOLS[:1], TOOLS, BAD_TOOL if rng.random() < 0.1 else TOOLS])
    return messages, tools, continue_final


def _library(tok: MistralTokenizer, messages: list[dict[str, Any]], tools: Any, continue_final: bool) -> Any:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    try:
        request = ChatCompletionRequest.from_openai(
            messages=messages, tools=tools, continue_final_message=continue_final
        )
        return list(tok.mistral.encode_chat_completion(request).tokens)
    except Exception as exc:  # the library's answer is an error
        return exc


@pytest.fixture(scope="module", params=["v7", "v11", "v13"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> MistralTokenizer:
    return MistralTokenizer(build_mistral_model(tmp_path_factory.mktemp(request.param), request.param))


def test_our_ids_are_the_librarys_on_generated_conversations(tokenizer: MistralTokenizer) -> None:
    version = f"v{tokenizer.version}"
    encoder = MistralChatEncoder(tokenizer)
    assert encoder.enabled
    rng = random.Random(17 + tokenizer.version)
    accepted = ours = 0
    for case in range(1500):
        messages, tools, continue_final = conversation(rng, version)
        expected = _library(tokenizer, messages, tools, continue_final)
        got = encoder.encode(messages, tools, continue_final)
        if not isinstance(expected, Exception):
            accepted += 1
        if got is None:
            continue
        ours += 1
        assert not isinstance(expected, Exception), (case, messages, tools, continue_final, expected)
        assert got == expected, (case, messages, tools, continue_final)
        for _ in range(2):  # seen again: the texts' ids are kept, then read from the cache
            assert encoder.encode(messages, tools, continue_final) == expected
    # Most of what the library renders, ours renders (the rest are shapes it leaves to the library).
    assert accepted > 300 and ours >= 0.9 * accepted, (accepted, ours)


def test_unsupported_shapes_are_left_to_the_library(tokenizer: MistralTokenizer) -> None:
    encoder = MistralChatEncoder(tokenizer)
    parts = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert encoder.encode(parts, None, False) is None
    assert encoder.encode([], None, False) is None
    assert encoder.encode([{"role": "assistant", "content": "x"}], None, False) is None  # the library's error
    for _ in range(2):  # a tool list the library rejects is never kept
        assert encoder.encode([{"role": "user", "content": "x"}], BAD_TOOL, False) is None
    assert encoder.encode([{"role": "user", "content": "x"}], None, False) == _library(
        tokenizer, [{"role": "user", "content": "x"}], None, False
    )


def test_the_benchmark_chat_takes_our_encoder(tmp_path: Path) -> None:
    """The ~9k-token chat of benchmarks/mistral_bench.py (reasoning history, two assistant
    messages in a row, a tool round trip, tools) renders here, with the library's ids."""
    from benchmarks.mistral_bench import payload

    tok = MistralTokenizer(build_mistral_model(tmp_path / "v13", "v13"))
    encoder = MistralChatEncoder(tok)
    body = payload(5, 0.77)
    ids = encoder.encode(body["messages"], body["tools"], False)
    assert ids is not None and ids == _library(tok, body["messages"], body["tools"], False)


def test_a_texts_ids_are_kept_when_it_comes_again(tokenizer: MistralTokenizer) -> None:
    encoder = MistralChatEncoder(tokenizer)
    text = "a message long enough to be worth keeping, sent again on the next turn " * 3
    first = encoder.text(text)
    assert text not in encoder._texts  # seen once: not kept
    assert encoder.text(text) == first and encoder._texts[text] == first
    assert encoder.text(text) is encoder._texts[text]
    assert encoder.text("short") == tokenizer.raw.encode("short", False, False)


def test_the_kept_texts_stay_within_their_budget(tokenizer: MistralTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    import render_service.model.mistral_encoder as module

    monkeypatch.setattr(module, "TEXT_CACHE_MAX_IDS", 400)
    encoder = MistralChatEncoder(tokenizer)
    texts = [f"turn {i}: " + "some words that repeat " * 8 for i in range(12)]
    for text in texts:
        for _ in range(2):
            assert encoder.text(text) == tokenizer.raw.encode(text, False, False)
    assert 0 < encoder._text_ids <= 400
    assert encoder._text_ids == sum(len(ids) for ids in encoder._texts.values())
    assert texts[-1] in encoder._texts and texts[0] not in encoder._texts  # the oldest went first


def test_our_ids_are_vllms_on_the_goldens(tmp_path: Path) -> None:
    """Every recorded vLLM 0.33 chat render (tests/parity/golden_mistral) that our encoder takes
    gives vLLM's token ids; the ones it leaves to the library are few."""
    import json

    from render_service.render.renderers.mistral import truncate_tool_call_ids

    encoders: dict[str, MistralChatEncoder] = {}
    ours = left = 0
    folder = Path(__file__).resolve().parents[1] / "parity" / "golden_mistral"
    for path in sorted(folder.glob("*.json")):
        golden = json.loads(path.read_text(encoding="utf-8"))
        body = golden["request"].get("json") or {}
        if not golden["request"]["path"].endswith("/chat/completions/render") or golden["status"] != 200:
            continue
        version = golden["tokenizer_version"]
        if version not in encoders:
            encoders[version] = MistralChatEncoder(MistralTokenizer(build_mistral_model(tmp_path / version, version)))
        messages = truncate_tool_call_ids(body["messages"])
        ids = encoders[version].encode(messages, body.get("tools"), bool(body.get("continue_final_message")))
        if ids is None:
            left += 1
            continue
        ours += 1
        assert ids == golden["response"]["token_ids"], path.name
    assert ours >= 60 and left <= ours // 3, (ours, left)
