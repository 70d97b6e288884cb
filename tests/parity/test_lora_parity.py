"""LoRA adapter names against vLLM 0.33's render tier (goldens in golden_lora/, see lora_corpus.py).

`same`: vLLM's answer. `as_base:<case>`: vLLM's answer to the base model's request, with the
adapter's name as `model` (vLLM's render tier refuses adapter names; accepting them is our
deliberate difference). `ours:<status>`: the runtime endpoints work here (they fail with a 500 on
vLLM's render tier); the checks are vLLM's API server's (`OpenAIServingModels`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.model.loader import Model, load_model
from render_service.server.app import create_app
from render_service.settings import Settings

from .corpus import compare_response, send
from .lora_corpus import ADAPTER_DIR_PLACEHOLDER, CASES, CONFIGS, GOLDEN_LORA_DIR, MAX_MODEL_LEN, SERVED, write_adapter

GOLDENS = {path.stem: json.loads(path.read_text("utf-8")) for path in sorted(GOLDEN_LORA_DIR.glob("*.json"))}


def test_every_case_has_a_golden() -> None:
    assert sorted(GOLDENS) == sorted(case.name for case in CASES)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_adapter(tmp_path_factory.mktemp("lora") / "sql-adapter")


@pytest.fixture(scope="module")
def model(qwen3_model_dir: Path) -> Model:
    return load_model(Settings(model=str(qwen3_model_dir), max_model_len=MAX_MODEL_LEN).validate())


def _settings(qwen3_model_dir: Path, adapter_dir: Path, config: str) -> Settings:
    lora = CONFIGS[config]
    flags = lora.vllm_flags(str(adapter_dir))
    return Settings(
        model=str(qwen3_model_dir),
        served_model_name=[SERVED],
        max_model_len=MAX_MODEL_LEN,
        lora_modules=flags[flags.index("--lora-modules") + 1 :],
        allow_runtime_lora_updating=lora.runtime_updating,
    ).validate()


@pytest.fixture(scope="module")
def clients(qwen3_model_dir: Path, adapter_dir: Path, model: Model) -> Iterator[dict[str, TestClient]]:
    """One app per config; the runtime config's cases run in corpus order on one app (their loads
    and unloads change its adapter set as they changed the oracle's)."""
    apps = {name: TestClient(create_app(_settings(qwen3_model_dir, adapter_dir, name), model)) for name in CONFIGS}
    for client in apps.values():
        client.__enter__()
    yield apps
    for client in apps.values():
        client.__exit__(None, None, None)


def _replay(golden: dict[str, Any], adapter_dir: Path) -> dict[str, Any]:
    text = json.dumps(golden["request"]).replace(json.dumps(golden["adapter_dir"])[1:-1], str(adapter_dir))
    return json.loads(text)


def _placeholders(value: Any, adapter_dirs: tuple[str, ...]) -> Any:
    text = json.dumps(value)
    for directory in adapter_dirs:
        text = text.replace(json.dumps(directory)[1:-1], ADAPTER_DIR_PLACEHOLDER)
    return json.loads(text)


def _with_model(value: Any, model: str) -> Any:
    """vLLM's answer for the base model as it reads for an adapter: every `model` is the adapter's."""
    if isinstance(value, dict):
        return {k: (model if k == "model" and v == SERVED else _with_model(v, model)) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_model(v, model) for v in value]
    return value


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_lora_case(case: str, clients: dict[str, TestClient], qwen3_model_dir: Path, adapter_dir: Path) -> None:
    golden = GOLDENS[case]
    request = _replay(golden, adapter_dir)
    status, body = send(clients[golden["config"]], request)
    dirs = (golden["adapter_dir"], str(adapter_dir))
    expect: str = golden["expect"]
    if expect == "same":
        diffs = compare_response(
            golden["request"],
            golden["status"],
            golden["response"],
            status,
            body,
            expected_model_dir=golden["model_dir"],
            actual_model_dir=str(qwen3_model_dir),
        )
        assert not diffs, "\n".join(diffs)
    elif expect.startswith("as_base:"):
        # vLLM's render tier refuses the adapter name (documented difference) ...
        assert golden["status"] == 404 and golden["response"]["error"]["message"].startswith("The model `")
        base = GOLDENS[expect.split(":", 1)[1]]
        adapter_name = request["json"]["model"]
        # ... and we answer exactly what it answers for the base model, named as the adapter.
        diffs = compare_response(
            golden["request"],
            base["status"],
            _with_model(base["response"], adapter_name),
            status,
            body,
            expected_model_dir=base["model_dir"],
            actual_model_dir=str(qwen3_model_dir),
        )
        assert not diffs, "\n".join(diffs)
    elif expect == "ours:models":
        assert golden["status"] == 200 and [c["id"] for c in golden["response"]["data"]] == [SERVED]
        cards = body["data"]
        # The base card is vLLM's; then one card per adapter, as vLLM's API server lists them.
        diffs = compare_response(
            golden["request"],
            200,
            {"object": "list", "data": golden["response"]["data"]},
            status,
            {"object": "list", "data": cards[:1]},
            expected_model_dir=golden["model_dir"],
            actual_model_dir=str(qwen3_model_dir),
        )
        assert not diffs, "\n".join(diffs)
        lora_cards = _placeholders(cards[1:], dirs)
        assert [(c["id"], c["root"], c["parent"], c["max_model_len"]) for c in lora_cards] == [
            ("sql", ADAPTER_DIR_PLACEHOLDER, SERVED, None),
            ("chat", ADAPTER_DIR_PLACEHOLDER, SERVED, None),
        ]
        assert all(list(c) == list(cards[0]) and c["permission"][0]["object"] == "model_permission" for c in cards)
    else:
        wanted = int(expect.split(":", 1)[1])
        assert golden["status"] == 500  # vLLM's render tier: "no LoRA support"
        assert status == wanted, body
        _check_ours(case, body, request)


def _check_ours(case: str, body: Any, request: dict[str, Any]) -> None:
    """vLLM's API server's answers (`OpenAIServingModels`), which its render tier cannot give."""
    name = (request.get("json") or {}).get("lora_name")
    expected = {
        "load_ok": "Success: LoRA adapter 'new' added successfully.",
        "unload_ok": "Success: LoRA adapter 'sql' removed successfully.",
        "load_duplicate": "The lora adapter 'sql' has already been loaded. If you want to load the adapter in "
        "place, set 'load_inplace' to True.",
        "load_base_name": f"The lora adapter '{SERVED}' conflicts with a served base model.",
        "load_empty_name": "Both 'lora_name' and 'lora_path' must be provided.",
        "load_no_adapter": f"Loading lora {name} failed: No adapter found for /nonexistent/a",
        "unload_unknown": "The lora adapter 'nope' cannot be found.",
        "unload_empty_name": "'lora_name' needs to be provided to unload a LoRA adapter.",
        "chat_unknown_runtime": f"The model `nope` does not exist. Valid aliases: {SERVED}.",
    }
    if case == "chat_adapter_runtime":
        assert body["model"] == "sql" and body["token_ids"]
        return
    if isinstance(body, str):
        assert body == expected[case]
        return
    assert body["error"]["message"] == expected[case]
    error_type = {400: "InvalidUserInput", 404: "NotFoundError"}[body["error"]["code"]]
    if case == "chat_unknown_runtime":
        assert body["error"]["param"] == "model"
    else:
        assert body["error"]["type"] == error_type and body["error"]["param"] is None
