"""Hostile inputs: every bound is checked before the work it protects, and answered with a 4xx in
vLLM's error shape (never a 500). Each case once failed with a 500 or did unbounded work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.render.pipeline import MAX_MESSAGES, MAX_TOOLS
from render_service.server.app import create_app
from render_service.settings import Settings

M = [{"role": "user", "content": "hi"}]
BIG = 10**12  # above the vocabulary, and above what the tokenizer's u32 ids can hold


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path):
    settings = Settings(
        model=str(qwen3_model_dir),
        served_model_name=["m"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=4096,
    ).validate()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def nested_schema(levels: int) -> str:
    return '{"type":"object","properties":{"a":' * levels + '{"type":"string"}' + "}}" * levels


def chunk(token_ids: list[int], logprobs: Any = None, prompt_token_ids: Any = None) -> dict[str, Any]:
    body = {"request_id": "x", "choices": [{"index": 0, "token_ids": token_ids, "logprobs": logprobs}]}
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    return body


def chat_stream(state: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "stream": True,
        "chat_request": {"messages": M},
        "prompt_token_ids": [5],
        "generate_chunk": chunk([5]),
        "stream_state": state,
        **extra,
    }


CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"
CHAT_D = "/v1/chat/completions/derender"
CMPL_D = "/v1/completions/derender"

# (path, body (bytes are sent raw), expected status, a fragment of the error message)
CASES: dict[str, tuple[str, Any, int, str]] = {
    "json nested past 1024 levels": (CHAT, b"[" * 2000 + b"]" * 2000, 400, "nested deeper than 1024"),
    "integer of 5000 digits": (CHAT, b'{"messages":[],"seed":1' + b"0" * 5000 + b"}", 400, "json_invalid"),
    "not utf-8": (CHAT, b"\xff\xfe", 400, "json_invalid"),
    "too many messages": (
        CHAT,
        {"messages": [{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)},
        400,
        "Too many messages",
    ),
    "too many tools": (
        CHAT,
        {"messages": M, "tools": [{"type": "function", "function": {"name": "f"}}] * (MAX_TOOLS + 1)},
        400,
        "Too many tools",
    ),
    "n above VLLM_MAX_N_SEQUENCES": (CHAT, {"messages": M, "n": 10**9}, 400, "n must be at most 16384"),
    "completion prompt longer than max_model_len": (CMPL, {"prompt": [1] * 5000}, 400, "maximum context length"),
    "kv prompt ids out of vocabulary": (
        CHAT,
        {"messages": M, "kv_transfer_params": {"prompt_token_ids": [BIG]}},
        400,
        "out of vocabulary",
    ),
    "batch logprob id out of vocabulary": (
        CMPL_D,
        {
            "generate_responses": [
                {
                    "request_id": "x",
                    "choices": [
                        {"index": 0, "token_ids": [5], "logprobs": {"content": [{"token_id": BIG, "logprob": 0.0}]}}
                    ],
                }
            ]
        },
        400,
        "out of the vocabulary",
    ),
    "batch top logprob id negative": (
        CHAT_D,
        {
            "chat_request": {"messages": M},
            "prompt_token_ids": [5],
            "generate_response": {
                "request_id": "x",
                "choices": [
                    {
                        "index": 0,
                        "token_ids": [5],
                        "logprobs": {
                            "content": [
                                {"token_id": 5, "logprob": 0.0, "top_logprobs": [{"token_id": -4, "logprob": 0.0}]}
                            ]
                        },
                    }
                ],
            },
        },
        400,
        "out of the vocabulary",
    ),
    "batch response prompt ids out of vocabulary": (
        CMPL_D,
        {
            "generate_responses": [
                {"request_id": "x", "prompt_token_ids": [BIG], "choices": [{"index": 0, "token_ids": [5]}]}
            ]
        },
        400,
        "out of the vocabulary",
    ),
    "stream logprob id out of vocabulary": (
        CMPL_D,
        {"stream": True, "generate_chunk": chunk([5], {"content": [{"token_id": BIG, "logprob": 0.0}]})},
        400,
        "out of the vocabulary",
    ),
    "stream top_logprobs above max_logprobs": (
        CMPL_D,
        {
            "stream": True,
            "generate_chunk": chunk(
                [5],
                {"content": [{"token_id": 5, "logprob": 0.0, "top_logprobs": [{"token_id": 5, "logprob": 0.0}] * 21}]},
            ),
        },
        400,
        "exceeds max_logprobs (20)",
    ),
    "stream logprobs longer than max_model_len": (
        CHAT_D,
        chat_stream(generate_chunk=chunk([5], {"content": [{"token_id": 5, "logprob": 0.0}] * 4097})),
        400,
        "exceeds max_model_len",
    ),
    "stream prompt ids out of vocabulary": (
        CMPL_D,
        {"stream": True, "prompt_token_ids": [BIG], "generate_chunk": chunk([5])},
        400,
        "out of the vocabulary",
    ),
    "stream chunk prompt ids out of vocabulary": (
        CMPL_D,
        {"stream": True, "generate_chunk": chunk([5], prompt_token_ids=[BIG])},
        400,
        "out of the vocabulary",
    ),
    "chat stream prompt ids out of vocabulary": (
        CHAT_D,
        chat_stream(prompt_token_ids=[BIG]),
        400,
        "out of the vocabulary",
    ),
    "stream_state output ids out of vocabulary": (
        CHAT_D,
        chat_stream({"output_token_ids": [BIG], "output_chunk_lens": [1]}),
        400,
        "out of the vocabulary",
    ),
    "stream_state output ids negative": (
        CHAT_D,
        chat_stream({"output_token_ids": [-5], "output_chunk_lens": [1]}),
        400,
        "out of the vocabulary",
    ),
    "stream_state chunk lens inconsistent": (
        CHAT_D,
        chat_stream({"output_token_ids": [5, 6], "output_chunk_lens": [1]}),
        400,
        "must sum",
    ),
    "stream_state offsets past the window": (
        CMPL_D,
        {
            "stream": True,
            "generate_chunk": chunk([5]),
            "stream_state": {"prev_tokens": ["a"], "prefix_offset": 10**9, "read_offset": 10**9},
        },
        400,
        "prefix_offset <= read_offset",
    ),
    "stream_state prev_tokens above 1024": (
        CMPL_D,
        {"stream": True, "generate_chunk": chunk([5]), "stream_state": {"prev_tokens": ["a"] * 1025}},
        400,
        "exceeds maximum (1024)",
    ),
    "stream_state logprob context above 4": (
        CMPL_D,
        {"stream": True, "generate_chunk": chunk([5]), "stream_state": {"logprob_context_token_ids": [1] * 5}},
        400,
        "at most 4 items",
    ),
    "stream_state logprob context out of vocabulary": (
        CMPL_D,
        {"stream": True, "generate_chunk": chunk([5]), "stream_state": {"logprob_context_token_ids": [BIG]}},
        400,
        "out of the vocabulary",
    ),
    "stream_state too many tool call ids": (
        CHAT_D,
        chat_stream({"last_tool_call_ids": ["x"] * 4097}),
        400,
        "last_tool_call_ids",
    ),
    "stream_state tool call id too long": (
        CHAT_D,
        chat_stream({"last_tool_call_ids": ["x" * 513]}),
        400,
        "last_tool_call_ids",
    ),
    "stream output past max_model_len": (
        CHAT_D,
        chat_stream({"output_token_ids": [5] * 4096, "output_chunk_lens": [4096]}),
        400,
        "exceeds max_model_len",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_a_4xx_in_vllm_shape(client: TestClient, name: str) -> None:
    path, body, status, fragment = CASES[name]
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert fragment in error["message"], error["message"][:500]


_DEEP_BODIES = {
    "tools": (
        CHAT,
        '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":'
        '{"name":"f","parameters":SCHEMA}}]}',
    ),
    "response_format": (
        CHAT,
        '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":'
        '"json_schema","json_schema":{"name":"x","schema":SCHEMA}}}',
    ),
    "structured_outputs": (CHAT, '{"messages":[{"role":"user","content":"hi"}],"structured_outputs":{"json":SCHEMA}}'),
    "chat_template_kwargs": (CHAT, '{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":SCHEMA}}'),
    "kv_transfer_params": (
        CHAT_D,
        '{"chat_request":{"messages":[{"role":"user","content":"hi"}]},"prompt_token_ids":'
        '[5],"generate_response":{"request_id":"x","kv_transfer_params":SCHEMA,"choices":'
        '[{"index":0,"token_ids":[5]}]}}',
    ),
}


@pytest.mark.parametrize("field", list(_DEEP_BODIES))
def test_deep_json_is_echoed_or_refused_never_a_500(client: TestClient, field: str) -> None:
    """orjson parses 1024 levels but encodes 254, and responses echo request data: 127 schema levels
    (~260 JSON levels) are served; 500 levels are refused with a 400."""
    path, template = _DEEP_BODIES[field]
    for levels, expected in ((127, 200), (500, 400)):
        body = template.replace("SCHEMA", nested_schema(levels)).encode()
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == expected, (levels, response.text[:300])
        if expected == 200:
            assert response.content.count(b'"properties"') >= levels


def test_body_limit_holds_without_a_content_length(qwen3_model_dir: Path) -> None:
    """A chunked upload (no Content-Length to check up front) is cut off at the limit while it streams."""
    settings = Settings(model=str(qwen3_model_dir), served_model_name=["m"], max_request_body_bytes=4096).validate()

    def body():
        for _ in range(1000):  # 1 MB offered in 1 KB pieces
            yield b"x" * 1024

    with TestClient(create_app(settings)) as small:
        response = small.post("/v1/completions/render", content=body(), headers={"content-type": "application/json"})
        declared = small.post(
            "/v1/completions/render",
            content=b"{}",
            headers={"content-type": "application/json", "content-length": str(10**12)},
        )
    assert response.status_code == 413 and response.json()["error"]["type"] == "PayloadTooLargeError"
    assert declared.status_code == 413
