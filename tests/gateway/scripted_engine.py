"""A small engine that speaks vLLM 0.33's `/inference/v1/generate` over real HTTP, from a script.

Each request takes the next `Script` (or the default one): the token ids it generates, how it
finishes, and what goes wrong (an error status, a stall before the first token or after some
tokens, a dropped connection, an error event mid-stream). The engine records every request body,
which requests finished, and which were abandoned by their client (the cancellation the gateway
must pass on). Response and chunk shapes follow ttio/protocol.py (see the protocol reference §3).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Script:
    tokens: list[int]
    finish_reason: str = "stop"
    stop_reason: int | str | None = None
    chunk_size: int = 1  # tokens per streamed chunk
    status: int | None = None  # answer this status (vLLM's error body) instead of generating
    stall_before_first: float = 0.0  # seconds before the first token (or the whole answer)
    stall_after: int | None = None  # after this many tokens, wait until the client leaves
    drop_after: int | None = None  # after this many tokens, cut the connection (no [DONE])
    error_after: int | None = None  # after this many tokens, send vLLM's error event and [DONE]
    logprobs: bool = False
    kv_transfer_params: dict[str, Any] | None = None  # what a non-streaming answer carries (a P/D prefill's)
    interval: float = 0.001  # seconds between streamed chunks


@dataclass
class Record:
    body: dict[str, Any]
    outcome: str = "running"  # running, finished, cancelled, failed


@dataclass
class ScriptedEngine:
    default: Script
    scripts: list[Script] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    healthy: bool = True
    url: str = ""
    model: str = "tinyqwen3"

    def next_script(self) -> Script:
        return self.scripts.pop(0) if self.scripts else self.default

    def outcomes(self) -> list[str]:
        return [r.outcome for r in self.records]

    def wait_for(self, outcome: str, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(r.outcome == outcome for r in self.records):
                return True
            time.sleep(0.02)
        return False

    # -- the app ----------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/inference/v1/generate", self._generate, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def _generate(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        record = Record(body)
        self.records.append(record)
        script = self.next_script()
        if script.status is not None:
            record.outcome = "failed"
            error = {"message": f"scripted {script.status}", "type": "BadRequestError", "param": None}
            return Response(
                orjson.dumps({"error": {**error, "code": script.status}}),
                status_code=script.status,
                media_type="application/json",
            )
        n = int(body["sampling_params"].get("n", 1))
        if body.get("stream"):
            return StreamingResponse(self._stream(body, script, record, n), media_type="text/event-stream")
        if script.stall_before_first:
            if await _client_left(request, script.stall_before_first):
                record.outcome = "cancelled"
                return Response(status_code=499)
        record.outcome = "finished"
        return Response(orjson.dumps(self._full(body, script, n)), media_type="application/json")

    def _choice(self, index: int, ids: list[int], script: Script, final: bool) -> dict[str, Any]:
        return {
            "index": index,
            "finish_reason": script.finish_reason if final else None,
            "stop_reason": script.stop_reason if final else None,
            "token_ids": ids,
            "routed_experts": None,
            "sampling_mask": None,
            "logprobs": _logprobs(ids) if script.logprobs else None,
        }

    def _full(self, body: dict[str, Any], script: Script, n: int) -> dict[str, Any]:
        prompt = len(body["token_ids"])
        choices = [{**self._choice(i, script.tokens, script, True), "weight_versions": None} for i in range(n)]
        return {
            "request_id": "generate-tokens-" + body["request_id"],
            "model": self.model,
            "created": int(time.time()),
            "usage": {
                "prompt_tokens": prompt,
                "total_tokens": prompt + n * len(script.tokens),
                "completion_tokens": n * len(script.tokens),
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": body["token_ids"] if body.get("return_token_ids") else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": script.kv_transfer_params,
            "ec_transfer_params": None,
            "output_mode": "tokens",
            "choices": choices,
        }

    async def _stream(self, body: dict[str, Any], script: Script, record: Record, n: int) -> AsyncIterator[bytes]:
        request_id = "generate-tokens-" + body["request_id"]
        finished = False
        try:
            if script.stall_before_first:
                await asyncio.sleep(script.stall_before_first)
            tokens = script.tokens
            sent = 0
            while sent < len(tokens):
                if script.stall_after is not None and sent >= script.stall_after:
                    await asyncio.sleep(3600)  # until the client leaves (the generator is cancelled)
                if script.drop_after is not None and sent >= script.drop_after:
                    record.outcome = "failed"
                    raise ConnectionAbortedError("scripted drop")
                if script.error_after is not None and sent >= script.error_after:
                    error = {"message": "Internal server error", "type": "InternalServerError", "param": None}
                    yield _event({"error": {**error, "code": 500}})
                    yield b"data: [DONE]\n\n"
                    record.outcome = "failed"
                    finished = True
                    return
                piece = tokens[sent : sent + script.chunk_size]
                sent += len(piece)
                final = sent >= len(tokens)
                for index in range(n):
                    chunk = {
                        "request_id": request_id,
                        "usage": None,
                        "output_mode": "tokens",
                        "choices": [{**self._choice(index, piece, script, final), "weight_versions": None}],
                    }
                    if sent == len(piece) and body.get("return_token_ids"):
                        chunk["prompt_token_ids"] = body["token_ids"]
                    yield _event(chunk)
                await asyncio.sleep(script.interval)
            if (body.get("stream_options") or {}).get("include_usage"):
                prompt = len(body["token_ids"])
                usage = {"prompt_tokens": prompt, "total_tokens": prompt + n * sent, "completion_tokens": n * sent}
                yield _event({"request_id": request_id, "usage": usage, "output_mode": "tokens", "choices": []})
            yield b"data: [DONE]\n\n"
            record.outcome = "finished"
            finished = True
        finally:
            if not finished and record.outcome == "running":
                record.outcome = "cancelled"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _logprobs(ids: list[int]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token_id": token,
                "logprob": -0.5,
                "rank": 1,
                "top_logprobs": [{"token_id": token, "logprob": -0.5, "rank": 1}],
            }
            for token in ids
        ]
    }


async def _client_left(request: Request, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(0.02)
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_in_thread(app: Any, port: int | None = None) -> Iterator[str]:
    """`app` under uvicorn on a loopback port, in a thread of this process; yields its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def scripted_engine(default: Script) -> Iterator[ScriptedEngine]:
    engine = ScriptedEngine(default)
    with serve_in_thread(engine.app()) as url:
        engine.url = url
        yield engine
