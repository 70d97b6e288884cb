"""No render hands the engine a token id outside the vocabulary (an out-of-vocabulary id can take a
`--tokens-only` engine core down): every id a client chose is checked before the request leaves,
with a 400 in vLLM's error shape carrying the message vLLM's engine gives for the same id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

VOCAB = 151_936  # the example model's config vocab_size (its tokenizer has 151,669 ids)
CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"
RESP = "/v1/responses/render"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path):
    settings = Settings(
        model=str(qwen3_model_dir),
        served_model_name=["m"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=2048,
    ).validate()
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def error(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    err = response.json()["error"]
    assert list(err) == ["message", "type", "param", "code"] and err["type"] == "BadRequestError"
    return err


@pytest.mark.parametrize(
    "prompt",
    [[1_000_000_000_000], [VOCAB], [1, 2, VOCAB + 5], [[1, 2], [3, 10**12]], [[VOCAB]]],
    ids=["issue-15", "at-vocab-size", "last", "second-prompt", "nested"],
)
def test_completion_token_prompts_outside_the_vocabulary(client: TestClient, prompt: list[Any]) -> None:
    err = error(client, CMPL, {"prompt": prompt})
    flat = [i for p in prompt for i in (p if isinstance(p, list) else [p])]
    assert err["message"] == f"Token id {max(flat)} is out of vocabulary (parameter=prompt)"
    assert err["param"] == "prompt"


def test_the_last_id_of_the_vocabulary_passes(client: TestClient) -> None:
    response = client.post(CMPL, json={"prompt": [0, VOCAB - 1]})
    assert response.status_code == 200, response.text
    assert response.json()[0]["token_ids"] == [0, VOCAB - 1]


@pytest.mark.parametrize("path", [CHAT, RESP, CMPL])
def test_forwarded_prompt_token_ids(client: TestClient, path: str) -> None:
    """Chat and Responses reuse `kv_transfer_params.prompt_token_ids` (vLLM's check and message);
    completions forwards them to the engine as sent: checked the same way."""
    body: dict[str, Any] = {"kv_transfer_params": {"prompt_token_ids": [1, 2, 10**12]}}
    body.update({CHAT: {"messages": HI}, RESP: {"input": "hi"}, CMPL: {"prompt": "hi"}}[path])
    err = error(client, path, body)
    assert (
        err["message"] == "Token id 1000000000000 is out of vocabulary (parameter=kv_transfer_params.prompt_token_ids)"
    )


def test_responses_reuse_forwarded_prompt_ids_as_vllm_does(client: TestClient) -> None:
    body = {"input": "hi", "kv_transfer_params": {"prompt_token_ids": [1, 2, 3], "x": 1}}
    rendered = client.post(RESP, json=body).json()
    assert rendered["token_ids"] == [1, 2, 3]
    assert rendered["kv_transfer_params"] == {"x": 1}


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize(
    ("field", "value"),
    [("stop_token_ids", [VOCAB]), ("allowed_token_ids", [VOCAB]), ("logit_bias", {str(VOCAB): 1.0})],
)
def test_sampling_token_ids_are_left_to_the_engine(client: TestClient, path: str, field: str, value: Any) -> None:
    """As vLLM's render tier does (golden `chat_logit_bias_out_of_vocab`): the engine's
    `SamplingParams.verify` refuses them with a 400 before they index anything."""
    body: dict[str, Any] = {CHAT: {"messages": HI}, CMPL: {"prompt": "hi"}}[path]
    response = client.post(path, json={**body, field: value})
    assert response.status_code == 200, response.text


def test_chat_prompt_token_ids_reuse_at_the_boundary(client: TestClient) -> None:
    body = {"messages": HI, "kv_transfer_params": {"prompt_token_ids": [1, VOCAB - 1]}}
    assert client.post(CHAT, json=body).json()["token_ids"] == [1, VOCAB - 1]
    body = {"messages": HI, "kv_transfer_params": {"prompt_token_ids": [1, VOCAB]}}
    assert error(client, CHAT, body)["param"] == "kv_transfer_params.prompt_token_ids"
