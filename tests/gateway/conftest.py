"""Two scripted engines and gateways in front of them (real HTTP on loopback, uvicorn threads)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from render_service.model.loader import Model, load_model
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.gateway.scripted_engine import Script, ScriptedEngine, scripted_engine, serve_in_thread

MODEL = "tinyqwen3"


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[ScriptedEngine, ScriptedEngine]]:
    with scripted_engine(Script([])) as first, scripted_engine(Script([])) as second:
        yield first, second


@pytest.fixture(autouse=True)
def fresh_engines(request: pytest.FixtureRequest) -> None:
    if "engines" in request.fixturenames:
        for engine in request.getfixturevalue("engines"):
            engine.scripts.clear()
            engine.records.clear()
            engine.healthy = True
            engine.default = Script([])


def gateway_settings(model_dir: Path, urls: list[str], **extra: Any) -> Settings:
    return Settings(
        model=str(model_dir),
        served_model_name=[MODEL],
        max_model_len=4096,
        engine=urls,
        engine_timeout=extra.pop("engine_timeout", 2.0),
        engine_health_interval=extra.pop("engine_health_interval", 60.0),
        **extra,
    ).validate()


@pytest.fixture(scope="session")
def loaded_model(qwen3_model_dir: Path) -> Model:
    """The tiny model, loaded once: every gateway app of the session shares it (as workers do)."""
    return load_model(gateway_settings(qwen3_model_dir, []))


@contextmanager
def gateway_app(model: Model, settings: Settings) -> Iterator[str]:
    """A render-service app over `settings` (sharing `model`), served on loopback; its base URL."""
    with serve_in_thread(create_app(settings, model)) as url:
        yield url


@pytest.fixture(scope="module")
def gateway(
    qwen3_model_dir: Path, loaded_model: Model, engines: tuple[ScriptedEngine, ScriptedEngine]
) -> Iterator[str]:
    """A plain gateway (no parsers) over both engines."""
    with gateway_app(loaded_model, gateway_settings(qwen3_model_dir, [engines[0].url, engines[1].url])) as url:
        yield url


@pytest.fixture(scope="module")
def parsing_gateway(
    qwen3_model_dir: Path, loaded_model: Model, engines: tuple[ScriptedEngine, ScriptedEngine]
) -> Iterator[str]:
    """A gateway with the qwen3 reasoning parser and the hermes tool parser, over the first engine."""
    settings = gateway_settings(
        qwen3_model_dir,
        [engines[0].url],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
    )
    with gateway_app(loaded_model, settings) as url:
        yield url


def tokens(base_url: str, text: str) -> list[int]:
    response = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False})
    assert response.status_code == 200, response.text
    ids: list[int] = response.json()["tokens"]
    return ids


def sse_events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` as the string."""
    events: list[Any] = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


# Bound and never listening: connecting is refused, and no other process can take the port
# meanwhile (a merely free port was once taken by a parallel run's server, which answered 404).
_REFUSING_SOCKETS: list[socket.socket] = []


def unused_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _REFUSING_SOCKETS.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"
