"""The `mistral` renderer end to end on a real engine: our render tier renders a chat for a tiny
Mistral-tokenizer model, a real vLLM 0.32 `--tokens-only` CPU engine generates from those ids, and
our render tier derenders the engine's tokens (batch and streaming); with a vLLM 0.33 render tier
available, its derender of the same engine output is compared with ours.

The model folder is the v13 Tekken fixture (`tests/mistral_fixture.py`: mistral-common's bundled
vocabulary, 9,000 ids) with a `MistralForCausalLM` config and random bf16 weights written by
transformers in the engine's venv. Both sides run it with `--tokenizer-mode mistral`: the folder has
HF-format weights, not `consolidated.safetensors`, so nothing would pick the mode by itself.

Run with `pytest -m live tests/integration/test_mistral_engine.py` (~2 min: one engine, ~4 GB);
skipped without the engine env (VLLM_ENGINE_PYTHON).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.helpers import drive_stream
from tests.integration.engine_fixture import (
    app_server,
    engine_python,
    render_oracle_python,
    start_engine,
    start_render_oracle,
)
from tests.mistral_fixture import build_mistral_model

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(900),
    pytest.mark.skipif(engine_python() is None, reason="no vLLM engine env (VLLM_ENGINE_PYTHON)"),
]

SERVED_NAME = "tinymistral"
MAX_MODEL_LEN = 4096
# Not 16: vLLM 0.33's render (and ours) leaves `max_tokens` out of sampling_params when it equals
# SamplingParams' default of 16, and a 0.32 engine then reads "not given" and generates to the
# context limit.
MAX_TOKENS = 12
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
# System prompt, reasoning history, a tool round trip and tools: the v13 prompt's parts.
CHAT: dict[str, Any] = {
    "model": SERVED_NAME,
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "The user wants the weather; call the tool.",
            "tool_calls": [
                {
                    "id": "call12345",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call12345", "content": '{"celsius": 21}'},
        {"role": "assistant", "content": "It is 21 degrees in Paris."},
        {"role": "user", "content": "And should I take a coat tonight?"},
    ],
    "tools": TOOLS,
    "max_tokens": MAX_TOKENS,
    "temperature": 0,
}

# Runs in the engine venv (torch and transformers there): random weights for the fixture's config.
_WEIGHTS_SCRIPT = """
import sys
import torch
from transformers import MistralConfig, MistralForCausalLM
torch.manual_seed(0)
config = MistralConfig.from_pretrained(sys.argv[1])
config.head_dim = 32  # 16 is rejected by vLLM's CPU attention kernel
MistralForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_mistral_model(tmp_path_factory.mktemp("mistral-engine") / "tinymistral", "v13")
    (folder / "consolidated.safetensors").unlink()  # the render-only scalar; the engine loads real weights
    subprocess.run(
        [str(engine_python()), "-c", _WEIGHTS_SCRIPT, str(folder)],
        check=True,
        capture_output=True,
        timeout=600,
        env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
    )
    assert (folder / "model.safetensors").exists() and (folder / "tekken.json").exists()
    return folder


@pytest.fixture(scope="module")
def servers(model_dir: Path) -> Iterator[dict[str, str]]:
    engine = start_engine(model_dir, served_name=SERVED_NAME, max_model_len=MAX_MODEL_LEN)
    settings = Settings(
        model=str(model_dir),
        served_model_name=[SERVED_NAME],
        max_model_len=MAX_MODEL_LEN,
        tokenizer_mode="mistral",
        reasoning_parser="mistral",
    ).validate()
    try:
        with app_server(create_app(settings)) as ours:
            yield {"render": ours, "engine": engine.url}
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def round_trip(servers: dict[str, str]) -> dict[str, Any]:
    with httpx.Client(timeout=120) as client:
        rendered = client.post(f"{servers['render']}/v1/chat/completions/render", json=CHAT)
        assert rendered.status_code == 200, rendered.text
        request = rendered.json()
        generated = client.post(f"{servers['engine']}/inference/v1/generate", json=request)
        assert generated.status_code == 200, generated.text
        derender_body = {
            "model": SERVED_NAME,
            "generate_response": generated.json(),
            "prompt_token_ids": request["token_ids"],
            "chat_request": CHAT,
        }
        derendered = client.post(f"{servers['render']}/v1/chat/completions/derender", json=derender_body)
        assert derendered.status_code == 200, derendered.text
    return {
        "request": request,
        "generated": generated.json(),
        "derender_body": derender_body,
        "message": derendered.json(),
    }


def test_the_engine_generates_from_our_mistral_prompt(round_trip: dict[str, Any], model_dir: Path) -> None:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    request, generated = round_trip["request"], round_trip["generated"]
    library = MistralTokenizer.from_file(str(model_dir / "tekken.json"))
    expected = library.encode_chat_completion(
        ChatCompletionRequest.from_openai(messages=CHAT["messages"], tools=TOOLS)
    ).tokens
    assert request["token_ids"] == expected  # mistral-common's own prompt
    assert generated["usage"]["prompt_tokens"] == len(expected)  # the engine took every id
    output = generated["choices"][0]["token_ids"]
    assert len(output) == MAX_TOKENS and all(0 <= token < 9000 for token in output)


def test_derender_gives_the_engines_tokens_as_text(round_trip: dict[str, Any], model_dir: Path) -> None:
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    output = round_trip["generated"]["choices"][0]["token_ids"]
    choice = round_trip["message"]["choices"][0]
    library = MistralTokenizer.from_file(str(model_dir / "tekken.json"))
    tekken = library.instruct_tokenizer.tokenizer
    text = tekken.decode(output, special_token_policy=SpecialTokenPolicy.IGNORE)
    message = choice["message"]
    assert choice["finish_reason"] == "length"
    assert round_trip["message"]["usage"]["completion_tokens"] == MAX_TOKENS
    if tekken.get_special_token("[THINK]") in output:  # random weights: reasoning and content share the text
        assert (message["reasoning"] or "") + (message["content"] or "") == text
    else:  # no [THINK]: all of it is content
        assert message["content"] == text and message["reasoning"] is None


def test_streaming_derender_matches_batch(servers: dict[str, str], round_trip: dict[str, Any]) -> None:
    output = round_trip["generated"]["choices"][0]["token_ids"]
    base = {"model": SERVED_NAME, "chat_request": CHAT, "prompt_token_ids": round_trip["request"]["token_ids"]}
    with httpx.Client(timeout=60) as client:

        def post(_: int, body: dict[str, Any]) -> dict[str, Any]:
            response = client.post(f"{servers['render']}/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            return dict(response.json())

        streamed = drive_stream(post, base, output, [3] * (len(output) // 3) + [len(output) % 3], "length")
    message = round_trip["message"]["choices"][0]["message"]
    assert streamed["content"] == (message["content"] or "")
    assert streamed["reasoning"] == (message["reasoning"] or "")
    assert streamed["finish_reason"] == "length"


@pytest.mark.skipif(render_oracle_python() is None, reason="no vLLM 0.33 env (VLLM_ORACLE_PYTHON)")
def test_vllms_render_tier_renders_and_derenders_as_we_do(round_trip: dict[str, Any], model_dir: Path) -> None:
    """Without parsers on both sides: with `--reasoning-parser mistral` (or the mistral tool
    parser) vLLM 0.33 answers 400 on every v11+ chat render (docs/parity.md, Mistral)."""
    flags = ["--served-model-name", SERVED_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--tokenizer-mode", "mistral"]
    settings = Settings(
        model=str(model_dir), served_model_name=[SERVED_NAME], max_model_len=MAX_MODEL_LEN, tokenizer_mode="mistral"
    ).validate()
    oracle = start_render_oracle(model_dir, *flags)
    try:
        with app_server(create_app(settings)) as ours, httpx.Client(timeout=120) as client:
            answers = {}
            for name, url in (("ours", ours), ("vLLM", oracle.url)):
                rendered = client.post(f"{url}/v1/chat/completions/render", json=CHAT)
                assert rendered.status_code == 200, (name, rendered.text)
                derendered = client.post(f"{url}/v1/chat/completions/derender", json=round_trip["derender_body"])
                assert derendered.status_code == 200, (name, derendered.text)
                answers[name] = (rendered.json(), derendered.json())
    finally:
        oracle.stop()
    (our_render, our_message), (their_render, their_message) = answers["ours"], answers["vLLM"]
    assert our_render["token_ids"] == their_render["token_ids"] == round_trip["request"]["token_ids"]
    for volatile in ("id", "created"):
        our_message.pop(volatile, None)
        their_message.pop(volatile, None)
    assert our_message == their_message
