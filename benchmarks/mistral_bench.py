#!/usr/bin/env python3
"""CPU of a ~9k-token chat render for the `mistral` renderer: render-service vs vLLM 0.33, side by side.

The Mistral counterpart of renderer_bench.py: builds a Mistral-format fixture folder
(`tests.mistral_fixture`, mistral-common's Tekken vocabulary, v13 by default), starts
`render-service serve` (one worker) and `vllm launch render` on it, checks both return identical
`token_ids`, then times the same multi-turn chats (reasoning history, a tool round trip, tools)
in rounds alternating between the servers and prints server CPU-ms per request and the ratio.

    python -m benchmarks.mistral_bench [--version v13] [--requests 40] [--fresh] [--json out.json]
        [--baseline CHECKOUT]

`--baseline CHECKOUT` also starts render-service from another checkout of this repository (its
root goes first on PYTHONPATH), timed in the same rounds: the build before a change, next to it.

Needs a vLLM 0.33 environment with mistral-common (VLLM_ORACLE_PYTHON or --oracle-python).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import (
    DEFAULT_ORACLE_PYTHON,
    fmt,
    format_table,
    free_port,
    start_render_service,
    start_vllm_render,
)
from benchmarks.renderer_bench import MODEL_NAME, measure, start_checkout
from benchmarks.renderer_bench import payload as renderer_payload
from tests.mistral_fixture import VERSIONS, build_mistral_model


def _cut(text: str, scale: float) -> str:
    """The first `scale` of `text`, at a word boundary."""
    keep = int(len(text) * scale)
    return text if keep >= len(text) else text[:keep].rsplit(" ", 1)[0]


def payload(seed: int, scale: float) -> dict[str, Any]:
    """renderer_bench's chat with a 9-character tool-call id (mistral-common requires one), its
    texts cut to `scale` of their length: the fixture keeps 8k Tekken ranks, so text takes more
    tokens than on a full vocabulary, and the cut brings the prompt back near 9k tokens."""
    body = renderer_payload(seed)
    for message in body["messages"]:
        for call in message.get("tool_calls") or []:
            call["id"] = "call12345"
        if message.get("role") == "tool":
            message["tool_call_id"] = "call12345"
        for key in ("content", "reasoning"):
            if isinstance(message.get(key), str):
                message[key] = _cut(message[key], scale)
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="v13", choices=VERSIONS, help="tokenizer version of the fixture")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per server")
    parser.add_argument("--rounds", type=int, default=4, help="alternations between the servers")
    parser.add_argument("--variants", type=int, default=4, help="distinct payloads")
    parser.add_argument("--scale", type=float, default=0.77, help="share of each message's text kept")
    parser.add_argument("--fresh", action="store_true", help="time payloads neither server has seen")
    parser.add_argument("--oracle-python", default=DEFAULT_ORACLE_PYTHON, help="python of a vLLM 0.33 env")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--baseline", type=Path, help="another checkout of render-service, timed next to ours")
    args = parser.parse_args(argv)

    bodies = [orjson.dumps(payload(1000 + i, args.scale)) for i in range(args.variants)]
    timed = [orjson.dumps(payload(100_000 + i, args.scale)) for i in range(args.requests)] if args.fresh else None
    server_args = ["--served-model-name", MODEL_NAME, "--max-model-len", "32768"]
    folder = Path(tempfile.mkdtemp(prefix="mistral-bench-"))
    started: dict[str, Any] = {}
    try:
        model_dir = str(build_mistral_model(folder / args.version, args.version))
        print(f"[mistral {args.version}] starting render-service and vLLM on {model_dir} ...", flush=True)
        ours_args = [*server_args, "--workers", "1"]
        started["ours"] = start_render_service(model_dir, free_port(), ours_args, log=folder / "ours.log")
        if args.baseline is not None:
            started["baseline"] = start_checkout(args.baseline, model_dir, ours_args, folder / "baseline.log")
        started["vLLM"] = start_vllm_render(model_dir, free_port(), server_args, python=args.oracle_python)
        result = asyncio.run(measure(started, bodies, args.requests, args.rounds, timed))
    finally:
        for server in started.values():
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    vllm_ms = result["cpu_ms"]["vLLM"]

    def row(label: str, target: str) -> list[str]:
        ms = result["cpu_ms"][target]
        return [
            label,
            fmt(result["prompt_tokens"], 0),
            fmt(ms),
            fmt(vllm_ms),
            fmt(vllm_ms / ms if ms else None, 1) + "x",
            fmt(result["p50_ms"][target]),
            fmt(result["p50_ms"]["vLLM"]),
        ]

    headers = [
        "renderer",
        "prompt tokens",
        "ours CPU ms/req",
        "vLLM CPU ms/req",
        "vLLM/ours",
        "ours p50 ms",
        "vLLM p50 ms",
    ]
    title = "~9k-token chat render, sequential, server CPU per request" + (
        " (payloads not seen before)" if args.fresh else ""
    )
    rows = [row(f"mistral ({args.version})", "ours")]
    if "baseline" in result["cpu_ms"]:
        rows.append(row(f"baseline ({args.baseline})", "baseline"))
    print(format_table(headers, rows, title=title))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
