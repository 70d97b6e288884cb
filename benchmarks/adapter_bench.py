#!/usr/bin/env python3
"""Streaming derender through the vLLM adapter vs vLLM 0.33's `vllm launch render`, side by side.

A benchmark script, not a timed test. Run it with the Python of an environment that has vLLM
0.33 installed (the `render-service[vllm]` extra), from the repository root:

    VLLM_PYTHON -m benchmarks.adapter_bench [--tokens 2000] [--reasoning-parser minicpmv]
        [--tool-call-parser NAME] [--model DIR] [--streams vllm,sticky,misses]

Both servers run as child processes of this script (same Python, same model folder, same parser
flags), on free ports, and are stopped by PID at the end. An N-token output (reasoning in
<think>...</think>, then content; or what the chosen tool parser reads) is streamed one token per
chunk to POST /v1/chat/completions/derender like an llm-d client: every request carries the
chunk, `chat_request`, `prompt_token_ids` and the previous response's `stream_state`, over one
keep-alive connection. Three streams:

- `vllm`: vLLM's render tier, which rebuilds its parser and replays the whole output every chunk;
- `adapter sticky`: render-service with the same (non-native) parser through the adapter, the
  state echoed as returned, so every chunk finds its live vLLM parser in the worker's LRU;
- `adapter misses`: the same, but our stream id is dropped from every echoed state, so every
  chunk misses and replays the carried output once (what happens after a restart or on another
  worker), i.e. the worst case.

Per stream: the server's CPU (utime+stime of its process tree from /proc, before and after) and
the ratio of vLLM's CPU to ours. The concatenated reasoning / content / tool calls and the final
finish_reason must be identical across the three (exit status 1 otherwise). Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import (
    Server,
    example_model_dir,
    fmt,
    format_table,
    free_port,
    start_vllm_render,
    stop_process_tree,
    wait_healthy,
)

WORDS = [" the", " quick", " brown", " fox", " é", " 中文", " data", " value", ",", ".", "\n"]
SERVED = "bench"


def start_ours(model_dir: str, port: int, flags: list[str], log: Path) -> Server:
    """render-service with this Python (the one that has vLLM), one worker."""
    import subprocess

    command = [sys.executable, "-m", "render_service.cli", "serve", model_dir, "--port", str(port), "--workers", "1"]
    command += flags
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    server = Server("adapter", f"http://127.0.0.1:{port}", process.pid, owned=True, log=log)
    try:
        wait_healthy(server.url, 300, process.pid, log)
    except BaseException:
        stop_process_tree(process.pid)
        raise
    return server


def output_ids(client: httpx.Client, url: str, tokens: int, tool: str | None) -> list[int]:
    def tok(text: str) -> list[int]:
        body = {"model": SERVED, "prompt": text, "add_special_tokens": False}
        return list(client.post(f"{url}/tokenize", json=body).json()["tokens"])

    words = tok("".join(WORDS[i % len(WORDS)] for i in range(tokens)))
    if tool is None:
        head, tail = tok("<think>"), tok("</think>")
        cut = tokens // 4
        ids = head + words[:cut] + tail + words[: tokens - cut - len(head) - len(tail)]
    else:  # a hermes-style call whose string argument is most of the output
        head = tok('Let me look.<tool_call>\n{"name": "search", "arguments": {"q": "')
        tail = tok('"}}\n</tool_call>')
        ids = head + words[: tokens - len(head) - len(tail)] + tail
    return ids[:tokens]


def stream(
    client: httpx.Client, url: str, base: dict[str, Any], ids: list[int], *, drop_sid: bool
) -> tuple[dict[str, Any], int]:
    """Stream `ids` one token per chunk; the assembled message and the number of chunks."""
    state: dict[str, Any] | None = None
    message: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish_reason": None}
    for index, token in enumerate(ids):
        last = index == len(ids) - 1
        if state is not None and drop_sid:
            state = {k: v for k, v in state.items() if not k.startswith("rs_")}
        body = {
            **base,
            "stream": True,
            "stream_state": state,
            "generate_chunk": {
                "request_id": "bench",
                "output_mode": "tokens",
                "choices": [{"index": 0, "token_ids": [token], "finish_reason": "stop" if last else None}],
            },
        }
        response = client.post(f"{url}/v1/chat/completions/derender", json=body)
        response.raise_for_status()
        out = response.json()
        state = out["stream_state"]
        for choice in out["chunk"]["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning"] += delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or []:
                entry = message["calls"].setdefault(call["index"], ["", ""])
                function = call.get("function") or {}
                entry[0] += function.get("name") or ""
                entry[1] += function.get("arguments") or ""
            message["finish_reason"] = choice["finish_reason"] or message["finish_reason"]
    return message, len(ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--reasoning-parser", default="minicpmv", help="a vLLM parser name with no native code")
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument(
        "--streams",
        default="vllm,sticky,misses",
        help="which streams to run, comma-separated (the misses stream replays O(n^2) like vLLM: slow)",
    )
    args = parser.parse_args()

    model_dir = example_model_dir(args.model)
    flags = ["--served-model-name", SERVED]
    if args.reasoning_parser:
        flags += ["--reasoning-parser", args.reasoning_parser]
    if args.tool_call_parser:
        flags += ["--tool-call-parser", args.tool_call_parser, "--enable-auto-tool-choice"]
    scratch = Path(tempfile.mkdtemp(prefix="adapter-bench-"))
    vllm = start_vllm_render(model_dir, free_port(), flags, python=sys.executable)
    ours = start_ours(model_dir, free_port(), flags, scratch / "ours.log")
    rows = []
    results: dict[str, dict[str, Any]] = {}
    try:
        with httpx.Client(timeout=600) as client:
            request: dict[str, Any] = {"model": SERVED, "messages": [{"role": "user", "content": "Tell me."}]}
            if args.tool_call_parser:
                request["tools"] = [
                    {
                        "type": "function",
                        "function": {
                            "name": "search",
                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                        },
                    }
                ]
            rendered = client.post(f"{vllm.url}/v1/chat/completions/render", json=request).json()
            ids = output_ids(client, vllm.url, args.tokens, args.tool_call_parser)
            base = {"model": SERVED, "chat_request": request, "prompt_token_ids": rendered["token_ids"]}
            wanted = {name.strip() for name in args.streams.split(",")} | {"vllm"}  # vLLM is the reference
            for name, server, drop in (
                ("vllm", vllm, False),
                ("adapter sticky", ours, False),
                ("adapter misses", ours, True),
            ):
                if name.removeprefix("adapter ") not in wanted:
                    continue
                before = server.cpu_seconds()
                results[name], chunks = stream(client, server.url, base, ids, drop_sid=drop)
                after = server.cpu_seconds()
                assert before is not None and after is not None
                results[name]["cpu"] = after - before
                results[name]["chunks"] = chunks
            metrics = client.get(f"{ours.url}/metrics").text
    finally:
        ours.stop()
        vllm.stop()
    reference = {k: v for k, v in results["vllm"].items() if k not in ("cpu", "chunks")}
    same = all({k: v for k, v in r.items() if k not in ("cpu", "chunks")} == reference for r in results.values())
    vllm_cpu = results["vllm"]["cpu"]
    for name, result in results.items():
        cpu = result["cpu"]
        rows.append(
            [
                name,
                str(result["chunks"]),
                fmt(cpu, 2),
                fmt(1000 * cpu / result["chunks"], 3),
                "-" if name == "vllm" else fmt(vllm_cpu / cpu if cpu else None, 1) + "x",
            ]
        )
    parsers = " + ".join(
        f"{flag} {name}"
        for flag, name in (("reasoning", args.reasoning_parser), ("tool", args.tool_call_parser))
        if name
    )
    print(
        format_table(
            ["stream", "chunks", "server CPU s", "CPU ms/chunk", "vLLM CPU / ours"],
            rows,
            title=f"{args.tokens}-token stream, one token per chunk, {parsers} (through the adapter)",
        )
    )
    hits = [line for line in metrics.splitlines() if line.startswith("render_adapter_stream_") and "_total" in line]
    print("\n".join(hits))
    print("outputs identical:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
