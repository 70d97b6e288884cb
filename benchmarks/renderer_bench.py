#!/usr/bin/env python3
"""Per-renderer CPU of a ~9k-token chat render: render-service vs vLLM 0.33, side by side.

For each renderer vLLM 0.33 picks without a Jinja template (`deepseek_v32`, `deepseek_v4`,
`deepseek_v41`, `kimi_k3`, and `harmony` for gpt-oss) the script builds that renderer's
fixture folder (`render_service.model.example_renderers`; `tests/render/gpt_oss_model.py` for
gpt-oss, with the real o200k vocabulary), starts `render-service serve` (one worker) and
`vllm launch render` on it (gpt-oss with its parser flags and the same pinned
VLLM_SYSTEM_START_DATE), checks that both return identical `token_ids` for every payload,
then sends the same ~9k-token multi-turn chats (reasoning history, tools, tool results)
sequentially, in rounds alternating between the two servers, and prints server CPU-ms per
request (schedstat over each server's process tree) and the vLLM/ours ratio.

    python -m benchmarks.renderer_bench [--renderers deepseek_v4 kimi_k3] [--requests 40] [--json out.json]
        [--baseline CHECKOUT]

`--baseline CHECKOUT` also starts render-service from another checkout of this repository (its
root goes first on PYTHONPATH), timed in the same rounds: the build before a change, next to it.

`harmony` runs when $TIKTOKEN_ENCODINGS_BASE names a folder with o200k_base.tiktoken
(scripts/fetch_o200k.py builds it); without it the default list leaves it out.
Needs a vLLM 0.33 environment (VLLM_ORACLE_PYTHON or --oracle-python). A script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks._common import (
    DEFAULT_ORACLE_PYTHON,
    Server,
    fmt,
    format_table,
    free_port,
    percentile,
    start_render_service,
    start_vllm_render,
)
from benchmarks.render_bench import Writer, long_chat
from render_service.model.example_renderers import RENDERER_FAMILIES, build_renderer_model

RENDERERS = (*RENDERER_FAMILIES, "harmony")
# gpt-oss is served with these (vLLM's defaults for it); the others need no parser flags here.
HARMONY_FLAGS = ["--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"]
RENDER_PATH = "/v1/chat/completions/render"
MODEL_NAME = "tinymodel"
HEADERS = {"content-type": "application/json"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_query",
            "description": "Run a read-only SQL query against the analytics warehouse.",
            "parameters": {
                "type": "object",
                "properties": {
                    "sql": {"type": "string", "description": "The query."},
                    "limit": {"type": "integer", "description": "Row limit."},
                },
                "required": ["sql"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]


def payload(seed: int) -> dict[str, Any]:
    """~9k tokens: the long chat of render_bench with reasoning on the assistant turns, a tool
    round trip before the last question, and the tools block."""
    body = long_chat(seed)
    writer = Writer(seed + 7)
    messages = body["messages"]
    for message in messages:
        if message["role"] == "assistant":
            message["reasoning"] = writer.paragraph((2, 3))
    last = messages.pop()
    messages += [
        {
            "role": "assistant",
            "content": "Let me look at the file first.",
            "reasoning": writer.paragraph((1, 2)),
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"path": "src/ingest/worker.py"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "```python\n" + writer.function() + "\n```"},
        last,
    ]
    body.update(model=MODEL_NAME, tools=TOOLS, tool_choice="none", max_tokens=256)
    return body


async def _post(client: httpx.AsyncClient, body: bytes) -> dict[str, Any]:
    response = await client.post(RENDER_PATH, content=body, headers=HEADERS)
    if response.status_code != 200:
        raise SystemExit(f"{client.base_url} answered {response.status_code}: {response.text[:400]}")
    return orjson.loads(response.content)


async def measure(
    servers: dict[str, Server], bodies: list[bytes], requests: int, rounds: int, timed: list[bytes] | None = None
) -> dict[str, Any]:
    """`bodies` are verified and used for warm-up; `timed` (default: `bodies` again) are timed."""
    clients = {name: httpx.AsyncClient(base_url=server.url, timeout=120) for name, server in servers.items()}
    try:
        tokens = []
        for body in bodies:  # the same work on both sides, or nothing is measured
            answers = {name: await _post(client, body) for name, client in clients.items()}
            ids = [answer["token_ids"] for answer in answers.values()]
            if any(other != ids[0] for other in ids[1:]):
                raise SystemExit(
                    "ABORT: ours and vLLM disagree on token_ids; the benchmark would not compare the same work"
                )
            tokens.append(len(ids[0]))
        for client in clients.values():  # warm-up
            for body in bodies:
                await _post(client, body)
        cpu = {name: 0.0 for name in servers}
        latencies: dict[str, list[float]] = {name: [] for name in servers}
        per_round = max(1, requests // rounds)
        timed = timed or bodies
        timed_ids: dict[str, dict[int, list[int]]] = {name: {} for name in servers}
        for round_index in range(rounds):
            for name, server in servers.items():
                before = server.cpu_seconds_precise() or 0.0
                for index in range(per_round):
                    position = (round_index * per_round + index) % len(timed)
                    started = asyncio.get_running_loop().time()
                    answer = await _post(clients[name], timed[position])
                    latencies[name].append(asyncio.get_running_loop().time() - started)
                    timed_ids[name][position] = answer["token_ids"]
                cpu[name] += (server.cpu_seconds_precise() or 0.0) - before
        # The timed payloads too (with --fresh, seen first in the timed rounds) gave the same ids.
        reference = next(iter(timed_ids.values()))
        if any(ids != reference for ids in timed_ids.values()):
            raise SystemExit("ABORT: ours and vLLM disagree on the token_ids of a timed payload")
        total = per_round * rounds
        return {
            "prompt_tokens": sum(tokens) / len(tokens),
            "requests": total,
            "cpu_ms": {name: cpu[name] / total * 1000 for name in servers},
            "p50_ms": {name: percentile(latencies[name], 50) * 1000 for name in servers},
        }
    finally:
        for client in clients.values():
            await client.aclose()


def _has_o200k() -> bool:
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    return base is not None and (Path(base) / "o200k_base.tiktoken").is_file()


def _model_folder(target: Path, mode: str) -> tuple[str, list[str]]:
    """(model folder, extra serve flags) for one renderer."""
    if mode == "harmony":
        from tests.render.gpt_oss_model import build_gpt_oss_model

        return str(build_gpt_oss_model(target)), HARMONY_FLAGS
    return str(build_renderer_model(target, mode)), []


def start_checkout(checkout: Path, model_dir: str, args: list[str], log: Path) -> Server:
    """render-service from `checkout` (this one, or a `--baseline` checkout)."""
    return start_render_service(model_dir, free_port(), args, log=log, checkout=checkout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = [*RENDERER_FAMILIES, "harmony"] if _has_o200k() else list(RENDERER_FAMILIES)
    parser.add_argument("--renderers", nargs="+", default=default, choices=RENDERERS)
    parser.add_argument("--requests", type=int, default=40, help="timed requests per server and renderer")
    parser.add_argument("--rounds", type=int, default=4, help="alternations between the servers")
    parser.add_argument("--variants", type=int, default=4, help="distinct payloads")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="time payloads neither server has seen (no warm tokenizer segment cache on our side)",
    )
    parser.add_argument("--oracle-python", default=DEFAULT_ORACLE_PYTHON, help="python of a vLLM 0.33 env")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--baseline", type=Path, help="another checkout of render-service, timed next to ours")
    args = parser.parse_args(argv)
    if "harmony" in args.renderers and not _has_o200k():
        raise SystemExit("harmony needs TIKTOKEN_ENCODINGS_BASE with o200k_base.tiktoken (scripts/fetch_o200k.py)")
    os.environ.setdefault("VLLM_SYSTEM_START_DATE", "2026-01-15")  # gpt-oss: both servers render the same date

    bodies = [orjson.dumps(payload(1000 + i)) for i in range(args.variants)]
    timed = [orjson.dumps(payload(100_000 + i)) for i in range(args.requests)] if args.fresh else None
    server_args = ["--served-model-name", MODEL_NAME, "--max-model-len", "32768"]
    results: dict[str, Any] = {}
    folder = Path(tempfile.mkdtemp(prefix="renderer-bench-"))
    try:
        for mode in args.renderers:
            model_dir, flags = _model_folder(folder / mode, mode)
            print(f"[{mode}] starting render-service and vLLM on {model_dir} ...", flush=True)
            ours_args = [*server_args, *flags, "--workers", "1"]
            started: dict[str, Server] = {}
            try:
                started["ours"] = start_render_service(
                    model_dir, free_port(), ours_args, log=folder / f"ours-{mode}.log"
                )
                if args.baseline is not None:
                    started["baseline"] = start_checkout(
                        args.baseline, model_dir, ours_args, folder / f"baseline-{mode}.log"
                    )
                started["vLLM"] = start_vllm_render(
                    model_dir, free_port(), [*server_args, *flags], python=args.oracle_python
                )
                results[mode] = asyncio.run(measure(started, bodies, args.requests, args.rounds, timed))
            finally:
                for server in started.values():
                    server.stop()
            print(f"[{mode}] {results[mode]}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    rows = []
    for mode, result in results.items():
        vllm_ms = result["cpu_ms"]["vLLM"]
        for target in ("ours", "baseline"):
            if target not in result["cpu_ms"]:
                continue
            ms = result["cpu_ms"][target]
            rows.append(
                [
                    mode if target == "ours" else f"  baseline ({args.baseline})",
                    fmt(result["prompt_tokens"], 0),
                    fmt(ms),
                    fmt(vllm_ms),
                    fmt(vllm_ms / ms if ms else None, 1) + "x",
                    fmt(result["p50_ms"][target]),
                    fmt(result["p50_ms"]["vLLM"]),
                ]
            )
    print(
        format_table(
            [
                "renderer",
                "prompt tokens",
                "ours CPU ms/req",
                "vLLM CPU ms/req",
                "vLLM/ours",
                "ours p50 ms",
                "vLLM p50 ms",
            ],
            rows,
            title="~9k-token chat render, sequential, server CPU per request"
            + (" (payloads not seen before)" if args.fresh else ""),
        )
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
