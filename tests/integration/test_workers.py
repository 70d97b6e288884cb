"""The worker pool: several processes on one socket, a dead worker is replaced, SIGTERM exits 0,
and a keep-alive client's stream stays on its worker (warm snapshots without Redis)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from render_service.server.workers import available_cpus
from tests.helpers import free_port

pytestmark = pytest.mark.timeout(300)
CHAT = {"model": "tinyqwen3", "messages": [{"role": "user", "content": "hi"}]}


def start(model_dir: Path, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "render_service.cli",
            "serve",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--served-model-name",
            "tinyqwen3",
            "--reasoning-parser",
            "qwen3",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise TimeoutError("service did not start")


def worker_pids(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def seen_workers(url: str, tries: int = 80) -> set[str]:
    seen = set()
    for _ in range(tries):
        text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}).text
        seen.update(re.findall(r'render_worker_info\{worker="(\d+)"\}', text))
    return seen


def test_available_cpus_respects_affinity() -> None:
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))


def test_pool_replaces_dead_workers_and_drains_on_sigterm(qwen3_model_dir: Path) -> None:
    process, url = start(qwen3_model_dir, 2)
    try:
        assert len(worker_pids(process.pid)) == 2
        assert seen_workers(url) == {"0", "1"}
        victim = worker_pids(process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = worker_pids(process.pid)
            if len(pids) == 2 and victim not in pids:
                break
            time.sleep(0.2)
        assert len(worker_pids(process.pid)) == 2 and victim not in worker_pids(process.pid)
        for _ in range(20):  # the replacement serves; nothing fails
            assert (
                httpx.post(f"{url}/v1/chat/completions/render", json=CHAT, headers={"Connection": "close"}).status_code
                == 200
            )
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0


def test_keep_alive_stream_stays_warm_on_its_worker(qwen3_model_dir: Path) -> None:
    process, url = start(qwen3_model_dir, 2)
    try:
        with httpx.Client(base_url=url) as http:
            prompt = http.post("/v1/chat/completions/render", json=CHAT).json()["token_ids"]
            ids = http.post("/tokenize", json={"prompt": "<think>one two three four five six</think> done"}).json()
            state = None
            for token in ids["tokens"]:
                body = {
                    "stream": True,
                    "chat_request": CHAT,
                    "prompt_token_ids": prompt,
                    "stream_state": state,
                    "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [token]}]},
                }
                response = http.post("/v1/chat/completions/derender", json=body)
                assert response.status_code == 200
                state = response.json()["stream_state"]
            text = http.get("/metrics").text  # same connection: the worker that served the stream
        hits = float(re.search(r'render_snapshot_hits_total\{tier="local"\} ([\d.]+)', text).group(1))
        assert hits == len(ids["tokens"]) - 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
