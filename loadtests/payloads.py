"""Deterministic, realistic request bodies shared by the locustfile and the sizing command.

Chat payloads come from `benchmarks/render_bench.py` (`SCENARIOS[name].build(seed)`): a short
chat (~300 tokens), a ~9k-token multi-turn chat, and a coding-agent conversation with 15 tools.
Derender payloads are engine outputs (reasoning, content, then a hermes tool call) tokenized by
the target itself through `POST /tokenize`, so the same code drives render-service and
`vllm launch render` without a local tokenizer.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from benchmarks import render_bench
from benchmarks.render_bench import SCENARIOS, Writer

MODEL = render_bench.MODEL_NAME
RENDER_PATH = "/v1/chat/completions/render"
DERENDER_PATH = "/v1/chat/completions/derender"
HEADERS = {"content-type": "application/json"}
VARIANTS = 8  # distinct payloads per scenario (rotated, so caches see realistic variety)


@cache
def chat_payloads(scenario: str, seed: int = 1, variants: int = VARIANTS) -> tuple[dict[str, Any], ...]:
    """`variants` deterministic chat-render bodies of a render_bench scenario (short, long9k, agent)."""
    build = SCENARIOS[scenario].build
    return tuple(build(seed * 1000 + i) for i in range(variants))


@cache
def chat_bodies(scenario: str, seed: int = 1, variants: int = VARIANTS) -> tuple[bytes, ...]:
    return tuple(json.dumps(p).encode() for p in chat_payloads(scenario, seed, variants))


# -- the growing agent conversation ---------------------------------------------------------


def _extra_tool(w: Writer, turn: int) -> dict[str, Any]:
    """One more tool with a nested schema: agents discover tools (MCP servers) as they go."""
    props = {
        f"{w.rng.choice(render_bench._NOUNS)}_{k}": {
            "type": w.rng.choice(("string", "integer", "boolean")),
            "description": w.sentence(),
        }
        for k in range(w.rng.randint(3, 6))
    }
    props["options"] = {
        "type": "object",
        "description": w.sentence(),
        "properties": {
            "timeout_s": {"type": "integer", "minimum": 1},
            "dry_run": {"type": "boolean", "default": False},
            "labels": {"type": "array", "items": {"type": "string"}},
        },
    }
    return render_bench._tool(
        f"{w.ident(2)}_{turn}",
        w.paragraph((1, 2)),
        {"type": "object", "properties": props, "required": list(props)[:1]},
    )


@dataclass
class AgentSession:
    """A multi-turn agent conversation: each turn adds an assistant message (with its tool calls),
    the tool results, and one more tool to the tools block; the whole conversation is re-rendered."""

    seed: int
    max_turns: int = 12

    def __post_init__(self) -> None:
        full = render_bench.agent_conversation(self.seed)
        self._all = full["messages"]
        self._tools = full["tools"]
        self._writer = Writer(self.seed + 7)
        self.reset()

    def reset(self) -> None:
        self.turn = 0
        self.messages: list[dict[str, Any]] = list(self._all[:2])  # system + user
        self.tools: list[dict[str, Any]] = copy.deepcopy(self._tools)
        self._cursor = 2

    def next_body(self) -> dict[str, Any]:
        """The render request of the next turn (restarts the session after `max_turns` turns)."""
        if self.turn >= self.max_turns or self._cursor >= len(self._all):
            self.reset()
        if self.turn:
            # append the next assistant message and everything up to the next assistant message
            end = self._cursor + 1
            while end < len(self._all) and self._all[end]["role"] != "assistant":
                end += 1
            self.messages.extend(self._all[self._cursor : end])
            self._cursor = end
            self.tools.append(_extra_tool(self._writer, self.turn))
        self.turn += 1
        return {"model": MODEL, "messages": list(self.messages), "tools": list(self.tools)}


# -- derender --------------------------------------------------------------------------------


def output_text(seed: int, words: int = 260) -> str:
    """An engine output as text: reasoning, content, then one hermes tool call (~words*1.3 tokens)."""
    w = Writer(seed)
    reasoning, content, description = "", "", ""
    while len(reasoning.split()) < words * 0.4:
        reasoning += w.paragraph((2, 4)) + " "
    while len(content.split()) < words * 0.2:
        content += w.paragraph((1, 2)) + "\n\n" + w.bullets(2) + "\n\n"
    while len(description.split()) < words * 0.4:
        description += w.paragraph((2, 3)) + " "
    call = {
        "name": "create_ticket",
        "arguments": {
            "project": "PAY",
            "title": f"Fix {w.ident(2)}",
            "priority": "P1",
            "description": description.strip(),
            "components": ["billing", "scheduler"],
        },
    }
    return (
        f"<think>\n{reasoning.strip()}\n</think>\n\n{content.strip()}\n\n<tool_call>\n{json.dumps(call)}\n"
        "</tool_call><|im_end|>"
    )


def derender_chat_request(seed: int) -> dict[str, Any]:
    w = Writer(seed)
    return {
        "model": MODEL,
        "max_tokens": 4096,
        "temperature": 0.7,
        "messages": [
            {
                "role": "system",
                "content": "You are the on-call assistant of the payments team. Think "
                "first, then file exactly one ticket with create_ticket.",
            },
            {"role": "user", "content": w.paragraph((2, 3)) + " Please file a ticket for it."},
        ],
        "tools": [
            render_bench._tool(
                "create_ticket",
                "Create an issue in the tracker.",
                {
                    "type": "object",
                    "required": ["project", "title"],
                    "properties": {
                        "project": {"type": "string"},
                        "title": {"type": "string"},
                        "priority": {"type": "string"},
                        "description": {"type": "string"},
                        "components": {"type": "array", "items": {"type": "string"}},
                    },
                },
            )
        ],
    }


@dataclass(frozen=True)
class DerenderCase:
    """One chat request, its prompt ids and an engine output (token ids), from the target."""

    chat_request: dict[str, Any]
    prompt_token_ids: list[int]
    output_token_ids: list[int]

    def batch_body(self, request_id: str) -> dict[str, Any]:
        return {
            "model": MODEL,
            "chat_request": self.chat_request,
            "prompt_token_ids": self.prompt_token_ids,
            "prompt_tokens": len(self.prompt_token_ids),
            "generate_response": {
                "request_id": request_id,
                "output_mode": "tokens",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "stop_reason": None,
                        "token_ids": self.output_token_ids,
                        "logprobs": None,
                    }
                ],
            },
        }

    def stream_bodies(self, request_id: str, tokens_per_chunk: int = 1) -> Iterator[Callable[[Any], dict[str, Any]]]:
        """Chunk builders: call each with the previous answer's `stream_state` (None first),
        like an llm-d client; the last chunk carries only usage."""
        ids, n = self.output_token_ids, len(self.output_token_ids)
        usage = {
            "prompt_tokens": len(self.prompt_token_ids),
            "completion_tokens": n,
            "total_tokens": len(self.prompt_token_ids) + n,
        }
        for start in range(0, n + 1, tokens_per_chunk):
            if start < n:
                part = ids[start : start + tokens_per_chunk]
                last = start + tokens_per_chunk >= n
                choices = [
                    {
                        "index": 0,
                        "finish_reason": "stop" if last else None,
                        "stop_reason": None,
                        "token_ids": part,
                        "logprobs": None,
                    }
                ]
                chunk = {"request_id": request_id, "usage": None, "output_mode": "tokens", "choices": choices}
            else:
                chunk = {"request_id": request_id, "usage": usage, "output_mode": "tokens", "choices": []}

            def body(state: Any, chunk: dict[str, Any] = chunk) -> dict[str, Any]:
                return {
                    "stream": True,
                    "model": MODEL,
                    "chat_request": self.chat_request,
                    "prompt_token_ids": self.prompt_token_ids,
                    "stream_state": state,
                    "generate_chunk": chunk,
                }

            yield body


_CASES: dict[tuple[str, int, int], DerenderCase] = {}


def _post_json(host: str, path: str, body: dict[str, Any]) -> Any:
    """stdlib HTTP (works under locust's gevent patching, where httpx's optional trio import fails)."""
    request = urllib.request.Request(host.rstrip("/") + path, data=json.dumps(body).encode(), headers=HEADERS)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def derender_case(host: str, seed: int, words: int = 260) -> DerenderCase:
    """Built once per (host, seed) through the target's own /render and /tokenize (loopback)."""
    key = (host, seed, words)
    if key not in _CASES:
        request = derender_chat_request(seed)
        prompt = _post_json(host, RENDER_PATH, request)["token_ids"]
        tokens = _post_json(
            host, "/tokenize", {"model": MODEL, "prompt": output_text(seed, words), "add_special_tokens": False}
        )["tokens"]
        _CASES[key] = DerenderCase(request, prompt, tokens)
    return _CASES[key]
