"""Derender on a Mistral (Tekken) model where vLLM 0.33 fails: a character split across byte tokens.

vLLM's Mistral tokenizer hands such pieces out as `bytes`, which its render tier cannot put in a
stream_state: the stream answers 400 ("Object of type bytes is not JSON serializable") from the
first byte token on. Ours carries them as marked hex strings and streams the character once whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

from render_service.model.mistral import MistralTokenizer
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.mistral_fixture import build_mistral_model
from tests.parity.derender_corpus import gen_choice, gen_chunk


def test_a_character_split_across_byte_tokens_streams_whole(tmp_path: Path) -> None:
    model_dir = build_mistral_model(tmp_path / "v13", "v13")
    tokenizer = MistralTokenizer(model_dir)
    ids = [*tokenizer.encode("Hi 😀 ok", False), tokenizer.eos_token_id]
    assert any(tokenizer.raw.is_byte(i) for i in ids)  # the emoji is byte pieces in this vocabulary
    settings = Settings(model=str(model_dir), served_model_name=["t"]).validate()
    content, state = "", None
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        for index, token in enumerate(ids):
            finish = "stop" if index == len(ids) - 1 else None
            body = {
                "stream": True,
                "model": "t",
                "generate_chunk": gen_chunk("r", [gen_choice(0, [token], finish, None, None, None)]),
                "prompt_token_ids": [1, 3, 1072, 4],
                "prompt_tokens": 4,
            }
            if state is not None:
                body["stream_state"] = state
            response = client.post("/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            state = response.json()["stream_state"]
            content += response.json()["chunk"]["choices"][0]["delta"]["content"] or ""
    assert content == "Hi 😀 ok"
