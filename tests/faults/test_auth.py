"""`--api-key` guards exactly vLLM's prefixes (/v1, /v2, /inference, /cohere) with a constant-time
compare; /health, /metrics and the other probes stay open; no secret ever reaches a log, a metric or
a response (checked on a real process logging at debug level, with Redis failing under it)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.faults.servers import service_process
from tests.helpers import chunk_body, redis_server

API_KEY = "api-key-7f3a9c1e"
SNAPSHOT_KEY = "snapshot-key-51b0d2aa"
REDIS_PASSWORD = "redis-pass-c04e88f1"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
GUARDED = [
    ("POST", "/v1/chat/completions/render"),
    ("POST", "/v1/completions/render"),
    ("POST", "/v1/chat/completions/derender"),
    ("POST", "/v1/completions/derender"),
    ("GET", "/v1/models"),
    ("GET", "/v1/render/config"),
    # Guarded by prefix before routing, as vLLM's middleware does: unknown paths too.
    ("POST", "/v1/messages/render"),
    ("POST", "/v1/responses/render"),
    ("POST", "/inference/v1/generate"),
    ("GET", "/v2/anything"),
    ("POST", "/cohere/v2/chat"),
]
OPEN = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/ping"),
    ("GET", "/version"),
    ("GET", "/load"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
]


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path):
    settings = Settings(model=str(qwen3_model_dir), served_model_name=["m"], api_key=API_KEY).validate()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.mark.parametrize(("method", "path"), GUARDED)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Basic {API_KEY}", f"Bearer {API_KEY}x", f"Bearer {API_KEY[:-1]}", "Bearer", API_KEY],
)
def test_guarded_prefixes_refuse_without_the_key(
    client: TestClient, method: str, path: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = client.request(method, path, json=CHAT if method == "POST" else None, headers=headers)
    assert response.status_code == 401
    assert response.json() == {"error": "Unauthorized"}


@pytest.mark.parametrize(("method", "path"), GUARDED[:6])
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_key_opens_them(client: TestClient, method: str, path: str, scheme: str) -> None:
    response = client.request(
        method, path, json=CHAT if method == "POST" else None, headers={"Authorization": f"{scheme} {API_KEY}"}
    )
    assert response.status_code != 401


@pytest.mark.parametrize(("method", "path"), OPEN)
def test_probes_and_tokenize_stay_open_as_in_vllm(client: TestClient, method: str, path: str) -> None:
    body = {"prompt": "hi"} if path == "/tokenize" else {"tokens": [1]} if path == "/detokenize" else None
    assert client.request(method, path, json=body).status_code == 200


def test_options_is_not_guarded(client: TestClient) -> None:
    assert client.options("/v1/chat/completions/render").status_code != 401


def test_secrets_never_reach_logs_metrics_or_responses(qwen3_model_dir: Path, tmp_path: Path) -> None:
    secrets = (API_KEY, SNAPSHOT_KEY, REDIS_PASSWORD)
    with redis_server() as redis:
        redis.client().config_set("requirepass", REDIS_PASSWORD)
        redis_url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis.port}/0"
        log = tmp_path / "service.log"
        with (
            service_process(
                qwen3_model_dir,
                log,
                "--served-model-name",
                "m",
                "--reasoning-parser",
                "qwen3",
                "--redis-url",
                redis_url,
                "--log-level",
                "debug",
                "--workers",
                "1",
                env={"VLLM_API_KEY": API_KEY, "RENDER_SNAPSHOT_KEY": SNAPSHOT_KEY},
                timeout=120,
            ) as service,
            httpx.Client(base_url=service.url, timeout=30) as http,
        ):
            good = {"Authorization": f"Bearer {API_KEY}"}
            seen = []
            for headers in ({}, {"Authorization": "Bearer " + API_KEY[::-1]}, good):
                seen.append(http.post("/v1/chat/completions/render", json=CHAT, headers=headers))
            rendered = seen[-1].json()
            state = None
            for index in range(6):
                if index == 3:
                    redis.kill()  # Redis errors are logged: with the URL's password?
                body = chunk_body(
                    {"model": "m", "chat_request": CHAT, "prompt_token_ids": rendered["token_ids"]},
                    [9707 + index],
                    None,
                    state,
                )
                response = http.post("/v1/chat/completions/derender", json=body, headers=good)
                assert response.status_code == 200, response.text
                state = response.json()["stream_state"]
                seen.append(response)
            seen += [
                http.get("/metrics"),
                http.get("/v1/render/config", headers=good),
                http.get("/v1/models", headers=good),
                http.get("/version"),
            ]
            time.sleep(0.5)
        text = log.read_text(errors="replace")
    assert "using replay" in text  # the log did record the Redis failure
    for secret in secrets:
        assert secret not in text, f"secret in the log: {secret}"
        for response in seen:
            assert secret not in response.text and secret not in str(response.headers)
