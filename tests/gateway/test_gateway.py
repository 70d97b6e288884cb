"""The gateway against scripted engines over real HTTP: vLLM's answers and SSE chunks, errors,
fail-over before the first token, a clean error after it, balancing, cancellation, metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from render_service.model.loader import Model
from render_service.server.app import create_app
from tests.gateway.conftest import MODEL, gateway_app, gateway_settings, sse_events, tokens, unused_url
from tests.gateway.scripted_engine import Script, ScriptedEngine

EOS = 151645  # <|im_end|>
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi!"}]}
Engines = tuple[ScriptedEngine, ScriptedEngine]


def _all_records(engines: Engines) -> list[dict]:
    return [r.body for e in engines for r in e.records]


# -- answers and chunk shapes -------------------------------------------------------------------


def test_chat_answer_is_the_derender_of_the_engine_output(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "Hello there, friend")
    for engine in engines:
        engine.default = Script([*ids, EOS], stop_reason=None)
    response = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 50}, timeout=10)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["model"] == MODEL
    choice = answer["choices"][0]
    assert choice["message"]["content"] == "Hello there, friend"
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(ids) + 1

    # The engine got exactly what /render makes of the request (ids differ per request).
    (sent,) = _all_records(engines)
    rendered = httpx.post(f"{gateway}/v1/chat/completions/render", json={**CHAT, "max_tokens": 50}).json()
    assert {**sent, "request_id": None} == {**rendered, "request_id": None}
    assert answer["usage"]["prompt_tokens"] == len(rendered["token_ids"])

    # ... and answers as the derender endpoint does for that engine output.
    derendered = httpx.post(
        f"{gateway}/v1/chat/completions/derender",
        json={
            "generate_response": {"request_id": answer["id"], "choices": [{"index": 0, "token_ids": [*ids, EOS]}]},
            "prompt_token_ids": rendered["token_ids"],
            "prompt_tokens": len(rendered["token_ids"]),
            "model": MODEL,
        },
    ).json()
    for volatile in ("created",):
        answer.pop(volatile), derendered.pop(volatile)
    assert answer == derendered


def test_chat_stream_chunks_have_vllm_serve_shapes(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "One two three four five")
    for engine in engines:
        engine.default = Script([*ids, EOS], chunk_size=2)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    role, *deltas, finish, usage, _ = events
    chunk_id = role["id"]
    assert role == {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": role["created"],
        "model": MODEL,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    for chunk in deltas:
        assert list(chunk) == ["id", "object", "created", "model", "choices", "kv_transfer_params"]
        assert list(chunk["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert list(chunk["choices"][0]["delta"]) == ["content"] and chunk["id"] == chunk_id
    assert list(finish["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "weight_versions",
    ]
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["choices"][0]["stop_reason"] is None
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in [*deltas, finish])
    assert text == "One two three four five"
    prompt_tokens = len(_all_records(engines)[0]["token_ids"])
    assert usage == {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": role["created"],
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + len(ids) + 1,
            "completion_tokens": len(ids) + 1,
        },
    }


def test_chat_stream_continuous_usage_token_ids_and_logprobs(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "abc def")
    for engine in engines:
        engine.default = Script([*ids, EOS], logprobs=True)
    body = {
        **CHAT,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events = sse_events(httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=10))
    role, first = events[0], events[1]
    assert role["usage"]["completion_tokens"] == 0 and role["usage"]["completion_tokens_details"] is None
    assert role["prompt_token_ids"] == _all_records(engines)[0]["token_ids"]
    assert first["usage"]["completion_tokens"] == 1 and first["choices"][0]["token_ids"] == ids[:1]
    content = first["choices"][0]["logprobs"]["content"]
    assert content[0]["logprob"] == -0.5 and content[0]["top_logprobs"][0]["logprob"] == -0.5


def test_reasoning_and_tool_calls_stream_like_the_batch_answer(parsing_gateway: str, engines: Engines) -> None:
    text = (
        "<think>The user wants weather.</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    ids = [*tokens(parsing_gateway, text), EOS]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    body = {**CHAT, "tools": tools}
    engines[0].scripts += [Script(ids), Script(ids, chunk_size=3)]
    batch = httpx.post(f"{parsing_gateway}/v1/chat/completions", json=body, timeout=10).json()
    message = batch["choices"][0]["message"]
    assert message["reasoning"] == "The user wants weather."
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"city": "Paris"}]
    assert batch["choices"][0]["finish_reason"] == "tool_calls"

    events = sse_events(httpx.post(f"{parsing_gateway}/v1/chat/completions", json={**body, "stream": True}, timeout=10))
    chunks = [e for e in events if e != "[DONE]"]
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in chunks)
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert reasoning == "The user wants weather."
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["type"] == "function"
    assert json.loads("".join(tc["function"].get("arguments", "") for tc in calls)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Tool-call ids derive from the request id, as in batch derender.
    assert calls[0]["id"].startswith("chatcmpl-tool-")


def test_preserve_generated_tokens_turns_extend_through_the_gateway(
    qwen3_model_dir: Path, loaded_model: Model, engines: Engines
) -> None:
    """With --preserve-generated-tokens the answer's message carries a handle; sent back, the next
    turn's prompt to the engine is the previous prompt + the ids it generated + the template's suffix
    (a re-render would drop the thinking), and a header says so."""
    settings = gateway_settings(
        qwen3_model_dir,
        [engines[0].url],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        preserve_generated_tokens=True,
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with gateway_app(loaded_model, settings) as url:
        outputs = [
            "<think>\nWeather: call the tool.\n</think>\n\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "<think>\nIt answered.\n</think>\n\nSunny in Paris.",
        ]
        generated = [[*tokens(url, text), EOS] for text in outputs]
        engines[0].scripts += [Script(ids) for ids in generated]
        body = {**CHAT, "tools": tools, "preserve_generated_tokens": True}
        first = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert first.headers["x-render-continuation"].endswith("reason=first_turn")
        message = {k: v for k, v in first.json()["choices"][0]["message"].items() if v is not None}
        assert message["generated_tokens_handle"].startswith("rsg1.")
        tool = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "sunny"}
        body["messages"] = [*body["messages"], message, tool]
        second = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert second.status_code == 200, second.text
        assert "continuation" not in second.json()  # the chat completion stays OpenAI's
        suffix = tokens(
            url, "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
    prompts = [record.body["token_ids"] for record in engines[0].records]
    assert prompts[1] == prompts[0] + generated[0] + suffix
    shared = len(prompts[0]) + len(generated[0])
    assert second.headers["x-render-continuation"] == f"prefix_extends=true; shared_tokens={shared}; spliced_turns=1"


def test_gpt_oss_streams_through_harmony_like_the_batch_answer(gpt_oss_model_dir: Path, engines: Engines) -> None:
    """gpt-oss output is parsed by the Harmony parser in both paths (the loader's default
    `openai_gptoss`), as /derender does: analysis is reasoning, final is content."""
    from render_service.model.loader import load_model

    settings = gateway_settings(gpt_oss_model_dir, [engines[0].url])
    with gateway_app(load_model(settings), settings) as url:
        text = (
            "<|channel|>analysis<|message|>The user says hi.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>"
        )
        response = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False})
        ids = response.json()["tokens"]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi!"}]}
        engines[0].scripts += [Script(ids), Script(ids, chunk_size=2)]
        message = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).json()["choices"][0]["message"]
        assert (message["reasoning"], message["content"]) == ("The user says hi.", "Hello there!")

        events = sse_events(httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=10))
        deltas = [e["choices"][0]["delta"] for e in events if e != "[DONE]" and e["choices"]]
        assert "".join(d.get("reasoning") or "" for d in deltas) == "The user says hi."
        assert "".join(d.get("content") or "" for d in deltas) == "Hello there!"


def test_completions_batch_and_stream(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, " jumps over the lazy dog")
    for engine in engines:
        engine.default = Script(ids, finish_reason="length")
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": len(ids)}
    batch = httpx.post(f"{gateway}/v1/completions", json=body, timeout=10).json()
    assert batch["object"] == "text_completion" and batch["id"].startswith("cmpl-")
    assert batch["choices"][0]["text"] == " jumps over the lazy dog"
    assert batch["choices"][0]["finish_reason"] == "length"

    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(f"{gateway}/v1/completions", json=stream, timeout=10))
    *chunks, usage, done = events
    assert done == "[DONE]" and usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)
    assert list(chunks[0]) == ["id", "object", "created", "model", "choices", "kv_transfer_params"]
    assert list(chunks[0]["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "prompt_token_ids",
        "token_ids",
        "weight_versions",
    ]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " jumps over the lazy dog"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_completions_several_prompts_go_to_the_engines_and_come_back_in_order(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, " done")
    for engine in engines:
        engine.default = Script([*ids, EOS])
    body = {"model": MODEL, "prompt": ["first", "second"], "max_tokens": 5}
    batch = httpx.post(f"{gateway}/v1/completions", json=body, timeout=10).json()
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert [c["text"] for c in batch["choices"]] == [" done", " done"]
    assert len(_all_records(engines)) == 2 and "-" not in batch["id"][len("cmpl-") :][32:]


# -- errors -------------------------------------------------------------------------------------


def test_request_errors_are_vllm_shaped_and_reach_no_engine(gateway: str, engines: Engines) -> None:
    response = httpx.post(f"{gateway}/v1/chat/completions", json={"model": MODEL}, timeout=10)
    assert response.status_code == 400 and set(response.json()["error"]) == {"message", "type", "param", "code"}
    response = httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "model": "nope"}, timeout=10)
    assert response.status_code == 404 and response.json()["error"]["type"] == "NotFoundError"
    response = httpx.post(f"{gateway}/v1/completions", json={"model": MODEL, "prompt": [1, 2], "echo": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "echo"
    assert _all_records(engines) == []


def test_an_engine_4xx_is_the_answer_not_retried(gateway: str, engines: Engines) -> None:
    for engine in engines:
        engine.scripts.append(Script([], status=400))
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=10)
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": "scripted 400", "type": "BadRequestError", "param": None, "code": 400}
    }
    assert len(_all_records(engines)) == 1


# -- the pool -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_retry_on_another_engine_before_the_first_token(
    qwen3_model_dir: Path, loaded_model: Model, engines: Engines, stream: bool
) -> None:
    first, second = engines
    settings = gateway_settings(qwen3_model_dir, [first.url, second.url])
    with gateway_app(loaded_model, settings) as url:  # a fresh pool: `first` is picked first
        ids = tokens(url, "fine")
        first.default = Script([], status=503)
        second.default = Script([*ids, EOS])
        response = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
        assert response.status_code == 200 and "fine" in response.text
        assert (first.outcomes(), second.outcomes()) == (["failed"], ["finished"])
        metrics = httpx.get(f"{url}/metrics").text
        assert "render_gateway_retries_total 1.0" in metrics
        assert f'render_gateway_engine_errors_total{{engine="{first.url}",kind="status"}} 1.0' in metrics
        # `first` is now marked down: the next request goes straight to `second`.
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
        assert (len(first.records), len(second.records)) == (1, 2)


def test_every_engine_failing_passes_the_last_engine_error_on(gateway: str, engines: Engines) -> None:
    for engine in engines:
        engine.default = Script([], status=500)
    response = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=10)
    assert response.status_code == 500 and response.json()["error"]["message"] == "scripted 500"
    assert [len(e.records) for e in engines] == [1, 1]


def test_a_stream_that_drops_before_its_first_token_is_retried(
    qwen3_model_dir: Path, loaded_model: Model, engines: Engines
) -> None:
    first, second = engines
    settings = gateway_settings(qwen3_model_dir, [first.url, second.url])
    with gateway_app(loaded_model, settings) as url:
        ids = tokens(url, "ok")
        first.default = Script(ids, drop_after=0)
        second.default = Script([*ids, EOS])
        events = sse_events(httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10))
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
        assert (first.outcomes(), second.outcomes()) == (["failed"], ["finished"])


def test_an_error_after_the_first_token_ends_the_stream_cleanly(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "one two three four")
    for engine in engines:
        engine.default = Script([*ids, EOS], drop_after=2)
    events = sse_events(httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10))
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "InternalServerError" and error["code"] == 500
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-2]) == "one two"
    assert len(_all_records(engines)) == 1  # no second engine once tokens were sent

    for engine in engines:
        engine.default = Script([*ids, EOS], error_after=1)
    events = sse_events(httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10))
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 500


def test_no_engine_answers_503_in_vllm_shape(qwen3_model_dir: Path, loaded_model: Model) -> None:
    settings = gateway_settings(qwen3_model_dir, [unused_url(), unused_url()])
    with gateway_app(loaded_model, settings) as url:
        for stream in (False, True):
            response = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": stream}, timeout=10)
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["type"] == "ServiceUnavailableError" and "ConnectError" in error["message"]


def test_a_dead_engine_is_skipped_and_a_first_token_timeout_fails_over(
    qwen3_model_dir: Path, loaded_model: Model, engines: Engines
) -> None:
    # The dead engine fails its first health probe and is skipped (connect failures: the 503 test).
    settings = gateway_settings(qwen3_model_dir, [unused_url(), engines[0].url, engines[1].url], engine_timeout=0.5)
    with gateway_app(loaded_model, settings) as url:
        ids = tokens(url, "made it")
        engines[0].scripts.append(Script([*ids, EOS], stall_before_first=3))  # past the 0.5 s timeout
        engines[0].default = engines[1].default = Script([*ids, EOS])
        response = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
        assert response.status_code == 200 and "made it" in "".join(
            e["choices"][0]["delta"].get("content", "") for e in sse_events(response)[:-1] if e["choices"]
        )
        assert (engines[0].outcomes(), engines[1].outcomes()) == (["cancelled"], ["finished"])
        metrics = httpx.get(f"{url}/metrics").text
        errors = [line for line in metrics.splitlines() if line.startswith("render_gateway_engine_errors_total")]
        assert [line.split("kind=")[1] for line in errors] == ['"health"} 1.0', '"timeout"} 1.0'], errors


def test_least_outstanding_requests(qwen3_model_dir: Path, loaded_model: Model, engines: Engines) -> None:
    first, second = engines
    settings = gateway_settings(qwen3_model_dir, [first.url, second.url])
    with gateway_app(loaded_model, settings) as gateway:
        ids = tokens(gateway, "x")
        first.default = Script([*ids, EOS], stall_after=1)  # holds its slot until the client leaves
        second.default = Script([*ids, EOS])
        with httpx.Client(timeout=10) as client:
            with client.stream("POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}) as held:
                assert held.status_code == 200 and first.outcomes() == ["running"]
                # `first` has one request outstanding, `second` none: the next three go to `second`.
                for _ in range(3):
                    assert client.post(f"{gateway}/v1/chat/completions", json=CHAT).status_code == 200
                assert (len(first.records), len(second.records)) == (1, 3)
        assert first.wait_for("cancelled")
        # Both idle again: ties alternate.
        first.default = Script([*ids, EOS])
        for _ in range(2):
            assert httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
        assert (len(first.records), len(second.records)) == (2, 4)


def test_client_disconnect_cancels_the_engine_request(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "a b c d")
    before = _disconnects(gateway)
    for engine in engines:
        engine.default = Script([*ids, EOS], stall_after=1)
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk: the engine is generating
    assert any(e.wait_for("cancelled") for e in engines)

    # Non-streaming: the engine stalls before answering; the client gives up.
    for engine in engines:
        engine.records.clear()
        engine.default = Script([*ids, EOS], stall_before_first=1.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, timeout=0.5)
    assert any(e.wait_for("cancelled") for e in engines)
    assert _disconnects(gateway) == before + 2


def _disconnects(gateway: str) -> float:
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith("render_gateway_client_disconnects_total "):
            return float(line.split()[1])
    raise AssertionError("no disconnect counter")


def test_health_probes_mark_engines_down_and_up(qwen3_model_dir: Path, loaded_model: Model, engines: Engines) -> None:
    settings = gateway_settings(qwen3_model_dir, [engines[0].url, engines[1].url], engine_health_interval=0.1)
    engines[0].healthy = False
    with gateway_app(loaded_model, settings) as url:
        ids = tokens(url, "y")
        engines[0].default = engines[1].default = Script([*ids, EOS])
        time.sleep(0.3)
        for _ in range(3):
            assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
        assert (len(engines[0].records), len(engines[1].records)) == (0, 3)
        metrics = httpx.get(f"{url}/metrics").text
        assert f'render_gateway_engine_healthy{{engine="{engines[0].url}"}} 0.0' in metrics
        engines[0].healthy = True
        time.sleep(0.3)
        assert f'render_gateway_engine_healthy{{engine="{engines[0].url}"}} 1.0' in httpx.get(f"{url}/metrics").text
        for _ in range(2):
            httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10)
        assert len(engines[0].records) >= 1  # back in rotation


def test_metrics_report_ttft_inter_token_and_inflight(gateway: str, engines: Engines) -> None:
    ids = tokens(gateway, "one two three")
    for engine in engines:
        engine.default = Script([*ids, EOS])
    httpx.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
    metrics = httpx.get(f"{gateway}/metrics").text
    assert 'render_gateway_time_to_first_token_seconds_count{endpoint="chat_completions"}' in metrics
    assert 'render_gateway_inter_token_seconds_count{endpoint="chat_completions"}' in metrics
    for engine in engines:
        assert f'render_gateway_engine_inflight_requests{{engine="{engine.url}"}} 0.0' in metrics


def test_routes_exist_only_with_engines(qwen3_model_dir: Path, loaded_model: Model) -> None:
    from starlette.testclient import TestClient

    from render_service.settings import Settings

    settings = Settings(model=str(qwen3_model_dir), served_model_name=[MODEL]).validate()
    with TestClient(create_app(settings, loaded_model)) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 404
