#!/usr/bin/env python3
"""Streaming derender: render-service vs vLLM 0.33's `vllm launch render`, side by side.

A benchmark script, not a timed test. A synthetic but realistic N-token output (reasoning in
<think>...</think>, content, one hermes tool call with long JSON arguments, <|im_end|>) is
streamed one token per chunk to POST /v1/chat/completions/derender, driven like an llm-d client:
every request carries the chunk and echoes the previous response's `stream_state` (vLLM and our
`full` mode also resend `prompt_token_ids` and `chat_request` on every chunk; our `compact` mode
sends them on the first chunk only, its state being a small handle), then a usage-only chunk.

Targets, all started by this script on free ports and stopped by PID at the end:
- `vllm`: vLLM's render tier (replays the whole output through fresh parsers on every chunk);
- `full`, `compact`: one render-service process each, in-process snapshot cache only;
- `full-redis`, `compact-redis`: two render-service processes sharing a private redis-server,
  chunks alternating between them, so every chunk's snapshot comes from Redis (never from the
  in-process cache); their CPU is the sum of both replicas.

Per stream: server CPU (utime+stime of the process tree), wall time, bytes sent / received
(request / response bodies), per-chunk server CPU at the start and at the end of the stream
(precise per-chunk CPU from /proc/PID/task/*/schedstat sampled around every chunk), snapshot
tiers hit (from /metrics); plus the batch derender cost of the same output. Correctness: the
concatenated reasoning / content / tool-call names and arguments and the final finish_reason
of every target must be identical (ours among themselves always; with vLLM where it ran fully).

vLLM's cost grows ~n^2-n^3; with a time box (--vllm-budget-seconds) a size that would exceed
it is measured on windows of the stream instead (first chunks, evenly spaced windows, last
chunks), each window starting from a pre-built stream_state holding exactly the
output_token_ids / output_chunk_lens vLLM itself would carry, and the totals are interpolated
(marked `~` in the tables).

Example:

    python3 -m benchmarks.derender_bench --json derender_bench.json

See benchmarks/README.md for the options and how to read the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

# benchmarks/ is a folder of scripts, not a package: make the shared helpers importable.
from benchmarks._common import (
    DEFAULT_ORACLE_PYTHON,
    Server,
    example_model_dir,
    format_table,
    free_port,
    process_tree,
    ratio,
    start_render_service,
    start_vllm_render,
    tree_cpu_seconds,
)
from benchmarks.render_bench import Writer, _arr, _obj, _s, _tool

RENDER_PATH = "/v1/chat/completions/render"
DERENDER_PATH = "/v1/chat/completions/derender"
MODEL_NAME = "tinyqwen3"
DEFAULT_SERVER_ARGS = (
    f"--served-model-name {MODEL_NAME} --reasoning-parser qwen3 --enable-auto-tool-choice "
    "--tool-call-parser hermes --max-model-len 16384"
)
DEFAULT_SIZES = "250,500,1000,2000,4000"
HEADERS = {"content-type": "application/json"}
TARGETS = ("vllm", "full", "compact", "full-redis", "compact-redis")
LABELS = {
    "vllm": "vLLM",
    "full": "ours full (in-process)",
    "compact": "ours compact (in-process)",
    "full-redis": "ours full, redis (alternating replicas)",
    "compact-redis": "ours compact, redis (alternating replicas)",
}
OURS = TARGETS[1:]
# The vLLM 0.32 fit of one stream's CPU seconds (fixtures.md section 4), used only to
# predict whether the next vLLM size fits the time box; rescaled by what was measured.
VLLM_FIT = (1.8e-3, 2.74e-5, 3.2e-9)


# =============================================================================================
# Precise server CPU: sum of sum_exec_runtime (ns) over every thread of a process tree.
# =============================================================================================


class TreeCpu:
    """CPU nanoseconds used so far by the threads of one or more process trees (/proc schedstat).

    utime/stime in /proc/PID/stat tick at 10 ms, too coarse for one chunk (~1 ms on our side);
    /proc/PID/task/TID/schedstat is the scheduler's own nanosecond count. The members of the
    trees are looked up once (`refresh`); threads are listed on every read. Threads that exit
    between two reads lose their time (servers keep theirs), so stream totals also report
    utime+stime, which includes exited children.
    """

    def __init__(self, roots: Sequence[int]) -> None:
        self.roots = list(roots)
        self.members: list[int] = []
        self.refresh()

    def refresh(self) -> None:
        self.members = [m for root in self.roots for m in process_tree(root)]

    def ns(self) -> int:
        total = 0
        for member in self.members:
            try:
                tids = os.listdir(f"/proc/{member}/task")
            except FileNotFoundError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{member}/task/{tid}/schedstat", "rb") as handle:
                        total += int(handle.read().split(None, 1)[0])
                except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
                    continue
        return total

    def ticks_seconds(self) -> float:
        return sum(tree_cpu_seconds(root) for root in self.roots)


# =============================================================================================
# The workload: a ~400-token chat request with a tools block, and an N-token output.
# =============================================================================================

THINK, END_THINK, TOOL, END_TOOL, IM_END = "<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"


def ticket_tools() -> list[dict[str, Any]]:
    """Two small tools of an on-call assistant: the prompt is ~400 tokens, like the issue's."""
    return [
        _tool(
            "create_ticket",
            "Create an issue in the tracker.",
            _obj(
                {
                    "project": _s("Project key."),
                    "title": _s("Summary line."),
                    "description": _s("Markdown body."),
                    "priority": _s("Priority.", enum=["P0", "P1", "P2", "P3"]),
                    "assignee": _s("Username."),
                    "components": _arr({"type": "string"}, "Components."),
                    "custom_fields": {"type": "object"},
                },
                ["project", "title"],
            ),
        ),
        _tool("search_code", "Search the repository for code.", _obj({"query": _s("Text to search for.")}, ["query"])),
    ]


def chat_request(seed: int, context_paragraphs: int = 0) -> dict[str, Any]:
    """`context_paragraphs` adds incident context to the user turn (~80 tokens each): a longer
    prompt, which vLLM's stream_state re-sends on every chunk and compact mode sends once."""
    w = Writer(seed)
    tools = ticket_tools()
    context = "".join(f"\n\n{w.paragraph()}" for _ in range(context_paragraphs))
    return {
        "model": MODEL_NAME,
        "messages": [
            {
                "role": "system",
                "content": "You are the on-call assistant of the payments team. Think the problem "
                "through first, then file exactly one ticket with the create_ticket tool.",
            },
            {
                "role": "user",
                "content": f"{w.paragraph((1, 2))} Please look into this and file a ticket for it "
                "with a detailed description of the problem and the next steps." + context,
            },
        ],
        "tools": tools,
        "max_tokens": 8192,
        "temperature": 0.7,
    }


@dataclass
class Output:
    """N engine token ids and what a correct derender must reconstruct from them."""

    token_ids: list[int]
    reasoning: str  # text between <think> and </think>
    content: str  # text between </think> and <tool_call>
    tool_name: str
    tool_json: str  # text between <tool_call> and </tool_call>
    segments: dict[str, int]  # token counts per part


class OutputBuilder:
    """Builds exact-length outputs: each part is tokenized on its own (ASCII, no merge across
    the special tokens) and the free-text parts are cut at a token boundary to hit N exactly."""

    def __init__(self, model_dir: str) -> None:
        import tokenizers

        self.tok = tokenizers.Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.special = {}
        for text in (THINK, END_THINK, TOOL, END_TOOL, IM_END):
            ids = self.encode(text)
            if len(ids) != 1:
                raise SystemExit(f"{text} is not a single token in this tokenizer ({ids})")
            self.special[text] = ids[0]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def _prose(self, w: Writer, tokens: int, paragraph: Callable[[], str], sep: str) -> list[int]:
        text = paragraph()
        while len(self.encode(text)) < tokens:
            text += sep + paragraph()
        return self.encode(text)[:tokens]

    def build(self, n: int, seed: int) -> Output:
        if n < 120:
            raise SystemExit(f"outputs need at least 120 tokens (got {n})")
        w = Writer(seed)
        sp = self.special
        reasoning_tokens = round(0.35 * n)
        content_tokens = round(0.15 * n)
        nl, nl2 = self.encode("\n"), self.encode("\n\n")
        # reasoning: <think> "\n" prose "\n" </think>
        reasoning_ids = nl + self._prose(w, reasoning_tokens - 2 * len(nl), lambda: w.paragraph((3, 5)), " ") + nl
        # content: "\n\n" prose "\n\n" (the template's separator after </think>, and before the call)
        content_ids = (
            nl2
            + self._prose(w, content_tokens - 2 * len(nl2), lambda: w.paragraph((2, 3)) + "\n\n" + w.bullets(3), "\n\n")
            + nl2
        )
        # tool call: "\n" {"name": ..., "arguments": {... "description": "<filler>", ...}} "\n"
        rng = w.rng
        head = {
            "project": "PAY",
            "title": 'Retry storm in "settle_invoice" after the deploy',
            "priority": "P1",
            "assignee": "oncall-payments",
        }
        tail = {
            "components": ["billing", "scheduler"],
            "custom_fields": {
                "story_points": 5,
                "links": [{"type": "relates", "target": f"PAY-{rng.randint(1000, 9999)}"}],
            },
        }
        marker = "@@DESCRIPTION@@"
        call = {"name": "create_ticket", "arguments": {**head, "description": marker, **tail}}
        text = json.dumps(call)
        before, after = text.split(json.dumps(marker))
        prefix_ids = nl + self.encode(before + '"')
        suffix_ids = self.encode('"' + after) + nl
        filler_tokens = n - 5 - len(reasoning_ids) - len(content_ids) - len(prefix_ids) - len(suffix_ids)
        if filler_tokens < 8:
            raise SystemExit(f"output of {n} tokens too short for the tool call")
        # The description: sentences only (no quotes, backslashes or raw newlines: valid inside JSON).
        filler_ids = self._prose(w, filler_tokens, lambda: w.paragraph((3, 5)), " ")
        tool_ids = prefix_ids + filler_ids + suffix_ids
        ids = [sp[THINK], *reasoning_ids, sp[END_THINK], *content_ids, sp[TOOL], *tool_ids, sp[END_TOOL], sp[IM_END]]
        assert len(ids) == n, (len(ids), n)
        tool_json = self.decode(tool_ids)
        parsed = json.loads(tool_json)  # must be valid JSON with the description cut anywhere
        return Output(
            ids,
            self.decode(reasoning_ids),
            self.decode(content_ids),
            parsed["name"],
            tool_json,
            {"reasoning": len(reasoning_ids), "content": len(content_ids), "tool_call": len(tool_ids), "special": 5},
        )


def expected_arguments(output: Output) -> str:
    return json.dumps(json.loads(output.tool_json)["arguments"], ensure_ascii=False)


# =============================================================================================
# Targets and the streaming client.
# =============================================================================================


@dataclass
class Target:
    key: str
    servers: list[Server]  # one, or two alternating replicas
    compact: bool
    clients: list[httpx.Client] = field(default_factory=list)
    cpu: TreeCpu | None = None
    redis: Server | None = None

    @property
    def label(self) -> str:
        return LABELS[self.key]

    @property
    def is_vllm(self) -> bool:
        return self.key == "vllm"

    def open(self) -> None:
        self.clients = [
            httpx.Client(base_url=s.url, http1=True, http2=False, trust_env=False, timeout=httpx.Timeout(900.0))
            for s in self.servers
        ]
        self.cpu = TreeCpu([s.pid for s in self.servers if s.pid is not None])

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def metrics(self) -> dict[str, float]:
        """Snapshot-store counters summed over the replicas (ours only)."""
        if self.is_vllm:
            return {}
        total: dict[str, float] = {}
        for client in self.clients:
            text = client.get("/metrics").text
            for line in text.splitlines():
                if line.startswith("#") or not line.startswith(
                    ("render_snapshot_", "render_stream_replays_total", "render_redis_errors_total")
                ):
                    continue
                name, _, value = line.rpartition(" ")
                if name.endswith("_created") or "_bucket" in name or name.startswith("render_snapshot_bytes"):
                    continue
                total[name] = total.get(name, 0.0) + float(value)
        return total


def snapshot_counts(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    def delta(name: str) -> int:
        return round(after.get(name, 0.0) - before.get(name, 0.0))

    return {
        "local": delta('render_snapshot_hits_total{tier="local"}'),
        "redis": delta('render_snapshot_hits_total{tier="redis"}'),
        "miss": delta("render_snapshot_misses_total"),
        "replay": delta("render_stream_replays_total"),
        "redis_err": sum(round(after[k] - before.get(k, 0.0)) for k in after if k.startswith("render_redis_errors")),
        "rejected": sum(
            round(after[k] - before.get(k, 0.0)) for k in after if k.startswith("render_snapshot_rejected")
        ),
    }


class Transcript:
    """What a client reconstructs from the streamed deltas."""

    def __init__(self) -> None:
        self.role: str | None = None
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.deltas: list[tuple[Any, ...]] = []  # per chunk, tool ids left out (they are random in vLLM)

    def add(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("role") and self.role is None:
                self.role = delta["role"]
            if delta.get("reasoning"):
                self.reasoning.append(delta["reasoning"])
            if delta.get("content"):
                self.content.append(delta["content"])
            calls = []
            for call in delta.get("tool_calls") or []:
                entry = self.tools.setdefault(call.get("index", 0), {"id": None, "name": None, "args": []})
                function = call.get("function") or {}
                if call.get("id") and entry["id"] is None:
                    entry["id"] = call["id"]
                if function.get("name"):
                    entry["name"] = (entry["name"] or "") + function["name"]
                if function.get("arguments"):
                    entry["args"].append(function["arguments"])
                calls.append((call.get("index"), function.get("name"), function.get("arguments")))
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
            self.deltas.append(
                (delta.get("reasoning"), delta.get("content"), tuple(calls), choice.get("finish_reason"))
            )

    def summary(self) -> dict[str, Any]:
        return {
            "reasoning": "".join(self.reasoning),
            "content": "".join(self.content),
            "tool_calls": [(i, t["name"], "".join(t["args"])) for i, t in sorted(self.tools.items())],
            "finish_reason": self.finish_reason,
        }


@dataclass
class StreamRun:
    """One streamed output on one target (or, for sampled vLLM runs, its measured windows)."""

    target: str
    size: int
    repeat: int
    sampled: bool
    windows: list[tuple[int, int]]  # [start, end) chunk index ranges actually sent
    chunk_cpu_ns: dict[int, int]  # chunk index -> server CPU ns (index `size` = the usage-only chunk)
    chunk_sent: dict[int, int]
    chunk_recv: dict[int, int]
    chunk_wall: dict[int, float]
    cpu_ticks_s: float  # utime+stime delta over the whole run (all replicas)
    wall_s: float
    redis_cpu_s: float | None
    snapshots: dict[str, int]
    fallbacks: int  # compact-redis: 409s retried on the previous replica
    tool_first_chunk: int | None
    tool_id: str | None
    summary: dict[str, Any] | None  # only for complete streams
    deltas: dict[int, tuple[Any, ...]]


def _chunk_body(request_id: str, token_id: int | None, finish: str | None, usage: dict[str, Any] | None) -> dict:
    choices = (
        []
        if token_id is None
        else [{"index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": [token_id], "logprobs": None}]
    )
    return {"request_id": request_id, "usage": usage, "output_mode": "tokens", "choices": choices}


def prebuilt_state(output: Output, position: int, tool_first_chunk: int | None, tool_id: str | None) -> dict:
    """The stream_state vLLM carries after `position` one-token chunks (its own wire format)."""
    streamed = tool_first_chunk is not None and position > tool_first_chunk
    return {
        "prev_tokens": [],
        "prefix_offset": 0,
        "read_offset": 0,
        "role_sent": position > 0,
        "logprob_context_token_ids": [],
        "logprob_text_offset": 0,
        "output_token_ids": output.token_ids[:position],
        "output_chunk_lens": [1] * position,
        "tools_streamed": streamed,
        "last_tool_call_ids": [tool_id] if streamed and tool_id else [],
    }


def run_stream(
    target: Target,
    output: Output,
    prompt_ids: list[int],
    request: dict[str, Any],
    *,
    size: int,
    repeat: int,
    windows: list[tuple[int, int]] | None = None,
    tool_hint: tuple[int | None, str | None] = (None, None),
) -> StreamRun:
    """Stream `output` one token per chunk (or only `windows` of it, from pre-built states)."""
    assert target.cpu is not None
    n = len(output.token_ids)
    sampled = windows is not None
    windows = windows or [(0, n)]
    request_id = f"generate-tokens-chatcmpl-bench-{size}-{repeat}-{secrets.token_hex(4)}"
    usage = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + n, "completion_tokens": n}
    transcript = Transcript()
    cpu_ns: dict[int, int] = {}
    sent: dict[int, int] = {}
    recv: dict[int, int] = {}
    wall: dict[int, float] = {}
    deltas: dict[int, tuple[Any, ...]] = {}
    tool_first: int | None = None
    tool_id: str | None = None
    fallbacks = 0
    replicas = len(target.clients)
    probe = target.cpu
    probe.refresh()
    metrics_before = target.metrics()
    redis_before = tree_cpu_seconds(target.redis.pid) if target.redis and target.redis.pid else None
    ticks_before = probe.ticks_seconds()
    started = time.perf_counter()
    for start, end in windows:
        state: dict[str, Any] | None = None if start == 0 else prebuilt_state(output, start, *tool_hint)
        indices = list(range(start, end)) + ([n] if end == n else [])
        for index in indices:
            if index < n:
                finish = "stop" if index == n - 1 else None
                chunk = _chunk_body(request_id, output.token_ids[index], finish, None)
            else:
                chunk = _chunk_body(request_id, None, None, usage)
            body: dict[str, Any] = {"stream": True, "model": MODEL_NAME, "generate_chunk": chunk, "stream_state": state}
            if not (target.compact and state is not None):
                body["prompt_token_ids"] = prompt_ids
                body["chat_request"] = request
            payload = orjson.dumps(body)
            replica = index % replicas
            cpu0 = probe.ns()
            t0 = time.perf_counter()
            response = target.clients[replica].post(DERENDER_PATH, content=payload, headers=HEADERS)
            if response.status_code == 409 and replicas > 1:
                # compact + Redis: the snapshot was not (yet) in Redis; the previous replica has it in-process.
                fallbacks += 1
                response = target.clients[(index - 1) % replicas].post(DERENDER_PATH, content=payload, headers=HEADERS)
            wall[index] = time.perf_counter() - t0
            cpu_ns[index] = probe.ns() - cpu0
            if response.status_code != 200:
                raise SystemExit(
                    f"ABORT: {target.label} answered {response.status_code} on chunk {index} of the "
                    f"{n}-token stream: {response.text[:500]}"
                )
            sent[index] = len(payload)
            recv[index] = len(response.content)
            answer = orjson.loads(response.content)
            state = answer["stream_state"]
            transcript.add(answer["chunk"])
            if answer["chunk"].get("choices"):
                deltas[index] = transcript.deltas[-1]
            if tool_first is None and transcript.tools:
                tool_first = index
                tool_id = next(iter(transcript.tools.values()))["id"]
    wall_s = time.perf_counter() - started
    ticks = probe.ticks_seconds() - ticks_before
    redis_cpu = (
        tree_cpu_seconds(target.redis.pid) - redis_before
        if redis_before is not None and target.redis and target.redis.pid
        else None
    )
    counts = snapshot_counts(metrics_before, target.metrics()) if not target.is_vllm else {}
    return StreamRun(
        target.key,
        size,
        repeat,
        sampled,
        windows,
        cpu_ns,
        sent,
        recv,
        wall,
        ticks,
        wall_s,
        redis_cpu,
        counts,
        fallbacks,
        tool_first,
        tool_id,
        None if sampled else transcript.summary(),
        deltas,
    )


def run_batch(
    target: Target, output: Output, prompt_ids: list[int], request: dict[str, Any], reps: int
) -> tuple[float, dict[str, Any]]:
    """Mean server CPU ms of one batch derender of the whole output, and the message it returns."""
    assert target.cpu is not None
    body = orjson.dumps(
        {
            "model": MODEL_NAME,
            "generate_response": {
                "request_id": "generate-tokens-chatcmpl-bench-batch",
                "output_mode": "tokens",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "stop_reason": None,
                        "token_ids": output.token_ids,
                        "logprobs": None,
                    }
                ],
            },
            "prompt_token_ids": prompt_ids,
            "prompt_tokens": len(prompt_ids),
            "chat_request": request,
        }
    )
    client = target.clients[0]
    probe = TreeCpu([target.servers[0].pid]) if target.servers[0].pid else target.cpu
    response = client.post(DERENDER_PATH, content=body, headers=HEADERS)  # warm-up, and the answer
    if response.status_code != 200:
        raise SystemExit(f"ABORT: {target.label} batch derender answered {response.status_code}: {response.text[:500]}")
    message = orjson.loads(response.content)["choices"][0]
    before = probe.ns()
    for _ in range(reps):
        client.post(DERENDER_PATH, content=body, headers=HEADERS)
    return (probe.ns() - before) / reps / 1e6, message


# =============================================================================================
# Aggregation.
# =============================================================================================


@dataclass
class SizeResult:
    target: str
    size: int
    sampled: bool
    repeats: int
    cpu_s: float  # per stream (utime+stime), or the interpolated estimate when sampled
    cpu_precise_s: float  # sum of per-chunk schedstat CPU (estimate when sampled)
    wall_s: float
    sent_bytes: float
    recv_bytes: float
    first_chunk_ms: float
    start_ms: float  # per chunk, chunks 2..window+1
    end_ms: float  # per chunk, the last `window` token chunks
    usage_chunk_ms: float
    snapshots: dict[str, int]
    fallbacks: int
    redis_cpu_s: float | None
    measured_wall_s: float  # wall time actually spent on this target (windows only when sampled)

    @property
    def end_over_start(self) -> float | None:
        return ratio(self.end_ms, self.start_ms)


def _interpolate_total(values: dict[int, float], windows: list[tuple[int, int]], n: int) -> float:
    """Sum over chunks 0..n-1 of a per-chunk quantity known on `windows`, linear in between."""
    points = []
    for start, end in windows:
        inside = [values[i] for i in range(start, end) if i in values]
        if inside:
            points.append(((start + end - 1) / 2, sum(inside) / len(inside)))
    known = {i: values[i] for start, end in windows for i in range(start, end) if i in values}
    total = 0.0
    for i in range(n):
        if i in known:
            total += known[i]
            continue
        left = max((p for p in points if p[0] <= i), default=points[0], key=lambda p: p[0])
        right = min((p for p in points if p[0] >= i), default=points[-1], key=lambda p: p[0])
        if right[0] == left[0]:
            total += left[1]
        else:
            total += left[1] + (right[1] - left[1]) * (i - left[0]) / (right[0] - left[0])
    return total


def aggregate(runs: list[StreamRun], size: int, window: int) -> SizeResult:
    n = size
    per_run = []
    for run in runs:
        cpu_ms = {i: v / 1e6 for i, v in run.chunk_cpu_ns.items()}
        start_idx = range(1, min(window + 1, n))
        end_idx = range(max(n - window, 0), n)
        first = cpu_ms.get(0, float("nan"))
        start = statistics.fmean(cpu_ms[i] for i in start_idx)
        end = statistics.fmean(cpu_ms[i] for i in end_idx)
        usage = cpu_ms.get(n, float("nan"))
        if run.sampled:
            precise = (_interpolate_total(cpu_ms, run.windows, n) + (usage if usage == usage else 0.0)) / 1000
            sent = _interpolate_total(
                {k: float(v) for k, v in run.chunk_sent.items()}, run.windows, n
            ) + run.chunk_sent.get(n, 0)
            recv = _interpolate_total(
                {k: float(v) for k, v in run.chunk_recv.items()}, run.windows, n
            ) + run.chunk_recv.get(n, 0)
            wall = _interpolate_total(run.chunk_wall, run.windows, n) + run.chunk_wall.get(n, 0.0)
            cpu = precise
        else:
            precise = sum(cpu_ms.values()) / 1000
            sent, recv = float(sum(run.chunk_sent.values())), float(sum(run.chunk_recv.values()))
            wall, cpu = run.wall_s, run.cpu_ticks_s
        per_run.append((cpu, precise, wall, sent, recv, first, start, end, usage, run.redis_cpu_s, run.wall_s))

    def med(i: int) -> float:
        return statistics.median(r[i] for r in per_run)

    redis = [r[9] for r in per_run if r[9] is not None]
    counts: dict[str, int] = {}
    for run in runs:
        for k, v in run.snapshots.items():
            counts[k] = counts.get(k, 0) + v
    return SizeResult(
        runs[0].target,
        size,
        runs[0].sampled,
        len(runs),
        med(0),
        med(1),
        med(2),
        med(3),
        med(4),
        med(5),
        med(6),
        med(7),
        med(8),
        counts,
        sum(r.fallbacks for r in runs),
        statistics.median(redis) if redis else None,
        sum(r[10] for r in per_run),
    )


def plan_windows(n: int, window: int, count: int) -> list[tuple[int, int]]:
    """First window+1 chunks, `count`-2 evenly spaced windows, the last `window` chunks."""
    starts = {0}
    for j in range(1, count - 1):
        starts.add(round(j * (n - window) / (count - 1)))
    starts.add(n - window)
    out: list[tuple[int, int]] = []
    for start in sorted(starts):
        end = min(n, start + window + (1 if start == 0 else 0))
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def vllm_predicted_s(n: int, scale: float) -> float:
    a, b, c = VLLM_FIT
    return scale * (a * n + b * n * n + c * n**3)


# =============================================================================================
# Correctness.
# =============================================================================================


def compare_summaries(reference_name: str, reference: dict[str, Any], name: str, other: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("reasoning", "content", "tool_calls", "finish_reason"):
        if reference[key] != other[key]:
            a, b = str(reference[key]), str(other[key])
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            problems.append(
                f"{name} vs {reference_name}: {key} differs at char {at}: "
                f"{a[max(0, at - 40) : at + 40]!r} vs {b[max(0, at - 40) : at + 40]!r}"
            )
    return problems


def check_against_output(name: str, summary: dict[str, Any], output: Output) -> list[str]:
    """Soft checks against what the synthetic output encodes (notes, not failures)."""
    notes = []
    if summary["reasoning"] != output.reasoning:
        notes.append(f"{name}: reasoning is not the text between <think> and </think>")
    if summary["content"] != output.content:
        notes.append(f"{name}: content is not the text between </think> and <tool_call>")
    calls = summary["tool_calls"]
    if len(calls) != 1 or calls[0][1] != output.tool_name:
        notes.append(f"{name}: expected one {output.tool_name} call, got {[c[1] for c in calls]}")
    elif calls[0][2] != expected_arguments(output):
        try:
            same = json.loads(calls[0][2]) == json.loads(output.tool_json)["arguments"]
        except ValueError:
            same = False
        notes.append(
            f"{name}: tool arguments {'equal as JSON but not as text' if same else 'differ'} from the generated call"
        )
    return notes


# =============================================================================================
# Servers.
# =============================================================================================


def start_redis(port: int, log: Path) -> Server:
    executable = shutil.which("redis-server") or "/usr/bin/redis-server"
    command = [
        executable,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    server = Server(
        "redis", f"redis://127.0.0.1:{port}/0", process.pid, owned=True, log=log, info={"command": " ".join(command)}
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            if sock.recv(16).startswith(b"+PONG"):
                return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"redis-server on port {port} did not answer PING")


def ours_default_args() -> list[str]:
    """One worker process, like vLLM's one render process (when this render-service has a pool)."""
    executable = shutil.which("render-service")
    command = [executable] if executable else [sys.executable, "-m", "render_service.cli"]
    try:
        help_text = subprocess.run([*command, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return ["--workers", "1"] if "--workers" in help_text else []


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "render_service"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" (render_service/ modified)" if dirty else "")


def start_targets(args: argparse.Namespace, log_dir: Path, started: list[Server]) -> dict[str, Target]:
    server_args = shlex.split(args.server_args)
    ours_args = shlex.split(args.ours_args) if args.ours_args is not None else ours_default_args()
    targets: dict[str, Target] = {}
    wanted = args.targets
    redis: Server | None = None
    if any(k.endswith("-redis") for k in wanted):
        port = free_port()
        print(f"starting redis-server on port {port} ...", flush=True)
        redis = start_redis(port, log_dir / f"redis-{port}.log")
        started.append(redis)
    snapshot_key = secrets.token_hex(32)
    for key in wanted:
        if key == "vllm":
            port = free_port()
            print(f"starting vLLM render on port {port} ...", flush=True)
            server = start_vllm_render(args.model, port, server_args, python=args.oracle_python)
            started.append(server)
            targets[key] = Target(key, [server], compact=False)
            continue
        mode = "compact" if key.startswith("compact") else "full"
        extra = [*ours_args, "--stream-state-mode", mode]
        replicas = 1
        if key.endswith("-redis"):
            assert redis is not None
            extra += ["--redis-url", redis.url, "--snapshot-key", snapshot_key]
            replicas = 2
        servers = []
        for _ in range(replicas):
            port = free_port()
            print(f"starting render-service ({key}) on port {port} ...", flush=True)
            server = start_render_service(
                args.model, port, [*server_args, *extra], log=log_dir / f"ours-{key}-{port}.log"
            )
            started.append(server)
            servers.append(server)
        targets[key] = Target(key, servers, compact=mode == "compact", redis=redis if replicas > 1 else None)
    for target in targets.values():
        target.open()
        pids = ", ".join(str(s.pid) for s in target.servers)
        print(f"  {target.label}: {', '.join(s.url for s in target.servers)} pid {pids}")
    return targets


# =============================================================================================
# Reporting.
# =============================================================================================


def _ms(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _x(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 100 else f"{value:.0f}x"


def _mb(value: float) -> str:
    return f"{value / 1e6:.3f}" if value < 1e7 else f"{value / 1e6:.1f}"


def size_table(size: int, results: dict[str, SizeResult], prompt_tokens: int, window: int) -> str:
    headers = (
        "target",
        "CPU s/stream",
        "wall s",
        "sent MB",
        "recv MB",
        "1st chunk ms",
        f"start ms/chunk (2-{window + 1})",
        f"end ms/chunk (last {window})",
        "end/start",
        "snapshots local/redis/miss/replay",
        "redis CPU s",
    )
    rows: list[list[str]] = []
    for key in TARGETS:
        r = results.get(key)
        if r is None:
            continue
        est = "~" if r.sampled else ""
        snaps = (
            "-"
            if not r.snapshots
            else (
                f"{r.snapshots.get('local', 0)}/{r.snapshots.get('redis', 0)}/"
                f"{r.snapshots.get('miss', 0)}/{r.snapshots.get('replay', 0)}"
                + (f" +{r.fallbacks} 409->prev" if r.fallbacks else "")
                + (f" ({r.snapshots['redis_err']} redis err)" if r.snapshots.get("redis_err") else "")
            )
        )
        rows.append(
            [
                LABELS[key] + (" [sampled]" if r.sampled else "") + (f" x{r.repeats}" if r.repeats > 1 else ""),
                est + f"{r.cpu_s:.3f}",
                est + f"{r.wall_s:.2f}",
                est + _mb(r.sent_bytes),
                est + _mb(r.recv_bytes),
                _ms(r.first_chunk_ms),
                _ms(r.start_ms),
                _ms(r.end_ms),
                _x(r.end_over_start),
                snaps,
                "-" if r.redis_cpu_s is None else f"{r.redis_cpu_s:.2f}",
            ]
        )
    vllm = results.get("vllm")
    if vllm is not None:
        rows.append([])
        for key in OURS:
            r = results.get(key)
            if r is None:
                continue
            rows.append(
                [
                    f"vLLM / {LABELS[key]}",
                    _x(ratio(vllm.cpu_s, r.cpu_s)),
                    _x(ratio(vllm.wall_s, r.wall_s)),
                    _x(ratio(vllm.sent_bytes, r.sent_bytes)),
                    _x(ratio(vllm.recv_bytes, r.recv_bytes)),
                    _x(ratio(vllm.first_chunk_ms, r.first_chunk_ms)),
                    _x(ratio(vllm.start_ms, r.start_ms)),
                    _x(ratio(vllm.end_ms, r.end_ms)),
                    "",
                    "",
                    "",
                ]
            )
    title = f"== streaming derender, {size}-token output, one token per chunk ({prompt_tokens}-token prompt) =="
    return format_table(headers, rows, title)


def batch_table(batch: dict[int, dict[str, float]]) -> str:
    rows = []
    for size, by_target in sorted(batch.items()):
        v, o = by_target.get("vllm"), by_target.get("ours")
        rows.append([str(size), _ms(v), _ms(o), _x(ratio(v, o))])
    return format_table(
        ("output tokens", "vLLM CPU ms/req", "ours CPU ms/req", "vLLM/ours"),
        rows,
        "== batch derender of the same outputs (mean server CPU per request) ==",
    )


def sent_floor(output: Output, prompt_ids: list[int], request: dict[str, Any]) -> int:
    """Request bytes of a stream whose state costs nothing: every generate chunk as sent here, the
    prompt ids and chat request once, `stream_state` null. No state design can send less."""
    n = len(output.token_ids)
    usage = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + n, "completion_tokens": n}
    request_id = f"generate-tokens-chatcmpl-bench-{n}-0-{'0' * 8}"
    total = len(orjson.dumps({"prompt_token_ids": prompt_ids, "chat_request": request})) - 2 + 1
    for index in range(n + 1):
        chunk = (
            _chunk_body(request_id, output.token_ids[index], "stop" if index == n - 1 else None, None)
            if index < n
            else _chunk_body(request_id, None, None, usage)
        )
        total += len(orjson.dumps({"stream": True, "model": MODEL_NAME, "generate_chunk": chunk, "stream_state": None}))
    return total


def ratio_lines(all_results: dict[int, dict[str, SizeResult]], floors: dict[int, int] | None = None) -> list[str]:
    lines = ["== exact ratios =="]
    for size, results in sorted(all_results.items()):
        vllm = results.get("vllm")
        if vllm is None:
            continue
        est = " (vLLM sampled: estimate)" if vllm.sampled else ""
        parts = [f"{k} {ratio(vllm.cpu_s, results[k].cpu_s):.1f}x" for k in OURS if k in results]
        lines.append(f"server CPU per stream vLLM/ours @ {size}: " + ", ".join(parts) + est)
    for size, results in sorted(all_results.items()):
        parts = [
            f"{k} {results[k].end_over_start:.2f}x"
            for k in OURS
            if k in results and results[k].end_over_start is not None
        ]
        if parts:
            lines.append(f"per-chunk CPU at end / at start @ {size}: " + ", ".join(parts))
    for size, results in sorted(all_results.items()):
        full, compact = results.get("full"), results.get("compact")
        if full and compact:
            lines.append(
                f"full/compact @ {size}: per-chunk CPU at the end {ratio(full.end_ms, compact.end_ms):.2f}x "
                f"({full.end_ms:.3f} vs {compact.end_ms:.3f} ms), per stream {ratio(full.cpu_s, compact.cpu_s):.2f}x"
            )
    for size, results in sorted(all_results.items()):
        vllm = results.get("vllm")
        if vllm is None:
            continue
        est = " (vLLM sampled: estimate)" if vllm.sampled else ""
        for key in ("compact", "compact-redis", "full"):
            if key in results:
                r = results[key]
                lines.append(
                    f"bytes vLLM/ours {key} @ {size}: sent {ratio(vllm.sent_bytes, r.sent_bytes):.1f}x, "
                    f"received {ratio(vllm.recv_bytes, r.recv_bytes):.1f}x, total "
                    f"{ratio(vllm.sent_bytes + vllm.recv_bytes, r.sent_bytes + r.recv_bytes):.1f}x{est}"
                )
        floor = (floors or {}).get(size)
        compact = results.get("compact") or results.get("compact-redis")
        if floor and compact:
            lines.append(
                f"  sent-bytes floor @ {size} (generate chunks + prompt once, zero-byte state): "
                f"{floor / 1e6:.3f} MB; ours compact is {compact.sent_bytes / floor:.2f}x the floor; "
                f"vLLM/floor {ratio(vllm.sent_bytes, floor):.1f}x is the most any state design can reach"
            )
    return lines


def verdicts(all_results: dict[int, dict[str, SizeResult]], correctness_ok: bool | None) -> list[str]:
    lines = ["== issue targets =="]

    def verdict(ok: bool | None) -> str:
        return "N/A " if ok is None else ("PASS" if ok else "FAIL")

    at2k = all_results.get(2000, {})
    vllm = at2k.get("vllm")
    ran = {k for results in all_results.values() for k in results}
    for key in (k for k in OURS if k in ran):
        r = at2k.get(key)
        value = ratio(vllm.cpu_s, r.cpu_s) if vllm and r else None
        note = "" if vllm is None or not vllm.sampled else " (vLLM sampled: estimate)"
        lines.append(
            f"{verdict(None if value is None else value >= 100)} server CPU per 2,000-token stream >= 100x "
            f"lower than vLLM's [{LABELS[key]}]: "
            f"{'-' if value is None else f'{value:.1f}x'}{note}"
        )
    for key, goal in (("full", 150), ("compact", 150)):
        r = at2k.get(key)
        value = ratio(vllm.cpu_s, r.cpu_s) if vllm and r else None
        lines.append(
            f"{verdict(None if value is None else value >= goal)} server CPU per 2,000-token stream >= {goal}x "
            f"lower than vLLM's (issue 19) [{LABELS[key]}]: {'-' if value is None else f'{value:.1f}x'}"
        )
    largest = max(all_results) if all_results else None
    deep = all_results.get(4000, {})
    full, compact = deep.get("full"), deep.get("compact")
    value = ratio(full.end_ms, compact.end_ms) if full and compact else None
    lines.append(
        f"{verdict(None if value is None else value <= 1.3)} full-mode per-chunk CPU at token 4,000 within 1.3x "
        f"of compact mode's (last chunks): {'-' if value is None else f'{value:.2f}x'}"
    )
    for key, limit in (("compact", 1.5), ("compact-redis", 1.5), ("full", 3.0), ("full-redis", 3.0)):
        if key not in ran:
            continue
        r = all_results.get(largest, {}).get(key) if largest else None
        value = r.end_over_start if r else None
        ok = None if value is None or largest != 4000 else value <= limit
        lines.append(
            f"{verdict(ok)} per-chunk CPU at token {largest or 4000:,} within {limit}x of the start "
            f"(chunks 2-51) [{LABELS[key]}]: {'-' if value is None else f'{value:.2f}x'}"
            + ("" if largest == 4000 else " (needs the 4000-token size)")
        )
    r = at2k.get("compact") or at2k.get("compact-redis")
    sent = ratio(vllm.sent_bytes, r.sent_bytes) if vllm and r else None
    total = ratio(vllm.sent_bytes + vllm.recv_bytes, r.sent_bytes + r.recv_bytes) if vllm and r else None
    lines.append(
        f"{verdict(None if sent is None else sent >= 50)} compact mode sends >= 50x fewer bytes than vLLM "
        f"for a 2,000-token stream (request bodies): {'-' if sent is None else f'{sent:.1f}x'}"
    )
    lines.append(
        f"{verdict(None if total is None else total >= 50)} ... and counting both directions "
        f"(request + response bodies): {'-' if total is None else f'{total:.1f}x'}"
    )
    lines.append(
        f"{verdict(correctness_ok)} streamed reasoning / content / tool calls / finish_reason identical across targets"
    )
    return lines


# =============================================================================================
# Main.
# =============================================================================================


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="model folder (default: the tiny Qwen3 example model, built into a temp folder)"
    )
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="output lengths in tokens (default: %(default)s)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of: " + ", ".join(TARGETS))
    parser.add_argument("--skip-vllm", action="store_true", help="drop the vllm target")
    parser.add_argument(
        "--vllm-max",
        type=int,
        default=2000,
        help="largest output length streamed to vLLM at all (default %(default)s; 4000 adds ~5-8 min)",
    )
    parser.add_argument(
        "--vllm-budget-seconds",
        type=float,
        default=900.0,
        help="time box for all vLLM streams; a size predicted to overrun it is measured on "
        "windows (default %(default)s)",
    )
    parser.add_argument(
        "--vllm-sample-windows",
        type=int,
        default=6,
        help="windows per sampled vLLM stream, first and last included (default %(default)s)",
    )
    parser.add_argument("--force-vllm-sampled", action="store_true", help="always sample vLLM (for testing)")
    parser.add_argument("--repeats", type=int, default=3, help="streams per size for each of our targets")
    parser.add_argument("--window", type=int, default=50, help="chunks in the start and end windows")
    parser.add_argument("--batch-reps", type=int, default=20, help="batch derender requests per size and target")
    parser.add_argument("--seed", type=int, default=0, help="workload generator seed")
    parser.add_argument(
        "--context-paragraphs",
        type=int,
        default=0,
        help="paragraphs of context added to the prompt (~80 tokens each; default: the ~440-token prompt)",
    )
    parser.add_argument(
        "--server-args", default=DEFAULT_SERVER_ARGS, help="flags given to every started server (default: %(default)s)"
    )
    parser.add_argument(
        "--ours-args",
        default=None,
        help="extra flags for our servers (default: --workers 1 when the CLI has a worker pool)",
    )
    parser.add_argument(
        "--oracle-python",
        default=DEFAULT_ORACLE_PYTHON,
        help="python of the vLLM 0.33 env whose render tier is measured (default: $VLLM_ORACLE_PYTHON)",
    )
    parser.add_argument("--json", dest="json_out", help="also write all results as JSON to this file")
    args = parser.parse_args(argv)
    args.model = example_model_dir(args.model)
    args.sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {unknown}; choose from {list(TARGETS)}")
    if args.skip_vllm:
        args.targets = [t for t in args.targets if t != "vllm"]
    if any(n < 2 * args.window + 20 for n in args.sizes):
        parser.error(f"every size must be at least {2 * args.window + 20} tokens with --window {args.window}")
    return args


def _render_prompt(targets: dict[str, Target], request: dict[str, Any]) -> list[int]:
    answers = {}
    for key, target in targets.items():
        response = target.clients[0].post(RENDER_PATH, content=orjson.dumps(request), headers=HEADERS)
        if response.status_code != 200:
            raise SystemExit(f"ABORT: {target.label} render answered {response.status_code}: {response.text[:300]}")
        answers[key] = orjson.loads(response.content)["token_ids"]
    (first, ids), *others = answers.items()
    for key, other in others:
        if other != ids:
            raise SystemExit(
                f"ABORT: {first} and {key} render the prompt differently ({len(ids)} vs {len(other)} "
                "tokens): the streams would not be comparable"
            )
    return ids


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    commit = git_commit()
    print(
        f"derender bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; render-service {commit}; "
        f"sizes {args.sizes}; targets {args.targets}; vLLM up to {args.vllm_max} tokens, time box "
        f"{args.vllm_budget_seconds:.0f} s"
    )
    builder = OutputBuilder(args.model)
    outputs = {n: builder.build(n, args.seed * 1000 + n) for n in args.sizes}
    request = chat_request(args.seed, args.context_paragraphs)
    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_before": os.getloadavg(),
        },
        "options": vars(args),
        "render_service_commit": commit,
        "outputs": {n: o.segments for n, o in outputs.items()},
        "sizes": {},
    }
    log_dir = Path(tempfile.mkdtemp(prefix="derender-bench-"))
    started: list[Server] = []
    targets: dict[str, Target] = {}
    try:
        targets = start_targets(args, log_dir, started)
        report["servers"] = {k: [{"url": s.url, "pid": s.pid, **s.info} for s in t.servers] for k, t in targets.items()}
        prompt_ids = _render_prompt(targets, request)
        print(
            f"prompt: {len(prompt_ids)} tokens (rendered identically by {', '.join(targets)}); chat_request "
            f"{len(orjson.dumps(request))} bytes; outputs: "
            + ", ".join(
                f"{n} = {o.segments['reasoning']} reasoning + {o.segments['content']} content + "
                f"{o.segments['tool_call']} tool call + 5 special"
                for n, o in list(outputs.items())[:1]
            )
            + " (same split for every size)"
        )
        report["prompt_tokens"] = len(prompt_ids)

        # Warm-up: one short stream and one batch derender per target, not measured.
        warm = builder.build(max(250, 2 * args.window + 20), 999)
        for target in targets.values():
            run_stream(target, warm, prompt_ids, request, size=len(warm.token_ids), repeat=-1)
            run_batch(target, warm, prompt_ids, request, 1)

        all_results: dict[int, dict[str, SizeResult]] = {}
        batch: dict[int, dict[str, float]] = {}
        problems: list[str] = []
        notes: list[str] = []
        verified_with_vllm: list[int] = []
        vllm_spent = 0.0
        vllm_scale = 1.0
        for position, n in enumerate(args.sizes):
            output = outputs[n]
            runs: dict[str, list[StreamRun]] = {k: [] for k in targets}
            ours = [k for k in targets if k != "vllm"]
            for repeat in range(args.repeats):
                order = ours if (position + repeat) % 2 == 0 else list(reversed(ours))
                for key in order:
                    run = run_stream(targets[key], output, prompt_ids, request, size=n, repeat=repeat)
                    runs[key].append(run)
                    print(
                        f"  {n:>5} tokens  {LABELS[key]:<42} rep {repeat}  CPU {run.cpu_ticks_s:7.3f} s  "
                        f"wall {run.wall_s:6.2f} s  snapshots {run.snapshots}"
                        + (f"  409->prev {run.fallbacks}" if run.fallbacks else ""),
                        flush=True,
                    )
            if "vllm" in targets and n <= args.vllm_max:
                predicted = vllm_predicted_s(n, vllm_scale)
                sampled = args.force_vllm_sampled or vllm_spent + predicted > args.vllm_budget_seconds
                hint_run = next(iter(runs.get("full") or runs.get("compact") or []), None)
                hint = (hint_run.tool_first_chunk, hint_run.tool_id) if hint_run else (None, None)
                if sampled and hint_run is None:
                    notes.append(
                        f"vLLM @ {n}: sampling needs one of our full/compact targets for the tool-call "
                        "position; streamed fully instead"
                    )
                    sampled = False
                windows = plan_windows(n, args.window, args.vllm_sample_windows) if sampled else None
                print(
                    f"  {n:>5} tokens  vLLM: predicted ~{predicted:.0f} s for the full stream, "
                    f"{vllm_spent:.0f} s of the {args.vllm_budget_seconds:.0f} s time box used -> "
                    + (f"sampled windows {windows}" if sampled else "full stream"),
                    flush=True,
                )
                run = run_stream(
                    targets["vllm"], output, prompt_ids, request, size=n, repeat=0, windows=windows, tool_hint=hint
                )
                runs["vllm"].append(run)
                vllm_spent += run.wall_s
                if not sampled:
                    vllm_scale = max(run.wall_s, run.cpu_ticks_s) / vllm_predicted_s(n, 1.0)
                print(
                    f"  {n:>5} tokens  {'vLLM':<42} rep 0  CPU {run.cpu_ticks_s:7.3f} s  wall {run.wall_s:6.2f} s"
                    + (" (windows only)" if sampled else ""),
                    flush=True,
                )
            # Correctness.
            summaries = {k: rs[0].summary for k, rs in runs.items() if rs and rs[0].summary is not None}
            for k, rs in runs.items():
                for run in rs[1:]:
                    if run.summary is not None:
                        problems += compare_summaries(
                            f"{k} rep 0", rs[0].summary or {}, f"{k} rep {run.repeat}", run.summary
                        )
            reference = "vllm" if "vllm" in summaries else next(iter(summaries), None)
            if reference is not None:
                for k, summary in summaries.items():
                    if k != reference:
                        problems += [
                            f"@{n}: {p}" for p in compare_summaries(reference, summaries[reference], k, summary)
                        ]
                notes += [f"@{n}: {x}" for x in check_against_output(reference, summaries[reference], output)]
            if "vllm" in summaries:
                verified_with_vllm.append(n)
            vllm_runs = runs.get("vllm") or []
            if vllm_runs and vllm_runs[0].sampled and runs.get("full"):
                ours_deltas = runs["full"][0].deltas
                same = sum(1 for i, d in vllm_runs[0].deltas.items() if ours_deltas.get(i) == d)
                total = len(vllm_runs[0].deltas)
                notes.append(f"@{n}: vLLM sampled windows: {same}/{total} chunk deltas identical to ours (full)")
                if same != total:
                    problems.append(f"@{n}: vLLM sampled windows: {total - same} chunk deltas differ from ours")
            for k, rs in runs.items():
                for run in rs:
                    if run.snapshots.get("redis_err") or run.snapshots.get("replay") or run.fallbacks:
                        notes.append(
                            f"@{n} {k} rep {run.repeat}: {run.snapshots.get('redis_err', 0)} Redis error(s) "
                            f"(then Redis is skipped for a cool-down): {run.snapshots.get('miss', 0)} snapshot "
                            f"misses, {run.snapshots.get('replay', 0)} replays"
                            + (
                                f", {run.fallbacks} chunks answered 409 and were retried on the previous "
                                "replica (a real client would have had to restart the stream)"
                                if run.fallbacks
                                else ""
                            )
                        )
            results = {k: aggregate(rs, n, args.window) for k, rs in runs.items() if rs}
            all_results[n] = results
            # Batch derender of the same output.
            batch[n] = {}
            messages = {}
            batch_ours = next((k for k in ("full", "compact", "full-redis", "compact-redis") if k in targets), None)
            for key, label in (("vllm", "vllm"), (batch_ours, "ours")):
                if key in targets and (key != "vllm" or n <= args.vllm_max):
                    batch[n][label], messages[label] = run_batch(
                        targets[key], output, prompt_ids, request, args.batch_reps
                    )
            if len(messages) == 2:
                a, b = messages["vllm"]["message"], messages["ours"]["message"]
                for field_name in ("content", "reasoning"):
                    if a.get(field_name) != b.get(field_name):
                        problems.append(f"@{n}: batch {field_name} differs between vLLM and ours")
                calls = [
                    [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
                    for m in (a, b)
                ]
                if calls[0] != calls[1]:
                    problems.append(f"@{n}: batch tool calls differ between vLLM and ours")
            print("\n" + size_table(n, results, len(prompt_ids), args.window) + "\n", flush=True)
            report["sizes"][n] = {
                "results": {k: {**asdict(r), "label": LABELS[k]} for k, r in results.items()},
                "batch_cpu_ms": batch[n],
                "runs": {
                    k: [
                        {
                            "repeat": r.repeat,
                            "sampled": r.sampled,
                            "windows": r.windows,
                            "cpu_ticks_s": r.cpu_ticks_s,
                            "wall_s": r.wall_s,
                            "snapshots": r.snapshots,
                            "fallbacks": r.fallbacks,
                            "redis_cpu_s": r.redis_cpu_s,
                            "chunk_cpu_ms": {i: v / 1e6 for i, v in sorted(r.chunk_cpu_ns.items())},
                            "chunk_sent": r.chunk_sent,
                            "chunk_recv": r.chunk_recv,
                        }
                        for r in rs
                    ]
                    for k, rs in runs.items()
                },
            }

        print(batch_table(batch) + "\n")
        floors = {n: sent_floor(outputs[n], prompt_ids, request) for n in all_results}
        for line in ratio_lines(all_results, floors):
            print(line)
        print()
        sampled_sizes = [n for n, rs in all_results.items() if "vllm" in rs and rs["vllm"].sampled]
        if sampled_sizes:
            print(
                f"note: vLLM was measured on windows of the stream (not fully) at {sampled_sizes} tokens to stay in "
                f"the {args.vllm_budget_seconds:.0f} s time box; its totals there are interpolated (~)."
            )
        skipped = [n for n in args.sizes if "vllm" in targets and n > args.vllm_max]
        if skipped:
            print(f"note: vLLM not run at {skipped} tokens (--vllm-max {args.vllm_max}).")
        for note in notes:
            print(f"note: {note}")
        for problem in problems:
            print(f"MISMATCH: {problem}")
        if "vllm" in targets and verified_with_vllm:
            print(
                f"verified: {', '.join(k for k in targets if k != 'vllm')} reproduce vLLM's streamed reasoning, "
                f"content, tool calls and finish_reason at {verified_with_vllm} tokens"
                if not problems
                else "verification found mismatches"
            )
        correctness = not problems if summaries else None
        print()
        for line in verdicts(all_results, correctness):
            print(line)
        report.update(
            batch_cpu_ms=batch,
            problems=problems,
            notes=notes,
            verified_with_vllm=verified_with_vllm,
            ratios=ratio_lines(all_results, floors),
            sent_floor_bytes=floors,
            verdicts=verdicts(all_results, correctness),
            vllm_wall_spent_s=vllm_spent,
        )
    finally:
        for target in targets.values():
            target.close()
        for server in reversed(started):
            server.stop()
    report["machine"]["loadavg_after"] = os.getloadavg()
    if args.json_out:
        Path(args.json_out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
