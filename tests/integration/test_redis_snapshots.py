"""Two real service processes sharing a real redis-server: streams move between replicas in
O(delta), and Redis faults (killed mid-stream, tampered values) never break a stream."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import chunk_body, drive_stream, metric, redis_server, service

TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
    }
]
CHAT_REQUEST = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "Find it."}], "tools": TOOLS}
OUTPUT_TEXT = (
    "<think>\nSearch first, then answer with ümlauts and 中文.\n</think>\n\nSearching.\n<tool_call>\n"
    '{"name": "lookup", "arguments": {"q": "render tier"}}\n</tool_call><|im_end|>'
)
FLAGS = (
    "--served-model-name",
    "tinyqwen3",
    "--reasoning-parser",
    "qwen3",
    "--tool-call-parser",
    "hermes",
    "--enable-auto-tool-choice",
    "--max-model-len",
    "8192",
    "--snapshot-key",
    "integration-secret",
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def case(qwen3_model_dir: Path) -> dict[str, Any]:
    with service(qwen3_model_dir, *FLAGS) as url:
        rendered = httpx.post(f"{url}/v1/chat/completions/render", json=CHAT_REQUEST).json()
        output = httpx.post(f"{url}/tokenize", json={"prompt": OUTPUT_TEXT}).json()["tokens"]
        batch = httpx.post(
            f"{url}/v1/chat/completions/derender",
            json={
                "chat_request": CHAT_REQUEST,
                "prompt_token_ids": rendered["token_ids"],
                "generate_response": {
                    "request_id": "generate-tokens-chatcmpl-test",
                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": output}],
                },
            },
        ).json()
    base = {"model": "tinyqwen3", "chat_request": CHAT_REQUEST, "prompt_token_ids": rendered["token_ids"]}
    return {"base": base, "output": output, "expected": batch["choices"][0]["message"]}


def _assert_matches_batch(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got["reasoning"] == expected["reasoning"]
    assert got["content"] == expected["content"]
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in expected["tool_calls"]
    ]
    assert got["finish_reason"] == "tool_calls"


def test_stream_alternating_between_two_replicas(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    with (
        redis_server() as redis,
        service(qwen3_model_dir, *FLAGS, "--redis-url", redis.url) as a,
        service(qwen3_model_dir, *FLAGS, "--redis-url", redis.url) as b,
        httpx.Client(timeout=10) as http,
    ):
        urls = [a, b]

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            response = http.post(f"{urls[index % 2]}/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        got = drive_stream(post, case["base"], case["output"], [1] * len(case["output"]))
        _assert_matches_batch(got, case["expected"])
        metrics = [http.get(f"{url}/metrics").text for url in urls]
        redis_hits = sum(metric(m, "render_snapshot_hits_total", tier="redis") for m in metrics)
        replays = sum(metric(m, "render_stream_replays_total") for m in metrics)
        # Every chunk after the first found its snapshot in Redis (written by the other replica).
        assert replays == 0
        assert redis_hits >= len(case["output"]) - 2
        assert redis.client().dbsize() <= 4  # superseded snapshots are deleted as the stream moves on


def test_redis_killed_mid_stream_falls_back_to_replay(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    with (
        redis_server() as redis,
        service(qwen3_model_dir, *FLAGS, "--redis-url", redis.url) as a,
        service(qwen3_model_dir, *FLAGS, "--redis-url", redis.url) as b,
        httpx.Client(timeout=10) as http,
    ):
        urls = [a, b]
        half = len(case["output"]) // 2

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            if index == half:
                redis.kill()
            response = http.post(f"{urls[index % 2]}/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        got = drive_stream(post, case["base"], case["output"], [1] * len(case["output"]))
        _assert_matches_batch(got, case["expected"])
        metrics = [http.get(f"{url}/metrics").text for url in urls]
        assert sum(metric(m, "render_stream_replays_total") for m in metrics) >= 1
        assert (
            sum(
                metric(m, "render_redis_errors_total", op="get") + metric(m, "render_redis_errors_total", op="set")
                for m in metrics
            )
            >= 1
        )


def test_tampered_redis_snapshot_is_rejected(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    with (
        redis_server() as redis,
        service(qwen3_model_dir, *FLAGS, "--redis-url", redis.url) as a,
        service(qwen3_model_dir, *FLAGS, "--redis-url", redis.url) as b,
        httpx.Client(timeout=10) as http,
    ):
        state = None
        output = case["output"]
        for index in range(5):
            body = chunk_body(case["base"], [output[index]], None, state)
            state = http.post(f"{a}/v1/chat/completions/derender", json=body).json()["stream_state"]
        client = redis.client()
        deadline = time.monotonic() + 5  # writes are asynchronous: wait for the latest one
        while not client.keys(f"rs:snap:*:{{{state['rs_sid']}}}:{state['rs_pos']}") and time.monotonic() < deadline:
            time.sleep(0.01)
        for key in client.keys("rs:snap:*"):
            value = bytearray(client.get(key))
            value[40] ^= 0xFF  # flip a payload byte: the HMAC no longer matches
            client.set(key, bytes(value))
        body = chunk_body(case["base"], [output[5]], None, state)
        response = http.post(f"{b}/v1/chat/completions/derender", json=body)
        assert response.status_code == 200
        text = http.get(f"{b}/metrics").text
        assert metric(text, "render_snapshot_rejected_total", reason="bad_signature") == 1.0
        assert metric(text, "render_stream_replays_total") == 1.0


def test_redis_unreachable_at_start_serves_by_replay(qwen3_model_dir: Path, case: dict[str, Any]) -> None:
    from tests.helpers import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    with (
        service(qwen3_model_dir, *FLAGS, "--redis-url", dead) as a,
        service(qwen3_model_dir, *FLAGS, "--redis-url", dead) as b,
        httpx.Client(timeout=10) as http,
    ):
        urls = [a, b]

        def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
            response = http.post(f"{urls[(index // 10) % 2]}/v1/chat/completions/derender", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        got = drive_stream(post, case["base"], case["output"], [1] * len(case["output"]))
        _assert_matches_batch(got, case["expected"])
