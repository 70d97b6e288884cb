"""Test helpers: real processes on free loopback ports (redis-server, the service), and stream drivers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, port: int, process: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.process = process
        self.url = f"redis://127.0.0.1:{port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        import pytest

        pytest.skip("redis-server is not installed (CI installs it from Debian)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(port, process)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if server.client().ping():
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield server
    finally:
        server.kill()


@contextmanager
def service(model_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`render-service serve` as a real process; yields its base URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "render_service.cli",
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    process = subprocess.Popen(
        command, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace") if process.stdout else ""
                raise RuntimeError(f"service exited with {process.returncode}:\n{output[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("service did not become healthy")
            time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent), whatever the label order."""
    import re

    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        if found == labels:
            return float(match.group(2))
    return 0.0


def chunk_body(
    base: dict[str, Any],
    token_ids: list[int],
    finish_reason: str | None,
    state: Any,
    request_id: str = "generate-tokens-chatcmpl-test",
) -> dict[str, Any]:
    body = {k: v for k, v in base.items() if k != "generate_chunk"}
    body["stream"] = True
    body["generate_chunk"] = {
        "request_id": request_id,
        "usage": None,
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": token_ids,
                "routed_experts": None,
                "sampling_mask": None,
                "weight_versions": None,
                "logprobs": None,
            }
        ],
    }
    body["stream_state"] = state
    return body


def drive_stream(
    post: Callable[[int, dict[str, Any]], dict[str, Any]],
    base: dict[str, Any],
    output_ids: list[int],
    chunk_lens: list[int],
    finish_reason: str = "stop",
) -> dict[str, Any]:
    """Send `output_ids` chunk by chunk like an llm-d client (echoing stream_state); collect the message."""
    state = None
    content, reasoning = [], []
    calls: dict[int, dict[str, Any]] = {}
    final = None
    start = 0
    for call_index, length in enumerate(chunk_lens):
        ids = output_ids[start : start + length]
        start += length
        last = start >= len(output_ids)
        response = post(call_index, chunk_body(base, ids, finish_reason if last else None, state))
        state = response["stream_state"]
        for choice in response["chunk"]["choices"]:
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning") or "")
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"id": call["id"], "name": "", "arguments": ""})
                if call["id"] is not None:
                    assert entry["id"] == call["id"], "a tool call changed id mid-stream"
                entry["name"] += call["function"]["name"] or ""
                entry["arguments"] += call["function"]["arguments"] or ""
            if choice["finish_reason"] is not None:
                final = choice["finish_reason"]
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning),
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": final,
        "state": state,
    }


def segment_cache_contexts(model_dir: Path, **flags: Any) -> tuple[Any, Any]:
    """Two render contexts on one loaded model: (segment cache on, `--segment-cache-bytes 0`)."""
    from render_service.model.loader import load_model
    from render_service.render import pipeline
    from render_service.settings import Settings

    on = Settings(model=str(model_dir), **flags).validate()
    off = Settings(model=str(model_dir), segment_cache_bytes=0, **flags).validate()
    model = load_model(on)
    return pipeline.make_context(model, on), pipeline.make_context(model, off)
