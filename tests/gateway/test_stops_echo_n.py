"""What a `--tokens-only` engine cannot do and the gateway does itself: stop strings (the engine
never sees them; a match cuts the output, holds the stream's text back and aborts the engine
request), `echo`, and several choices (`n`)."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import MODEL, sse_events, tokens
from tests.gateway.scripted_engine import Script, ScriptedEngine

EOS = 151645  # <|im_end|>
Engines = tuple[ScriptedEngine, ScriptedEngine]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 50}


def _script(engines: Engines, script: Script) -> None:
    for engine in engines:
        engine.default = script


def _records(engines: Engines) -> list:
    return [r for e in engines for r in e.records]


def _tokens_until(gateway: str, ids: list[int], stop: str) -> int:
    """How many of `ids` vLLM keeps: up to the token whose text completes `stop`."""
    text = ""
    for count in range(1, len(ids) + 1):
        text = httpx.post(f"{gateway}/detokenize", json={"model": MODEL, "tokens": ids[:count]}).json()["prompt"]
        if stop in text:
            return count
    raise AssertionError(f"{stop!r} not in {text!r}")


def test_stop_string_non_streaming(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "one, two, three. four, five, six")
    _script(engines, Script([*ids, EOS], stall_after=len(ids)))  # only a closed stream ends it
    answer = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stop": [". ", "zzz"]}, timeout=10).json()
    choice = answer["choices"][0]
    assert choice["message"]["content"] == "one, two, three"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", ". ")
    assert answer["usage"]["completion_tokens"] == _tokens_until(gateway, ids, ". ")
    (record,) = _records(engines)
    assert (
        record.body["sampling_params"]["stop"] == []
        and "output_text_buffer_length" not in record.body["sampling_params"]
    )
    assert record.body["stream"] is True  # streamed from the engine so that the match can end it
    assert record.outcome == "cancelled"  # the engine request ended at the match


def test_stop_string_kept_with_include_stop_str_in_output(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "alpha beta gamma delta")
    _script(engines, Script([*ids, EOS]))
    body = {**CHAT, "stop": "gamma", "include_stop_str_in_output": True}
    choice = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=10).json()["choices"][0]
    assert choice["message"]["content"] == "alpha beta gamma" and choice["stop_reason"] == "gamma"


def test_stop_string_streaming_never_shows_it(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "one, two, three. four, five, six")
    _script(engines, Script([*ids, EOS], chunk_size=1, stall_after=len(ids)))  # only a closed stream ends it
    body = {**CHAT, "stop": [". "], "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=10))
    deltas = [e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"]]
    assert "".join(deltas) == "one, two, three" and not any("." in d for d in deltas)
    finish = events[-3]["choices"][0]
    assert (finish["finish_reason"], finish["stop_reason"]) == ("stop", ". ")
    assert events[-2]["usage"]["completion_tokens"] == _tokens_until(gateway, ids, ". ")
    assert events[-1] == "[DONE]"
    assert engines[0].wait_for("cancelled") or engines[1].wait_for("cancelled")


def test_stop_string_completions_both_ways(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, " red green blue yellow")
    _script(engines, Script([*ids, EOS], chunk_size=2))
    body = {"model": MODEL, "prompt": "Colours:", "max_tokens": 20, "stop": [" blue"]}
    answer = httpx.post(f"{gateway}/v1/completions", json=body, timeout=10).json()
    assert answer["choices"][0]["text"] == " red green" and answer["choices"][0]["stop_reason"] == " blue"
    events = sse_events(httpx.post(f"{gateway}/v1/completions", json={**body, "stream": True}, timeout=10))
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == " red green"
    assert events[-2]["choices"][0]["stop_reason"] == " blue"


def _merged(events: list) -> tuple[str, str, tuple[str, object]]:
    """(reasoning, content, (finish_reason, stop_reason)) of a single-choice chat stream."""
    reasoning = content = ""
    finish: tuple[str, object] = ("", None)
    for event in events[:-1]:
        for choice in event["choices"]:
            reasoning += choice["delta"].get("reasoning") or ""
            content += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                finish = (choice["finish_reason"], choice["stop_reason"])
    return reasoning, content, finish


def test_stop_strings_on_a_parsed_stream(parsing_gateway: str, engines: Engines) -> None:
    """As `vllm serve` does: the parsers see the text the detokenizer releases (held back, cut at
    the stop string), reasoning included; the stream says what the batch answer says."""
    ids = tokens(parsing_gateway, "<think>hmm, four</think>The answer is 4. Done here")
    for stop, reasoning, content in ((". ", "hmm, four", "The answer is 4"), ("four", "hmm, ", "")):
        engines[0].default = Script([*ids, EOS], chunk_size=1)
        body = {**CHAT, "stop": [stop, "never"], "stream": True}
        events = sse_events(httpx.post(f"{parsing_gateway}/v1/chat/completions", json=body, timeout=10))
        assert events[-1] == "[DONE]"
        assert _merged(events) == (reasoning, content, ("stop", stop))
        assert engines[0].wait_for("cancelled")  # the engine request ends at the match
        engines[0].records.clear()
        batch = httpx.post(f"{parsing_gateway}/v1/chat/completions", json={**body, "stream": False}, timeout=10)
        message = batch.json()["choices"][0]["message"]
        assert (message["reasoning"] or "", message["content"] or "") == (reasoning, content)


def test_stop_string_with_parsers_non_streaming(parsing_gateway: str, engines: Engines) -> None:
    ids = tokens(parsing_gateway, "<think>hmm</think>The answer is 4. Done here")
    engines[0].default = Script([*ids, EOS])
    answer = httpx.post(f"{parsing_gateway}/v1/chat/completions", json={**CHAT, "stop": [". "]}, timeout=10).json()
    message = answer["choices"][0]["message"]
    assert message["reasoning"] == "hmm" and message["content"] == "The answer is 4"


def test_echo(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, " and then")
    _script(engines, Script([*ids, EOS], chunk_size=2))
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 10, "echo": True}
    answer = httpx.post(f"{gateway}/v1/completions", json=body, timeout=10).json()
    assert answer["choices"][0]["text"] == "Once upon a time and then"
    events = sse_events(httpx.post(f"{gateway}/v1/completions", json={**body, "stream": True}, timeout=10))
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert texts[0].startswith("Once upon a time") and "".join(texts) == "Once upon a time and then"
    two = httpx.post(f"{gateway}/v1/completions", json={**body, "prompt": ["A", "B"]}, timeout=10).json()
    assert [c["text"] for c in two["choices"]] == ["A and then", "B and then"]


def test_several_choices(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "same words")
    _script(engines, Script([*ids, EOS], chunk_size=1))
    answer = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "n": 3}, timeout=10).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert {c["message"]["content"] for c in answer["choices"]} == {"same words"}
    assert answer["usage"]["completion_tokens"] == 3 * (len(ids) + 1)
    body = {**CHAT, "n": 2, "stream": True, "stop": ["words"]}
    events = sse_events(httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=10))
    by_choice: dict[int, str] = {}
    finishes = {}
    for event in events[:-1]:
        for choice in event["choices"]:
            by_choice[choice["index"]] = by_choice.get(choice["index"], "") + (choice["delta"].get("content") or "")
            if choice["finish_reason"]:
                finishes[choice["index"]] = (choice["finish_reason"], choice["stop_reason"])
    assert by_choice == {0: "same ", 1: "same "}
    assert finishes == {0: ("stop", "words"), 1: ("stop", "words")}
