"""Worker faults in a real 2-worker service: a runaway template is stopped at the render time limit, a
worker killed in the middle of a request fails that request cleanly and is replaced, and a stream
whose worker dies continues on the other one with the same answer."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.servers import Service, service_process
from tests.helpers import drive_stream

pytestmark = pytest.mark.timeout(300)
RENDER_LIMIT = 3.0
RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
M = [{"role": "user", "content": "hi"}]
CHAT_REQUEST = {
    "model": "tinyqwen3",
    "messages": [{"role": "user", "content": "Find it."}],
    "tools": [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        }
    ],
}
OUTPUT_TEXT = (
    "<think>\nSearch first.\n</think>\n\nSearching.\n<tool_call>\n"
    '{"name": "lookup", "arguments": {"q": "render tier"}}\n</tool_call><|im_end|>'
)


@pytest.fixture(scope="module")
def pool(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("pool") / "service.log"
    with service_process(
        qwen3_model_dir,
        log,
        "--workers",
        "2",
        "--served-model-name",
        "tinyqwen3",
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "--trust-request-chat-template",
        env={"VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT": str(RENDER_LIMIT)},
    ) as service:
        yield service


def workers(service: Service) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(service.process.pid)], capture_output=True, text=True).stdout
    return sorted(int(pid) for pid in out.split())


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def wait_for_replacement(service: Service, victim: int) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = workers(service)
        if len(pids) == 2 and victim not in pids:
            # Serving again: /health answers on fresh connections.
            if all(
                httpx.get(f"{service.url}/health", headers={"Connection": "close"}).status_code == 200 for _ in range(6)
            ):
                return pids
        time.sleep(0.2)
    raise AssertionError(f"worker {victim} was not replaced: {workers(service)}")


def pid_holding(port: int, client_port: int, pids: list[int]) -> int:
    """The worker holding the server side of a loopback TCP connection (from /proc, no tools needed)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) == port and int(remote.rsplit(":", 1)[1], 16) == client_port:
                inode = fields[9]
    assert inode is not None, "connection not found"
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    raise AssertionError("no worker holds the connection")


def test_runaway_template_is_stopped_at_the_limit(pool: Service) -> None:
    start = time.perf_counter()
    response = httpx.post(
        f"{pool.url}/v1/chat/completions/render", json={"messages": M, "chat_template": RUNAWAY}, timeout=60
    )
    elapsed = time.perf_counter() - start
    assert response.status_code == 504 and response.json()["error"]["type"] == "GatewayTimeoutError"
    assert RENDER_LIMIT <= elapsed < RENDER_LIMIT + 5
    for _ in range(10):  # both workers serve normally afterwards
        assert (
            httpx.post(
                f"{pool.url}/v1/chat/completions/render", json={"messages": M}, headers={"Connection": "close"}
            ).status_code
            == 200
        )
    assert "chat template render stopped" in pool.log_text()


def test_worker_killed_mid_request_fails_cleanly_and_is_replaced(pool: Service) -> None:
    before = workers(pool)
    ticks = {pid: cpu_ticks(pid) for pid in before}
    outcome: dict[str, Any] = {}

    def runaway() -> None:
        start = time.perf_counter()
        try:
            outcome["response"] = httpx.post(
                f"{pool.url}/v1/chat/completions/render", json={"messages": M, "chat_template": RUNAWAY}, timeout=60
            )
        except httpx.HTTPError as exc:
            outcome["error"] = exc
        outcome["elapsed"] = time.perf_counter() - start

    thread = threading.Thread(target=runaway)
    thread.start()
    time.sleep(1.0)
    busy = max(before, key=lambda pid: cpu_ticks(pid) - ticks[pid])
    killed_at = time.perf_counter()
    os.kill(busy, signal.SIGKILL)
    thread.join(30)
    # The request in flight fails at once with a closed connection: no hang, no half answer.
    assert "error" in outcome, outcome
    assert isinstance(outcome["error"], (httpx.RemoteProtocolError, httpx.ReadError)), outcome["error"]
    assert time.perf_counter() - killed_at < RENDER_LIMIT
    after = wait_for_replacement(pool, busy)
    assert busy not in after
    for _ in range(20):
        assert (
            httpx.post(
                f"{pool.url}/v1/chat/completions/render", json={"messages": M}, headers={"Connection": "close"}
            ).status_code
            == 200
        )
    assert "exited with status" in pool.log_text() and "replacing it" in pool.log_text()


def test_stream_survives_its_worker(pool: Service) -> None:
    """No Redis: the stream's worker dies mid-stream; the client reconnects, lands on the other
    worker, which replays the client-carried state once; the answer equals the batch one."""
    port = int(pool.url.rsplit(":", 1)[1])
    rendered = httpx.post(f"{pool.url}/v1/chat/completions/render", json=CHAT_REQUEST).json()
    output = httpx.post(f"{pool.url}/tokenize", json={"prompt": OUTPUT_TEXT}).json()["tokens"]
    batch = httpx.post(
        f"{pool.url}/v1/chat/completions/derender",
        json={
            "chat_request": CHAT_REQUEST,
            "prompt_token_ids": rendered["token_ids"],
            "generate_response": {
                "request_id": "generate-tokens-chatcmpl-test",
                "choices": [{"index": 0, "finish_reason": "stop", "token_ids": output}],
            },
        },
    ).json()["choices"][0]["message"]
    base = {"model": "tinyqwen3", "chat_request": CHAT_REQUEST, "prompt_token_ids": rendered["token_ids"]}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    killed: list[int] = []

    def post(index: int, body: dict[str, Any]) -> dict[str, Any]:
        nonlocal connection
        if index == len(output) // 2:
            victim = pid_holding(port, connection.sock.getsockname()[1], workers(pool))
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            time.sleep(0.2)
        payload = json.dumps(body)
        for attempt in range(3):
            try:
                connection.request(
                    "POST", "/v1/chat/completions/derender", payload, {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                assert response.status == 200
                return json.loads(response.read())
            except (ConnectionError, http.client.HTTPException):
                if attempt == 2:
                    raise
                connection.close()  # a client retries a chunk whose connection died, as on any HTTP error
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        raise AssertionError("unreachable")

    connection.connect()
    got = drive_stream(post, base, output, [1] * len(output))
    connection.close()
    assert killed
    assert got["reasoning"] == batch["reasoning"] and got["content"] == batch["content"]
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in batch["tool_calls"]
    ]
    wait_for_replacement(pool, killed[0])
