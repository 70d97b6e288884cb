"""The traffic of the chaos run: llm-d-style streaming derenders and renders through the load
balancer, each answer checked, every request timed and classified.

A stream is driven as llm-d's coordinator drives one: one POST per engine chunk on a kept-alive
HTTP/1.1 pool, echoing the `stream_state` it got back. Recovery follows the protocol (README,
derender/pipeline.py):
- a transport failure or a 5xx from the balancer (a replica died under the request): resend the
  same chunk (llm-d retries once on another endpoint; the chunk carries its whole state, so a
  resend is always safe);
- 503 (back-pressure, or a replica still loading): wait `Retry-After`, resend;
- 409 `stream_state_expired` (compact mode: no replica holds the stream's snapshot any more) or
  409 `fingerprint_mismatch` (the stream was started under another configuration): restart the
  stream: one chunk with every output id received so far and no `stream_state`, then go on.
Anything else is a protocol violation and fails the stream.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Search the knowledge base",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]
CHAT_REQUEST = {
    "model": "tinyqwen3",
    "messages": [{"role": "user", "content": "Find the render tier."}],
    "tools": TOOLS,
}
# Outputs with reasoning, content and a tool call (ids, names, arguments): every parser path.
OUTPUT_TEXTS = (
    "<think>\nSearch first, then answer with ümlauts and 中文.\n</think>\n\nSearching now.\n<tool_call>\n"
    '{"name": "lookup", "arguments": {"q": "render tier"}}\n</tool_call><|im_end|>',
    "<think>\nShort.\n</think>\n\nThe render tier turns chat requests into token ids and back again, "
    "statelessly, on any replica; snapshots make each chunk cost only its new tokens.<|im_end|>",
    "<think>\nTwo lookups.\n</think>\n\n<tool_call>\n"
    '{"name": "lookup", "arguments": {"q": "a"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "lookup", "arguments": {"q": "b, with a longer query string"}}\n</tool_call><|im_end|>',
)
DERENDER = "/v1/chat/completions/derender"
RENDER = "/v1/chat/completions/render"
MAX_ATTEMPTS = 40  # per chunk; a roll makes streams bounce between builds for a few seconds
REQUEST_TIMEOUT = 30.0


class ProtocolViolation(Exception):
    """An answer the protocol does not allow (a 4xx other than 409, a 500 from a replica, ...)."""


@dataclass
class Sample:
    started: float  # monotonic
    latency: float
    kind: str  # "chunk" or "render"
    outcome: str  # "ok", or the error kind


@dataclass
class Stats:
    samples: list[Sample] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)
    streams_done: int = 0
    streams_correct: int = 0
    renders_done: int = 0
    renders_correct: int = 0
    violations: list[str] = field(default_factory=list)

    def record(self, started: float, kind: str, outcome: str) -> None:
        self.samples.append(Sample(started, time.monotonic() - started, kind, outcome))
        if outcome != "ok":
            self.errors[outcome] += 1


@dataclass
class StreamCase:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    chunk_lens: list[int]


def error_kind(response: httpx.Response) -> str:
    if response.status_code == 409:
        try:
            return f"409 {response.json()['error']['code']}"
        except Exception:
            return "409"
    if not _from_replica(response):
        return f"{response.status_code} (balancer)"
    return str(response.status_code)


def _from_replica(response: httpx.Response) -> bool:
    """Replicas answer JSON (vLLM's error body); HAProxy's own errors are HTML."""
    return response.headers.get("content-type", "").startswith("application/json")


def chunk_request(case: StreamCase, ids: list[int], finish: str | None, state: Any) -> dict[str, Any]:
    return {
        "model": "tinyqwen3",
        "chat_request": CHAT_REQUEST,
        "prompt_token_ids": case.prompt_ids,
        "stream": True,
        "generate_chunk": {
            "request_id": case.request_id,
            "usage": None,
            "output_mode": "tokens",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": ids,
                    "routed_experts": None,
                    "sampling_mask": None,
                    "weight_versions": None,
                    "logprobs": None,
                }
            ],
        },
        "stream_state": state,
    }


class Message:
    """The streamed message, accumulated delta by delta (reset when the stream restarts)."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            self.content.append(delta.get("content") or "")
            self.reasoning.append(delta.get("reasoning") or "")
            for call in delta.get("tool_calls") or []:
                entry = self.calls.setdefault(call["index"], {"id": call["id"], "name": "", "arguments": ""})
                if call["id"] is not None and entry["id"] != call["id"]:
                    raise ProtocolViolation(f"tool call {call['index']} changed id mid-stream")
                entry["name"] += call["function"]["name"] or ""
                entry["arguments"] += call["function"]["arguments"] or ""
            if choice["finish_reason"] is not None:
                self.finish = choice["finish_reason"]

    def result(self) -> dict[str, Any]:
        return {
            "content": _visible("".join(self.content)),
            "reasoning": "".join(self.reasoning),
            "tool_calls": [(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())],
            "finish_reason": self.finish,
        }


def batch_view(message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    """A batch derender's message in `Message.result()`'s shape."""
    return {
        "content": _visible(message.get("content") or ""),
        "reasoning": message.get("reasoning") or "",
        "tool_calls": [
            (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
        ],
        "finish_reason": finish_reason,
    }


def _visible(content: str) -> str:
    """vLLM's batch path drops whitespace-only content next to tool calls (parser/abstract_parser.py)
    while its streaming path has already sent it: the same message either way."""
    return content if content.strip() else ""


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any], stats: Stats, kind: str) -> tuple[int, Any]:
    """One request, resent on transport failures, balancer 5xx and 503s; returns (status, body) for
    200 and 409. Every attempt is a sample."""
    for _attempt in range(MAX_ATTEMPTS):
        started = time.monotonic()
        try:
            response = await client.post(url, json=body, timeout=REQUEST_TIMEOUT)
        except httpx.TransportError as exc:
            stats.record(started, kind, f"transport {type(exc).__name__}")
            await asyncio.sleep(0.05)
            continue
        if response.status_code == 200:
            stats.record(started, kind, "ok")
            return 200, response.json()
        outcome = error_kind(response)
        stats.record(started, kind, outcome)
        if response.status_code == 409:
            return 409, response.json()
        if response.status_code == 503:
            await asyncio.sleep(min(float(response.headers.get("retry-after", "0.2") or 0.2), 2.0))
            continue
        if response.status_code in (502, 504) and not _from_replica(response):
            await asyncio.sleep(0.05)  # from the balancer: no replica answered this attempt
            continue
        raise ProtocolViolation(f"{url} -> {response.status_code}: {response.text[:300]}")
    raise ProtocolViolation(f"{url}: no answer after {MAX_ATTEMPTS} attempts")


async def run_stream(
    client: httpx.AsyncClient, url: str, case: StreamCase, stats: Stats, pause: float = 0.0
) -> dict[str, Any]:
    """Drive one stream to its end, a chunk every `pause` seconds at most (the engine's pace, so
    that streams live through the faults); returns the streamed message."""
    message = Message()
    state: Any = None
    sent = 0  # output ids the current attempt of the stream has consumed
    chunk = 0
    while sent < len(case.output_ids):
        length = case.chunk_lens[chunk]
        ids = case.output_ids[sent : sent + length]
        last = sent + length >= len(case.output_ids)
        status, body = await post(
            client, url + DERENDER, chunk_request(case, ids, "stop" if last else None, state), stats, "chunk"
        )
        if status == 409:
            # Restart: everything received so far (this chunk included) as one chunk, no state.
            stats.restarts[body["error"]["code"]] += 1
            message = Message()
            upto = sent + length
            status, body = await post(
                client,
                url + DERENDER,
                chunk_request(case, case.output_ids[:upto], "stop" if last else None, None),
                stats,
                "chunk",
            )
            if status != 200:
                raise ProtocolViolation(f"a restarted stream got {status}: {body}")
        message.add(body["chunk"])
        state = body["stream_state"]
        sent += length
        chunk += 1
        if pause and sent < len(case.output_ids):
            await asyncio.sleep(pause)
    return message.result()


async def run_render(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], expected: list[int], stats: Stats
) -> None:
    status, answer = await post(client, url + RENDER, body, stats, "render")
    stats.renders_done += 1
    if status == 200 and answer["token_ids"] == expected:
        stats.renders_correct += 1
    else:
        stats.violations.append(f"render answered {status} with other ids")


def make_cases(n: int, prompt_ids: list[int], outputs: list[list[int]], seed: int = 15) -> list[StreamCase]:
    rng = random.Random(seed)
    cases = []
    for index in range(n):
        output = outputs[index % len(outputs)]
        lens: list[int] = []
        while sum(lens) < len(output):
            lens.append(rng.choice((1, 1, 2, 3)))
        cases.append(StreamCase(f"generate-tokens-chatcmpl-chaos-{index}", prompt_ids, output, lens))
    return cases
