"""An engine-based family through the HTTP edge: `--tool-call-parser qwen3_coder` renders with
the parser's request adjustments and derenders XML tool calls, batch and streaming, in full and
compact stream-state modes (the compact snapshot carries the request's tools, which the
arguments are coerced to)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.helpers import chunk_body, drive_stream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
            },
        },
    }
]
CHAT_REQUEST = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}
CITY = "Paris, " + "très belle ville 🌦️ " * 40
OUTPUT_TEXT = (
    "<think>\nNeed the weather.\n</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n"
    f"<parameter=city>\n{CITY}\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call><|im_end|>"
)


def make_app(model_dir: Path, **overrides: Any) -> Any:
    values = dict(
        model=str(model_dir),
        served_model_name=["tinyqwen3"],
        reasoning_parser="qwen3",
        tool_call_parser="qwen3_coder",
        enable_auto_tool_choice=True,
        max_model_len=16384,
    )
    values.update(overrides)
    return create_app(Settings(**values).validate())


@pytest.fixture(scope="module", params=["full", "compact"])
def client(request: pytest.FixtureRequest, qwen3_model_dir: Path) -> Any:
    with TestClient(make_app(qwen3_model_dir, stream_state_mode=request.param)) as test_client:
        yield test_client


def test_render_applies_the_parsers_request_adjustments(client: TestClient) -> None:
    rendered = client.post("/v1/chat/completions/render", json={**CHAT_REQUEST, "skip_special_tokens": True}).json()
    assert rendered["sampling_params"]["skip_special_tokens"] is False
    strict = [dict(TOOLS[0], function=dict(TOOLS[0]["function"], strict=True))]
    rendered = client.post("/v1/chat/completions/render", json={**CHAT_REQUEST, "tools": strict}).json()
    tag = json.loads(rendered["sampling_params"]["structured_outputs"]["structural_tag"])
    assert tag["format"]["triggers"] == ["<tool_call>\n<function="]


def test_xml_tool_calls_stream_as_batch(client: TestClient) -> None:
    rendered = client.post("/v1/chat/completions/render", json=CHAT_REQUEST).json()
    output = client.post("/tokenize", json={"prompt": OUTPUT_TEXT, "add_special_tokens": False}).json()["tokens"]
    base = {
        "model": "tinyqwen3",
        "chat_request": CHAT_REQUEST,
        "prompt_token_ids": rendered["token_ids"],
        "prompt_tokens": len(rendered["token_ids"]),
    }
    body = {
        **base,
        "generate_response": {
            "request_id": "generate-tokens-chatcmpl-xml",
            "output_mode": "tokens",
            "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": None, "token_ids": output}],
        },
    }
    response = client.post("/v1/chat/completions/derender", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    message = choice["message"]
    assert message["reasoning"] == "\nNeed the weather.\n"
    # vLLM's batch strips the content ("Checking."); ours keeps its leading whitespace, which the
    # stream sends before any call is known, and strips the trailing one (deliberate, rule 2 of
    # docs/parsers.md "Streaming accumulates to the batch answer").
    assert message["content"] == "\n\nChecking."
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": CITY, "days": 3, "metric": True}
    assert choice["finish_reason"] == "tool_calls"

    def post(index: int, chunk: dict[str, Any]) -> dict[str, Any]:
        if index > 0 and client.app.state.render.settings.stream_state_mode == "compact":
            chunk.pop("prompt_token_ids")
            chunk.pop("chat_request")
        got = client.post("/v1/chat/completions/derender", json=chunk)
        assert got.status_code == 200, got.text
        return got.json()

    for lens in ([1] * len(output), [3, 1, 5] * len(output)):
        streamed = drive_stream(post, base, output, _fit(lens, len(output)))
        assert streamed["reasoning"] == message["reasoning"]
        assert streamed["content"] == message["content"]  # accumulates to the batch answer
        assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"]] == [
            (call["function"]["name"], call["function"]["arguments"])
        ]
        assert streamed["finish_reason"] == "tool_calls"


def _fit(lens: list[int], total: int) -> list[int]:
    out, used = [], 0
    for n in lens:
        if used >= total:
            break
        out.append(min(n, total - used))
        used += out[-1]
    return out


def test_chunk_body_is_shared() -> None:
    assert chunk_body({"model": "m"}, [1], None, None)["generate_chunk"]["choices"][0]["token_ids"] == [1]
