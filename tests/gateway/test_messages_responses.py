"""`/v1/messages` and `/v1/responses` through the gateway, against scripted engines: the engine gets
what the render endpoints make of the request, and the answers and SSE event sequences have the
shapes vLLM 0.33's Anthropic and Responses serving writes (their converters, read in
entrypoints/anthropic/serving.py and entrypoints/openai/responses/)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from tests.gateway.conftest import MODEL, tokens
from tests.gateway.scripted_engine import Script, ScriptedEngine

EOS = 151645  # <|im_end|>
Engines = tuple[ScriptedEngine, ScriptedEngine]
MESSAGES = {"model": MODEL, "max_tokens": 40, "messages": [{"role": "user", "content": "Hi!"}]}
RESPONSES = {"model": MODEL, "input": "Hi!", "max_output_tokens": 40}
CHAT_OF_RESPONSES = {"model": MODEL, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 40}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def named_events(response: httpx.Response) -> list[tuple[str, Any]]:
    """`event: NAME` / `data: JSON` pairs of an SSE body."""
    out = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        out.append((name_line[len("event: ") :], orjson.loads(data_line[len("data: ") :])))
    return out


def _script(engines: Engines, script: Script) -> None:
    for engine in engines:
        engine.default = script


def _sent(engines: Engines) -> list[dict[str, Any]]:
    return [r.body for e in engines for r in e.records]


# -- /v1/messages --------------------------------------------------------------------------------


def test_messages_answer(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "Hello there")
    _script(engines, Script([*ids, EOS]))
    response = httpx.post(f"{gateway}/v1/messages", json=MESSAGES, timeout=10)
    assert response.status_code == 200, response.text
    answer = response.json()
    (sent,) = _sent(engines)
    rendered = httpx.post(f"{gateway}/v1/messages/render", json=MESSAGES).json()
    assert {**sent, "request_id": None} == {**rendered, "request_id": None}
    assert answer == {
        "id": answer["id"],
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello there"}],
        "model": MODEL,
        "stop_reason": "end_turn",
        "usage": {"input_tokens": len(rendered["token_ids"]), "output_tokens": len(ids) + 1},
    }
    assert answer["id"].startswith("chatcmpl-")


def test_messages_max_tokens_and_empty_output(gateway: str, engines: Engines) -> None:
    _script(engines, Script([EOS]))
    answer = httpx.post(f"{gateway}/v1/messages", json=MESSAGES, timeout=10).json()
    assert answer["content"] == [{"type": "text", "text": ""}] and answer["stop_reason"] == "end_turn"
    ids = tokens(gateway, "cut short")
    _script(engines, Script(ids, finish_reason="length"))
    answer = httpx.post(f"{gateway}/v1/messages", json=MESSAGES, timeout=10).json()
    assert answer["stop_reason"] == "max_tokens" and answer["content"][0]["text"] == "cut short"


def test_messages_errors_are_anthropic_shaped_after_validation(gateway: str, engines: Engines) -> None:
    # Schema errors come from vLLM's validation handler (its own shape) ...
    invalid = httpx.post(f"{gateway}/v1/messages", json={"model": MODEL, "messages": []}, timeout=10)
    assert invalid.status_code == 400 and "error" in invalid.json() and "type" not in invalid.json()
    # ... the rest through `translate_error_response`.
    unknown = httpx.post(f"{gateway}/v1/messages", json={**MESSAGES, "model": "nope"}, timeout=10)
    assert unknown.status_code == 404
    assert unknown.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": unknown.json()["error"]["message"]},
    }
    _script(engines, Script([], status=400))
    engine_error = httpx.post(f"{gateway}/v1/messages", json=MESSAGES, timeout=10)
    assert engine_error.status_code == 400
    assert engine_error.json()["error"] == {"type": "invalid_request_error", "message": "scripted 400"}


def test_messages_stream_events(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "One two three")
    _script(engines, Script([*ids, EOS], chunk_size=2))
    response = httpx.post(f"{gateway}/v1/messages", json={**MESSAGES, "stream": True}, timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = named_events(response)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    (sent,) = _sent(engines)
    start = events[0][1]
    assert start == {
        "type": "message_start",
        "message": {
            "id": start["message"]["id"],
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(sent["token_ids"]), "output_tokens": 0},
        },
    }
    assert events[1][1] == {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == "One two three"
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": len(sent["token_ids"]), "output_tokens": len(ids) + 1},
    }
    assert events[-1][1] == {"type": "message_stop"}
    # vLLM asks for continuous usage on the chat request it makes.
    assert sent["stream"] is True


def test_messages_thinking_and_tool_use(parsing_gateway: str, engines: Engines) -> None:
    text = '<think>Need weather.</think>Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = tokens(parsing_gateway, text)
    engines[0].default = Script([*ids, EOS], chunk_size=3)
    body = {**MESSAGES, "tools": [WEATHER_TOOL]}
    answer = httpx.post(f"{parsing_gateway}/v1/messages", json=body, timeout=10).json()
    thinking, said, tool = answer["content"]
    assert (
        thinking["type"] == "thinking" and thinking["thinking"] == "Need weather." and len(thinking["signature"]) == 32
    )
    assert said == {"type": "text", "text": "Let me check."}
    assert tool["type"] == "tool_use" and tool["name"] == "get_weather" and tool["input"] == {"city": "Paris"}
    assert answer["stop_reason"] == "tool_use"

    streamed = named_events(httpx.post(f"{parsing_gateway}/v1/messages", json={**body, "stream": True}, timeout=10))
    blocks = [data["content_block"]["type"] for name, data in streamed if name == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use"]
    deltas: dict[int, str] = {}
    for name, data in streamed:
        if name == "content_block_delta":
            delta = data["delta"]
            piece = delta.get("thinking") or delta.get("text") or delta.get("partial_json") or ""
            deltas[data["index"]] = deltas.get(data["index"], "") + piece
    assert deltas[0].strip() == "Need weather."
    assert deltas[1].strip() == "Let me check."
    assert orjson.loads(deltas[2]) == {"city": "Paris"}
    signatures = [
        d["delta"] for n, d in streamed if n == "content_block_delta" and d["delta"]["type"] == "signature_delta"
    ]
    assert len(signatures) == 1 and len(signatures[0]["signature"]) == 32
    stop = next(d for n, d in streamed if n == "message_delta")
    assert stop["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


# -- /v1/responses -------------------------------------------------------------------------------


def test_responses_answer(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "Hello there")
    _script(engines, Script([*ids, EOS]))
    response = httpx.post(f"{gateway}/v1/responses", json=RESPONSES, timeout=10)
    assert response.status_code == 200, response.text
    answer = response.json()
    (sent,) = _sent(engines)
    rendered = httpx.post(f"{gateway}/v1/responses/render", json=RESPONSES).json()
    assert {**sent, "request_id": None} == {**rendered, "request_id": None}
    assert answer["id"].startswith("resp_") and answer["object"] == "response"
    assert answer["status"] == "completed" and answer["incomplete_details"] is None
    (message,) = answer["output"]
    assert message == {
        "id": message["id"],
        "content": [{"annotations": [], "text": "Hello there", "type": "output_text", "logprobs": None}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
        "phase": None,
    }
    prompt = len(rendered["token_ids"])
    assert answer["usage"]["input_tokens"] == prompt and answer["usage"]["output_tokens"] == len(ids) + 1
    assert answer["usage"]["total_tokens"] == prompt + len(ids) + 1
    # The request echoed as `ResponsesResponse.from_request` dumps it (no tools: tool_choice "none").
    assert answer["tools"] == [] and answer["tool_choice"] == "none"
    assert answer["max_output_tokens"] == 40 and answer["truncation"] == "disabled"
    assert answer["service_tier"] == "auto" and answer["background"] is False
    assert answer["temperature"] == sent["sampling_params"].get("temperature", 1.0)


def test_responses_echo_tools_as_pydantic_dumps_them(gateway: str, engines: Engines) -> None:
    _script(engines, Script([*tokens(gateway, "ok"), EOS], finish_reason="length"))
    body = {
        **RESPONSES,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
    }
    answer = httpx.post(f"{gateway}/v1/responses", json=body, timeout=10).json()
    # Recorded from vLLM 0.33's ResponsesResponse.from_request(...).model_dump(mode="json").
    assert answer["tools"] == [
        {
            "name": "f",
            "parameters": {"type": "object"},
            "strict": None,
            "type": "function",
            "allowed_callers": None,
            "async": None,
            "defer_loading": None,
            "description": None,
            "output_schema": None,
        }
    ]
    assert answer["text"] == {
        "format": {
            "name": "x",
            "schema": {"type": "object"},
            "type": "json_schema",
            "description": None,
            "strict": None,
        },
        "verbosity": None,
    }
    assert answer["reasoning"] == {
        "context": None,
        "effort": "low",
        "generate_summary": None,
        "mode": None,
        "summary": None,
    }
    assert answer["tool_choice"] == "auto"
    assert answer["status"] == "incomplete" and answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["output"][0]["status"] == "incomplete"


def test_responses_stream_events(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "One two three")
    _script(engines, Script([*ids, EOS], chunk_size=2))
    response = httpx.post(f"{gateway}/v1/responses", json={**RESPONSES, "stream": True}, timeout=10)
    assert response.status_code == 200, response.text
    events = named_events(response)
    names = [name for name, _ in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(data["type"] == name for name, data in events)
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    item_id = events[2][1]["item"]["id"]
    assert item_id.startswith("msg_")
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == "One two three"
    assert all(d["item_id"] == item_id and d["output_index"] == 0 and d["logprobs"] == [] for d in deltas)
    done = events[-2][1]["item"]
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["output"] == [done]
    assert done["content"][0]["text"] == "One two three" and done["status"] == "completed"
    (sent,) = _sent(engines)
    assert final["usage"]["input_tokens"] == len(sent["token_ids"]) and final["usage"]["output_tokens"] == len(ids) + 1
    assert final["id"] == created["id"] == sent["request_id"]


def test_responses_reasoning_and_function_call(parsing_gateway: str, engines: Engines) -> None:
    text = (
        '<think>Need weather.</think><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    ids = tokens(parsing_gateway, text)
    engines[0].default = Script([*ids, EOS], chunk_size=3)
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["input_schema"]}
    body = {**RESPONSES, "tools": [tool]}
    answer = httpx.post(f"{parsing_gateway}/v1/responses", json=body, timeout=10).json()
    reasoning, call = answer["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"text": "Need weather.", "type": "reasoning_text"}
    ]
    assert reasoning["status"] is None and reasoning["id"].startswith("rs_")
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert orjson.loads(call["arguments"]) == {"city": "Paris"} and call["id"].startswith("fc_")

    events = named_events(httpx.post(f"{parsing_gateway}/v1/responses", json={**body, "stream": True}, timeout=10))
    added = [data["item"]["type"] for name, data in events if name == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    reasoning_text = "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta")
    assert reasoning_text.strip() == "Need weather."
    arguments = "".join(d["delta"] for n, d in events if n == "response.function_call_arguments.delta")
    assert orjson.loads(arguments) == {"city": "Paris"}
    final = events[-1][1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "function_call"]
    assert final["output"][1]["arguments"] == arguments


def test_responses_refuses_what_the_gateway_cannot_answer(gateway: str) -> None:
    response = httpx.post(f"{gateway}/v1/responses", json={**RESPONSES, "previous_response_id": "resp_1"}, timeout=10)
    assert response.status_code == 400 and response.json()["error"]["param"] == "previous_response_id", response.text


def _chat_logprobs(gateway: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat answer's logprobs for the same generation: Responses resolves them alike."""
    answer = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=10).json()
    content: list[dict[str, Any]] = answer["choices"][0]["logprobs"]["content"]
    return content


def test_responses_output_logprobs(gateway: str, engines: Engines) -> None:
    """`include: ["message.output_text.logprobs"]` (`top_logprobs` alone asks for nothing): the
    engine is asked for them, the message's text carries the whole output's, and each stream
    delta its engine chunk's (without bytes); the part done carries them all."""
    ids = tokens(gateway, "One two three")
    _script(engines, Script([*ids, EOS], chunk_size=2, logprobs=True))
    body = {**RESPONSES, "include": ["message.output_text.logprobs"], "top_logprobs": 1}
    answer = httpx.post(f"{gateway}/v1/responses", json=body, timeout=10).json()
    assert _sent(engines)[-1]["sampling_params"]["logprobs"] == 1 and answer["top_logprobs"] == 1
    expected = _chat_logprobs(gateway, {**CHAT_OF_RESPONSES, "logprobs": True, "top_logprobs": 1})
    (part,) = answer["output"][0]["content"]
    assert part["logprobs"] == expected and len(expected) == len(ids) + 1
    assert part["logprobs"][0]["top_logprobs"][0].keys() == {"token", "bytes", "logprob"}

    events = named_events(httpx.post(f"{gateway}/v1/responses", json={**body, "stream": True}, timeout=10))
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    streamed = [entry for delta in deltas for entry in delta["logprobs"]]
    assert [entry["token"] for entry in streamed] == [entry["token"] for entry in expected[: len(streamed)]]
    assert streamed[0].keys() == {"token", "logprob", "top_logprobs"}
    assert streamed[0]["top_logprobs"][0].keys() == {"token", "logprob"}
    done = next(data for name, data in events if name == "response.content_part.done")
    assert done["part"]["logprobs"] == expected[: len(streamed)]

    for without in ({**RESPONSES, "top_logprobs": 2}, {**RESPONSES, "stream": False}):
        answer = httpx.post(f"{gateway}/v1/responses", json=without, timeout=10).json()
        assert answer["output"][0]["content"][0]["logprobs"] is None
        assert _sent(engines)[-1]["sampling_params"].get("logprobs") is None
