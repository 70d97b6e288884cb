"""The HTTP surface: routes, errors in vLLM's shape, auth, limits, and no torch/vllm at run time."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

CHAT = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Hello!"}]}


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path):
    settings = Settings(
        model=str(qwen3_model_dir),
        served_model_name=["tinyqwen3", "alias"],
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        max_model_len=4096,
        max_request_body_bytes=1 << 20,
    ).validate()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def keyed_client(qwen3_model_dir: Path):
    settings = Settings(model=str(qwen3_model_dir), served_model_name=["tinyqwen3"], api_key="sekret").validate()
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_health_version_models(client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/version").json()["version"] == "0.33.0"
    cards = client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["tinyqwen3", "alias"]
    assert cards[0]["max_model_len"] == 4096
    assert cards[0]["owned_by"] == "vllm"


def test_chat_render_shape(client: TestClient) -> None:
    response = client.post("/v1/chat/completions/render", json=CHAT, headers={"X-Request-Id": "abc"})
    assert response.status_code == 200
    body = response.json()
    assert body["request_id"] == "chatcmpl-abc"
    assert list(body) == [
        "request_id",
        "token_ids",
        "token_offsets",
        "features",
        "content_parts",
        "sampling_params",
        "model",
        "reasoning_ended",
        "reasoning_parser_kwargs",
        "return_token_ids",
        "output_mode",
        "parse_context",
        "stream",
        "stream_options",
        "cache_salt",
        "priority",
        "kv_transfer_params",
        "ec_transfer_params",
    ]
    assert body["token_ids"][:2] == [151644, 872]  # <|im_start|>user
    assert body["sampling_params"]["max_tokens"] == 4096 - len(body["token_ids"])
    assert body["reasoning_ended"] is False


def test_alias_and_unknown_model(client: TestClient) -> None:
    assert client.post("/v1/chat/completions/render", json={**CHAT, "model": "alias"}).status_code == 200
    response = client.post("/v1/chat/completions/render", json={**CHAT, "model": "nope"})
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `nope` does not exist. Valid aliases: tinyqwen3, alias.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_enable_thinking_false_ends_reasoning(client: TestClient) -> None:
    body = {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    rendered = client.post("/v1/chat/completions/render", json=body).json()
    assert rendered["reasoning_ended"] is True
    assert 151668 in rendered["token_ids"][-3:]  # the template closed <think> in the prompt


@pytest.mark.parametrize(
    "prompt, count", [("Hello, world", 1), (["a", "b", "c"], 3), ([9707, 11], 1), ([[9707], [11, 1879]], 2)]
)
def test_completion_prompt_forms(client: TestClient, prompt: object, count: int) -> None:
    response = client.post("/v1/completions/render", json={"prompt": prompt}, headers={"X-Request-Id": "r"})
    assert response.status_code == 200
    body = response.json()
    assert len(body) == count
    assert body[0]["request_id"] == ("cmpl-r" if count == 1 else "cmpl-r-0")
    assert body[0]["parse_context"] is None


def test_prompt_too_long(client: TestClient) -> None:
    response = client.post("/v1/completions/render", json={"prompt": [1] * 5000})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == "input_tokens"
    assert "maximum context length is 4096 tokens" in error["message"]


def test_bad_inputs_are_4xx_in_vllm_shape(client: TestClient) -> None:
    cases = [
        (b"{not json", "application/json"),
        (b'{"messages": []}', "text/plain"),
        (b"[1, 2]", "application/json"),
        (b'{"messages": "hi"}', "application/json"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "application/json"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": []}', "application/json"),
        (b'{"messages": [{"content": "x"}]}', "application/json"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "application/json"),
    ]
    for raw, content_type in cases:
        response = client.post("/v1/chat/completions/render", content=raw, headers={"content-type": content_type})
        assert response.status_code == 400, (raw, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400


def test_body_limit(client: TestClient) -> None:
    big = b'{"prompt": "' + b"a" * (1 << 20) + b'"}'
    response = client.post("/v1/completions/render", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_auto_tool_choice_requires_flag(keyed_client: TestClient) -> None:
    body = {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    response = keyed_client.post("/v1/chat/completions/render", json=body, headers={"Authorization": "Bearer sekret"})
    assert response.status_code == 400
    assert "--enable-auto-tool-choice" in response.json()["error"]["message"]


def test_api_key(keyed_client: TestClient) -> None:
    assert keyed_client.post("/v1/chat/completions/render", json=CHAT).status_code == 401
    wrong = keyed_client.post("/v1/chat/completions/render", json=CHAT, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and wrong.json() == {"error": "Unauthorized"}
    ok = keyed_client.post("/v1/chat/completions/render", json=CHAT, headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200
    assert keyed_client.get("/health").status_code == 200
    assert keyed_client.get("/metrics").status_code == 200


def test_tokenize_detokenize(client: TestClient) -> None:
    tokens = client.post("/tokenize", json={"prompt": "Hello, world"}).json()
    assert tokens == {"count": 3, "max_model_len": 4096, "tokens": [9707, 11, 1879], "token_strs": None}
    assert client.post("/detokenize", json={"tokens": [9707, 11, 1879]}).json() == {"prompt": "Hello, world"}
    chat = client.post("/tokenize", json={"messages": CHAT["messages"]}).json()
    rendered = client.post("/v1/chat/completions/render", json=CHAT).json()
    assert chat["tokens"] == rendered["token_ids"]
    # Like vLLM, unknown ids are dropped rather than failing the request.
    assert client.post("/detokenize", json={"tokens": [9707, 10**9]}).json() == {"prompt": "Hello"}


def test_metrics_report_backend(client: TestClient) -> None:
    text = client.get("/metrics").text
    assert "render_tokenizer_backend_info" in text
    assert "render_requests_total" in text


def test_service_never_imports_torch_or_vllm(qwen3_model_dir: Path) -> None:
    script = f"""
import sys
from starlette.testclient import TestClient
from render_service.server.app import create_app
from render_service.settings import Settings
s = Settings(model={str(qwen3_model_dir)!r}, reasoning_parser="qwen3", tool_call_parser="hermes",
             enable_auto_tool_choice=True).validate()
with TestClient(create_app(s)) as c:
    assert c.post("/v1/chat/completions/render", json={{"messages": [{{"role": "user", "content": "hi"}}]}}).status_code == 200
    assert c.post("/v1/completions/render", json={{"prompt": "hi"}}).status_code == 200
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm"))
assert not bad, bad
print("clean")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "clean" in result.stdout


def test_error_logs_carry_the_callers_trace_and_request_ids(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="render_service.server.app")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = client.post(
        "/v1/chat/completions/render",
        json={"messages": "nope"},
        headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01", "X-Request-Id": "r-1"},
    )
    assert response.status_code == 400
    assert f"trace_id={trace_id} request_id=r-1" in caplog.text


def test_event_loop_metrics_separate_held_time_from_cpu_wait(qwen3_model_dir: Path) -> None:
    import time

    with TestClient(create_app(Settings(model=str(qwen3_model_dir)).validate())) as fresh:
        time.sleep(0.8)  # a few 250 ms samples
        text = fresh.get("/metrics").text
    counts = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(
            (
                "render_event_loop_lag_seconds_count",
                "render_event_loop_held_seconds_count",
                "render_event_loop_runqueue_wait_seconds_total",
            )
        )
    }
    assert counts["render_event_loop_lag_seconds_count"] >= 2
    assert counts["render_event_loop_held_seconds_count"] >= 2  # Linux: schedstat is readable
    assert counts["render_event_loop_runqueue_wait_seconds_total"] >= 0
    assert 'render_event_loop_lag_seconds_bucket{le="0.003"}' in text
