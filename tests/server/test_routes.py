"""The routes table and what every JSON route shares: vLLM's render-tier paths and methods,
FastAPI's 404/405 bodies, admission (503 while loading or overloaded), fingerprint headers and
the 500 for a bug."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from render_service.render import pipeline as render
from render_service.server.app import create_app
from render_service.server.routes import ROUTES
from render_service.settings import Settings

# `vllm launch render` (vLLM 0.33.0): the scale-out render and derender routes, the tokenizer
# routes and the instrumentator routes every vLLM app has (see reference/vllm-render-protocol.md 1.2-1.3).
VLLM_RENDER_TIER = {
    ("/v1/chat/completions/render", "POST"),
    ("/v1/completions/render", "POST"),
    ("/v1/messages/render", "POST"),
    ("/v1/responses/render", "POST"),
    ("/v1/chat/completions/derender", "POST"),
    ("/v1/completions/derender", "POST"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/health", "GET"),
    ("/ping", "GET"),
    ("/ping", "POST"),
    ("/version", "GET"),
    ("/load", "GET"),
    ("/kv_event_sources", "GET"),
    ("/metrics", "GET"),
    ("/v1/models", "GET"),
    ("/openapi.json", "GET"),  # FastAPI serves it
}
OURS = {("/v1/render/config", "GET")}  # the render fingerprint (not in vLLM)
JSON_POSTS = sorted(path for path, method in VLLM_RENDER_TIER if method == "POST" and path != "/ping")
CHAT = {"messages": [{"role": "user", "content": "Hello!"}]}
GENERATED = {"request_id": "r", "choices": [{"index": 0, "token_ids": [9707], "finish_reason": "stop"}]}


def served() -> set[tuple[str, str]]:
    # Starlette adds HEAD to every GET route by itself.
    return {(route.path, method) for route in ROUTES for method in route.methods or () if method != "HEAD"}


def minimal_body(path: str) -> dict[str, object]:
    """A body each JSON route accepts (200) from a text model."""
    if path == "/v1/completions/render":
        return {"prompt": "Hello"}
    if path == "/v1/messages/render":
        return {"model": "tinyqwen3", "max_tokens": 8, **CHAT}
    if path == "/v1/responses/render":
        return {"input": "Hello"}
    if path == "/tokenize":
        return {"prompt": "Hello"}
    if path == "/detokenize":
        return {"tokens": [9707]}
    if path == "/v1/chat/completions/derender":
        return {"chat_request": CHAT, "generate_response": GENERATED}
    if path == "/v1/completions/derender":
        return {"generate_responses": [GENERATED]}
    return dict(CHAT)


def make_settings(model_dir: Path, **overrides: object) -> Settings:
    return Settings(model=str(model_dir), served_model_name=["tinyqwen3"], max_model_len=4096, **overrides).validate()


@pytest.fixture(scope="module")
def settings(qwen3_model_dir: Path) -> Settings:
    return make_settings(qwen3_model_dir)


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_routes_table_is_vllms_render_tier_plus_the_config_route() -> None:
    assert served() == VLLM_RENDER_TIER | OURS
    paths = [route.path for route in ROUTES]
    assert len(paths) == len(set(paths))  # one route per path: its methods are in one place


def test_every_route_answers_its_methods_and_405s_the_others(client: TestClient) -> None:
    for path, method in sorted(served()):
        body = minimal_body(path) if (path, method) != ("/ping", "POST") else None
        response = client.request(method, path, json=body)
        assert response.status_code == 200, (method, path, response.text)
    for path in JSON_POSTS:
        response = client.get(path)
        assert response.status_code == 405, path
        assert response.json() == {"detail": "Method Not Allowed"}
    assert client.post("/health").status_code == 405
    assert client.head("/health").status_code == 200


def test_kv_event_sources_is_empty_without_an_engine(client: TestClient) -> None:
    # vLLM's render tier has no engine client, so its publisher config per DP rank is {}.
    response = client.get("/kv_event_sources")
    assert response.status_code == 200 and response.json() == {}


def test_paths_outside_the_table_are_fastapis_404(client: TestClient) -> None:
    # A render server has no engine: /inference/v1/generate is a 404 in vLLM too.
    for path in ("/inference/v1/generate", "/v1/chat/completions", "/render", "/v1/render/config/x"):
        response = client.post(path, json=CHAT)
        assert response.status_code == 404, path
        assert response.json() == {"detail": "Not Found"}


def test_fingerprint_headers(client: TestClient) -> None:
    fingerprint = client.get("/v1/render/config").json()["fingerprint"]
    for path in JSON_POSTS:
        response = client.post(path, json=minimal_body(path))
        assert response.headers["x-render-fingerprint"] == fingerprint, path
        # The components (to explain a mismatch) go with renders only.
        assert ("x-render-fingerprint-components" in response.headers) == path.endswith("/render"), path
    refused = client.post("/v1/chat/completions/render", json={"messages": "nope"})
    assert refused.status_code == 400 and "x-render-fingerprint" not in refused.headers


def test_json_routes_are_503_until_the_model_is_loaded(settings: Settings) -> None:
    client = TestClient(create_app(settings))  # not entered: the lifespan (start-up) has not run
    for path in JSON_POSTS:
        response = client.post(path, json=minimal_body(path))
        assert response.status_code == 503, path
        assert response.headers["retry-after"] == "5"
        assert response.json() == {
            "error": {
                "message": "The model is still loading.",
                "type": "ServiceUnavailableError",
                "param": None,
                "code": 503,
            }
        }
    assert client.get("/health").status_code == 503
    assert client.post("/ping").status_code == 503
    assert 'render_requests_total{endpoint="chat_render",status="503"} 1.0' in client.get("/metrics").text


def test_overload_is_a_503_with_retry_after_and_counted(qwen3_model_dir: Path) -> None:
    with TestClient(create_app(make_settings(qwen3_model_dir, max_inflight=1))) as client:
        state = client.app.state.render
        state.inflight = 1  # one request already in flight on this worker
        try:
            response = client.post("/v1/chat/completions/render", json=CHAT)
        finally:
            state.inflight = 0
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["message"].startswith("Server busy: 1 requests in flight on this worker")
        assert client.post("/v1/chat/completions/render", json=CHAT).status_code == 200
        assert client.get("/health").status_code == 200  # never refused for load
        metrics = client.get("/metrics").text
        assert "render_overload_rejections_total 1.0" in metrics
        assert "render_inflight_requests 0.0" in metrics


def test_a_bug_is_a_logged_500_in_vllms_shape(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(render, "render_completion", broken)
    caplog.set_level(logging.ERROR, logger="render_service.server.app")
    response = client.post("/v1/completions/render", json={"prompt": "x"}, headers={"X-Request-Id": "r-500"})
    assert response.status_code == 500
    assert response.json() == {
        "error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
    }
    assert "unhandled error on completion_render (trace_id=- request_id=r-500)" in caplog.text
    assert "KeyError: 'bug'" in caplog.text
    assert 'render_requests_total{endpoint="completion_render",status="500"} 1.0' in client.get("/metrics").text
