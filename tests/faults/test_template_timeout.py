"""A runaway chat template is stopped at the render time limit (vLLM's VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT)
with a 504, and the worker serves the next request at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from render_service.exceptions import TemplateTimeoutError
from render_service.render import templating
from render_service.server.app import create_app
from render_service.settings import Settings

M = [{"role": "user", "content": "hi"}]
RUNAWAY = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "namespace counter": "{% set ns = namespace(x=0) %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% set ns.x = ns.x + 1 %}{% endfor %}{% endfor %}{{ ns.x }}",
    "loop per message": "{% for m in messages %}{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}"
    "{% endfor %}{% endfor %}{% endfor %}",
}


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path):
    settings = Settings(
        model=str(qwen3_model_dir), served_model_name=["m"], trust_request_chat_template=True
    ).validate()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def short_limit(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(templating.WATCHDOG, "timeout", 0.5)
    return 0.5


@pytest.mark.parametrize("name", list(RUNAWAY))
def test_runaway_template_is_a_504_and_the_worker_recovers(client: TestClient, short_limit: float, name: str) -> None:
    start = time.perf_counter()
    response = client.post("/v1/chat/completions/render", json={"messages": M, "chat_template": RUNAWAY[name]})
    elapsed = time.perf_counter() - start
    assert response.status_code == 504, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == "GatewayTimeoutError" and error["code"] == 504
    assert "VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT" in error["message"]
    assert elapsed < short_limit + 5
    # The render was stopped (not abandoned): the next request is served at once, on the same thread.
    start = time.perf_counter()
    assert client.post("/v1/chat/completions/render", json={"messages": M}).status_code == 200
    assert time.perf_counter() - start < 2


def test_a_template_error_stays_a_400(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions/render", json={"messages": M, "chat_template": "{{ raise_exception('no') }}"}
    )
    assert response.status_code == 400 and "no" in response.json()["error"]["message"]


def test_a_swallowed_deadline_fires_again() -> None:
    watchdog = templating.RenderWatchdog(0.2)
    swallowed = []

    def stubborn() -> None:
        while True:
            try:
                while True:
                    pass
            except BaseException as exc:  # a template's code that catches everything, once
                if swallowed:
                    raise
                swallowed.append(exc)

    with pytest.raises(TemplateTimeoutError):
        watchdog.run(stubborn)
    assert len(swallowed) == 1


def test_a_render_that_finishes_is_never_interrupted_later() -> None:
    """Renders ending around the deadline: no deadline escapes after `run` returns."""
    watchdog = templating.RenderWatchdog(0.05)
    outcomes = {"ok": 0, "timeout": 0}

    def busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    for index in range(40):
        try:
            watchdog.run(busy, 0.03 + (index % 8) * 0.01)
            outcomes["ok"] += 1
        except TemplateTimeoutError:
            outcomes["timeout"] += 1
        busy(0.02)  # a late deadline would surface here, outside `run`
    assert outcomes["ok"] and outcomes["timeout"]
    assert not watchdog._active


def test_renders_in_other_threads_are_guarded_separately() -> None:
    watchdog = templating.RenderWatchdog(0.3)
    results: dict[str, str] = {}

    def spin() -> None:
        while True:
            pass

    def worker(name: str, fn) -> None:
        try:
            watchdog.run(fn)
            results[name] = "ok"
        except TemplateTimeoutError:
            results[name] = "timeout"

    threads = [
        threading.Thread(target=worker, args=("runaway", spin)),
        threading.Thread(target=worker, args=("quick", lambda: time.sleep(0.05))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {"runaway": "timeout", "quick": "ok"}
