"""LoRA end to end on a real engine: a tiny random-weight LoRA adapter loaded in a real vLLM 0.32
`--tokens-only` CPU engine (`--enable-lora --lora-modules sql=...`), and our render tier serving the
same adapter name: render (model "sql") -> /inference/v1/generate -> derender.

The engine picks the adapter from the GenerateRequest's `model` (vLLM's `_maybe_get_adapters`), so
the adapter's greedy tokens must differ from the base model's for the same rendered prompt (the
adapter's weights are large on purpose), and an adapter the engine does not have is its 404.

Run with `pytest -m live tests/integration/test_lora_engine.py` (~2 min: one engine, ~4 GB);
skipped without the engine env (VLLM_ENGINE_PYTHON).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.integration.engine_fixture import SERVED_NAME, app_server, build_weighted_model, engine_python, start_engine
from tests.parity.lora_corpus import write_adapter

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(900),
    pytest.mark.skipif(engine_python() is None, reason="no vLLM engine env (VLLM_ENGINE_PYTHON)"),
]

MAX_MODEL_LEN = 4096
RANK = 8
CHAT = {"messages": [{"role": "user", "content": "Write SQL for the top 3 users."}], "max_tokens": 8}

# Runs in the engine venv (torch and safetensors there): PEFT's tensor names and shapes for q_proj and
# v_proj of every layer, with lora_B non-zero (PEFT starts it at zero, which would change nothing).
_ADAPTER_WEIGHTS = """
import json, sys
import torch
from safetensors.torch import save_file
model_dir, adapter_dir, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = json.load(open(f"{model_dir}/config.json"))
hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
head_dim = config.get("head_dim") or hidden // heads
out = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
torch.manual_seed(1)
tensors = {}
for layer in range(config["num_hidden_layers"]):
    for name, features in out.items():
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, dtype=torch.bfloat16)
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(features, rank, dtype=torch.bfloat16)
save_file(tensors, f"{adapter_dir}/adapter_model.safetensors")
"""


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_weighted_model()


@pytest.fixture(scope="module")
def adapter(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_adapter(tmp_path_factory.mktemp("lora") / "sql-adapter", str(model_dir))
    config = (folder / "adapter_config.json").read_text()
    assert f'"r": {RANK}' in config
    subprocess.run(
        [str(engine_python()), "-c", _ADAPTER_WEIGHTS, str(model_dir), str(folder), str(RANK)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return folder


@pytest.fixture(scope="module")
def servers(model_dir: Path, adapter: Path) -> Iterator[dict[str, str]]:
    engine = start_engine(
        model_dir,
        "--enable-lora",
        "--max-lora-rank",
        str(RANK),
        "--lora-modules",
        f"sql={adapter}",
        max_model_len=MAX_MODEL_LEN,
    )
    settings = Settings(
        model=str(model_dir),
        served_model_name=[SERVED_NAME],
        max_model_len=MAX_MODEL_LEN,
        lora_modules=[f"sql={adapter}", f"missing-on-engine={adapter}"],
    ).validate()
    try:
        with app_server(create_app(settings)) as ours:
            yield {"render": ours, "engine": engine.url}
    finally:
        engine.stop()


def _round_trip(servers: dict[str, str], model: str) -> tuple[dict[str, Any], httpx.Response, dict[str, Any]]:
    with httpx.Client(timeout=120) as client:
        body = {**CHAT, "model": model, "temperature": 0}
        rendered = client.post(f"{servers['render']}/v1/chat/completions/render", json=body)
        assert rendered.status_code == 200, rendered.text
        request = rendered.json()
        generated = client.post(f"{servers['engine']}/inference/v1/generate", json=request)
        if generated.status_code != 200:
            return request, generated, {}
        derendered = client.post(
            f"{servers['render']}/v1/chat/completions/derender",
            json={
                "model": model,
                "generate_response": generated.json(),
                "prompt_token_ids": request["token_ids"],
                "chat_request": body,
            },
        )
        assert derendered.status_code == 200, derendered.text
        return request, generated, derendered.json()


def test_the_engine_lists_the_adapter_as_we_do(servers: dict[str, str], adapter: Path) -> None:
    engine_cards = httpx.get(f"{servers['engine']}/v1/models").json()["data"]
    ours = httpx.get(f"{servers['render']}/v1/models").json()["data"]
    pick = ("id", "root", "parent", "max_model_len", "owned_by")
    engine_sql = next(c for c in engine_cards if c["id"] == "sql")
    our_sql = next(c for c in ours if c["id"] == "sql")
    assert {k: engine_sql[k] for k in pick} == {k: our_sql[k] for k in pick}
    assert list(engine_sql) == list(our_sql)


def test_render_generate_derender_with_the_adapter(servers: dict[str, str]) -> None:
    base_request, base_generated, base_message = _round_trip(servers, SERVED_NAME)
    lora_request, lora_generated, lora_message = _round_trip(servers, "sql")
    assert base_generated.status_code == 200 and lora_generated.status_code == 200
    # The same prompt, the adapter named for the engine ...
    assert lora_request["token_ids"] == base_request["token_ids"] and lora_request["model"] == "sql"
    # ... which applied it: other greedy tokens than the base model's.
    base_ids = base_generated.json()["choices"][0]["token_ids"]
    lora_ids = lora_generated.json()["choices"][0]["token_ids"]
    assert len(lora_ids) == len(base_ids) == CHAT["max_tokens"]
    assert lora_ids != base_ids
    assert lora_message["model"] == "sql" and base_message["model"] == SERVED_NAME
    assert lora_message["usage"]["completion_tokens"] == len(lora_ids)


def test_an_adapter_the_engine_lacks_is_its_404(servers: dict[str, str]) -> None:
    """Render accepts every adapter it was given; the engine answers for the ones it does not serve
    (`render-service audit` compares the two /v1/models lists before traffic moves)."""
    _, generated, _ = _round_trip(servers, "missing-on-engine")
    assert generated.status_code == 404
    assert "missing-on-engine" in generated.json()["error"]["message"]
