"""LoRA adapter names over HTTP: render and derender accept them and pass them to the engine as the
GenerateRequest's `model`; /v1/models lists them; the runtime endpoints exist only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING; the fingerprint's `lora_adapters` component follows the set
(across the worker processes of a real server too), and the overall fingerprint does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from render_service.model.loader import Model, load_model
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.helpers import service
from tests.parity.lora_corpus import write_adapter

CHAT = {"messages": [{"role": "user", "content": "Write SQL for the top 3 users."}]}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_adapter(tmp_path_factory.mktemp("lora") / "sql-adapter")


@pytest.fixture(scope="module")
def model(qwen3_model_dir: Path) -> Model:
    return load_model(Settings(model=str(qwen3_model_dir), max_model_len=4096).validate())


def _client(qwen3_model_dir: Path, model: Model, adapter: Path, *, runtime: bool) -> TestClient:
    settings = Settings(
        model=str(qwen3_model_dir),
        served_model_name=["tinyqwen3"],
        max_model_len=4096,
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        lora_modules=[f"sql={adapter}"],
        allow_runtime_lora_updating=runtime,
    ).validate()
    return TestClient(create_app(settings, model))


@pytest.fixture()
def runtime(qwen3_model_dir: Path, model: Model, adapter: Path) -> Iterator[TestClient]:
    with _client(qwen3_model_dir, model, adapter, runtime=True) as client:
        yield client


@pytest.fixture(scope="module")
def static(qwen3_model_dir: Path, model: Model, adapter: Path) -> Iterator[TestClient]:
    with _client(qwen3_model_dir, model, adapter, runtime=False) as client:
        yield client


def test_render_passes_the_adapter_name_as_the_engine_expects(static: TestClient) -> None:
    base = static.post(
        "/v1/chat/completions/render", json={**CHAT, "model": "tinyqwen3"}, headers={"X-Request-Id": "r"}
    )
    lora = static.post("/v1/chat/completions/render", json={**CHAT, "model": "sql"}, headers={"X-Request-Id": "r"})
    assert lora.status_code == 200
    # vLLM's engine picks the adapter by the GenerateRequest's `model` (`request.model in lora_requests`);
    # everything else is the base model's render.
    assert lora.json()["model"] == "sql"
    assert {**lora.json(), "model": "tinyqwen3"} == base.json()
    completions = static.post("/v1/completions/render", json={"model": "sql", "prompt": ["a", "b"]}).json()
    assert [r["model"] for r in completions] == ["sql", "sql"]
    messages = static.post(
        "/v1/messages/render", json={"model": "sql", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert messages.status_code == 200 and messages.json()["model"] == "sql"
    responses = static.post("/v1/responses/render", json={"model": "sql", "input": "hi"})
    assert responses.status_code == 200 and responses.json()["model"] == "sql"
    assert static.post("/tokenize", json={"model": "sql", "prompt": "hi"}).status_code == 200


def test_derender_accepts_the_adapter_name(static: TestClient) -> None:
    rendered = static.post("/v1/chat/completions/render", json={**CHAT, "model": "sql"}).json()
    body = {
        "model": "sql",
        "generate_response": {
            "request_id": "generate-tokens-" + rendered["request_id"],
            "model": "sql",
            "choices": [
                {"index": 0, "finish_reason": "stop", "token_ids": [151667, 198, 151668, 271, 9707, 0, 151645]}
            ],
        },
        "prompt_tokens": len(rendered["token_ids"]),
        "chat_request": {**CHAT, "model": "sql"},
    }
    response = static.post("/v1/chat/completions/derender", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "sql"
    assert response.json()["choices"][0]["message"]["content"].strip() == "Hello!"
    base = static.post(
        "/v1/chat/completions/derender",
        json={**body, "model": "tinyqwen3", "chat_request": {**CHAT, "model": "tinyqwen3"}},
    ).json()
    assert {**response.json(), "model": "tinyqwen3", "created": base["created"]} == base
    unknown = static.post("/v1/chat/completions/derender", json={**body, "model": "nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "The model `nope` does not exist. Valid aliases: tinyqwen3."


def test_models_lists_adapters_with_their_parent(static: TestClient, adapter: Path) -> None:
    cards = static.get("/v1/models").json()["data"]
    assert [(c["id"], c["root"], c["parent"], c["max_model_len"]) for c in cards] == [
        ("tinyqwen3", cards[0]["root"], None, 4096),
        ("sql", str(adapter), "tinyqwen3", None),
    ]


def test_runtime_routes_need_the_variable(static: TestClient) -> None:
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        response = static.post(path, json={"lora_name": "x", "lora_path": "p"})
        assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})


def test_load_render_unload(runtime: TestClient, adapter: Path) -> None:
    assert runtime.post("/v1/chat/completions/render", json={**CHAT, "model": "new"}).status_code == 404
    loaded = runtime.post("/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": str(adapter)})
    assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'new' added successfully.")
    assert "content-type" not in loaded.headers  # vLLM answers a bare Response
    assert runtime.post("/v1/chat/completions/render", json={**CHAT, "model": "new"}).json()["model"] == "new"
    assert [c["id"] for c in runtime.get("/v1/models").json()["data"]] == ["tinyqwen3", "sql", "new"]
    unloaded = runtime.post("/v1/unload_lora_adapter", json={"lora_name": "new"})
    assert (unloaded.status_code, unloaded.text) == (200, "Success: LoRA adapter 'new' removed successfully.")
    assert runtime.post("/v1/chat/completions/render", json={**CHAT, "model": "new"}).status_code == 404
    again = runtime.post("/v1/unload_lora_adapter", json={"lora_name": "new"})
    assert again.status_code == 404 and again.json()["error"]["type"] == "NotFoundError"


def test_runtime_errors(runtime: TestClient, tmp_path: Path) -> None:
    duplicate = runtime.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "p"})
    assert duplicate.status_code == 400 and duplicate.json()["error"]["type"] == "InvalidUserInput"
    missing = runtime.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "none")})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == f"Loading lora x failed: No adapter found for {tmp_path / 'none'}"
    schema = runtime.post("/v1/load_lora_adapter", json={"lora_path": "p", "load_inplace": "sometimes"})
    assert schema.status_code == 400 and schema.json()["error"]["message"].startswith("2 validation errors:")
    plain = runtime.post("/v1/load_lora_adapter", content=b"{}", headers={"Content-Type": "text/plain"})
    assert plain.status_code == 400 and "Only 'application/json' is allowed" in plain.json()["error"]["message"]


def test_fingerprint_follows_the_adapter_set(runtime: TestClient, adapter: Path) -> None:
    before = runtime.get("/v1/render/config").json()
    assert before["values"]["lora_adapters"] == {"sql": {"path": str(adapter), "parent": "tinyqwen3"}}
    render = runtime.post("/v1/chat/completions/render", json={**CHAT, "model": "sql"})
    assert f"lora_adapters={before['components']['lora_adapters']}" in render.headers["x-render-fingerprint-components"]

    runtime.post("/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": str(adapter)})
    after = runtime.get("/v1/render/config").json()
    assert after["values"]["lora_adapters"]["new"] == {"path": str(adapter), "parent": "tinyqwen3"}
    assert after["components"]["lora_adapters"] != before["components"]["lora_adapters"]
    # Only that component: an adapter changes no token, so streams and snapshots stay valid.
    assert {k: v for k, v in after["components"].items() if k != "lora_adapters"} == {
        k: v for k, v in before["components"].items() if k != "lora_adapters"
    }
    assert after["fingerprint"] == before["fingerprint"]
    render = runtime.post("/v1/chat/completions/render", json={**CHAT, "model": "sql"})
    assert render.headers["x-render-fingerprint"] == before["fingerprint"]
    assert f"lora_adapters={after['components']['lora_adapters']}" in render.headers["x-render-fingerprint-components"]

    runtime.post("/v1/unload_lora_adapter", json={"lora_name": "new"})
    runtime.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    cleared = runtime.get("/v1/render/config").json()
    assert "lora_adapters" not in cleared["components"]  # as without adapters at all
    assert cleared["fingerprint"] == before["fingerprint"]


def test_a_stream_continues_across_a_load(runtime: TestClient, adapter: Path) -> None:
    """A stream started before a load derenders on after it (no 409 for its old stream_state)."""
    rendered = runtime.post("/v1/chat/completions/render", json={**CHAT, "model": "sql", "stream": True}).json()
    body = {
        "model": "sql",
        "stream": True,
        "generate_chunk": {"request_id": "s", "choices": [{"index": 0, "token_ids": [151667, 198]}]},
        "prompt_token_ids": rendered["token_ids"],
        "chat_request": {**CHAT, "model": "sql", "stream": True},
    }
    first = runtime.post("/v1/chat/completions/derender", json=body)
    rendered_fingerprint = first.headers["x-render-fingerprint"]
    assert first.status_code == 200, first.text
    state = first.json()["stream_state"]
    runtime.post("/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": str(adapter)})
    body["generate_chunk"] = {
        "request_id": "s",
        "choices": [{"index": 0, "token_ids": [151668, 271, 9707, 151645], "finish_reason": "stop"}],
    }
    second = runtime.post(
        "/v1/chat/completions/derender",
        json={**body, "stream_state": state},
        headers={"X-Render-Fingerprint": rendered_fingerprint},
    )
    assert second.status_code == 200, second.text
    assert second.json()["stream_state"]["rs_fp"] == state["rs_fp"]  # the same snapshot namespace


def test_every_worker_sees_a_runtime_load(qwen3_model_dir: Path, adapter: Path) -> None:
    """A real server with two workers: the load lands on one, and fresh connections (spread over both
    by the kernel) all find the adapter; after the unload none does."""
    with service(
        qwen3_model_dir,
        "--workers",
        "2",
        "--served-model-name",
        "tinyqwen3",
        "--lora-modules",
        f"sql={adapter}",
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
    ) as url:
        fresh = {"Connection": "close"}
        loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": str(adapter)})
        assert loaded.status_code == 200, loaded.text
        statuses = {
            httpx.post(f"{url}/v1/chat/completions/render", json={**CHAT, "model": "new"}, headers=fresh).status_code
            for _ in range(16)
        }
        assert statuses == {200}
        components = {
            httpx.get(f"{url}/v1/render/config", headers=fresh).json()["components"]["lora_adapters"] for _ in range(8)
        }
        assert len(components) == 1
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "new"}).status_code == 200
        statuses = {
            httpx.post(f"{url}/v1/chat/completions/render", json={**CHAT, "model": "new"}, headers=fresh).status_code
            for _ in range(16)
        }
        assert statuses == {404}
