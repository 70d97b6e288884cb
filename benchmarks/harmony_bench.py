#!/usr/bin/env python3
"""gpt-oss (Harmony) CPU per ~9k-token chat render: render-service vs vLLM 0.33, side by side.

Builds the tiny gpt-oss folder (`tests/render/gpt_oss_model.py`: the real o200k_harmony
vocabulary from $TIKTOKEN_ENCODINGS_BASE), starts `render-service serve` (one worker) and
`vllm launch render` on it with gpt-oss's parser flags and the same pinned
VLLM_SYSTEM_START_DATE, checks both return identical `token_ids` for every payload (the ~9k-token
multi-turn chats of renderer_bench: reasoning history, tools, a tool round trip), then times
them in alternating rounds and prints server CPU-ms per request and the vLLM/ours ratio.

    TIKTOKEN_ENCODINGS_BASE=DIR python -m benchmarks.harmony_bench [--requests 40] [--json out.json]

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

import orjson

from benchmarks._common import (
    DEFAULT_ORACLE_PYTHON,
    fmt,
    format_table,
    free_port,
    start_render_service,
    start_vllm_render,
)
from benchmarks.renderer_bench import MODEL_NAME, measure, payload
from tests.render.gpt_oss_model import build_gpt_oss_model

PARSER_FLAGS = ["--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40, help="timed requests per server")
    parser.add_argument("--rounds", type=int, default=4, help="alternations between the servers")
    parser.add_argument("--variants", type=int, default=4, help="distinct payloads")
    parser.add_argument("--oracle-python", default=DEFAULT_ORACLE_PYTHON, help="python of a vLLM 0.33 env")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if not os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        raise SystemExit("set TIKTOKEN_ENCODINGS_BASE to a folder with o200k_base.tiktoken (scripts/fetch_o200k.py)")
    os.environ.setdefault("VLLM_SYSTEM_START_DATE", "2026-01-15")  # both servers render the same date

    bodies = [orjson.dumps(payload(1000 + i)) for i in range(args.variants)]
    server_args = ["--served-model-name", MODEL_NAME, "--max-model-len", "32768", *PARSER_FLAGS]
    folder = Path(tempfile.mkdtemp(prefix="harmony-bench-"))
    try:
        model_dir = str(build_gpt_oss_model(folder / "tinygptoss"))
        print(f"starting render-service and vLLM on {model_dir} ...", flush=True)
        ours = start_render_service(model_dir, free_port(), [*server_args, "--workers", "1"], log=folder / "ours.log")
        try:
            vllm = start_vllm_render(model_dir, free_port(), server_args, python=args.oracle_python)
            try:
                result = asyncio.run(measure({"ours": ours, "vLLM": vllm}, bodies, args.requests, args.rounds))
            finally:
                vllm.stop()
        finally:
            ours.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    ours_ms, vllm_ms = result["cpu_ms"]["ours"], result["cpu_ms"]["vLLM"]
    row = [
        "harmony (gpt-oss)",
        fmt(result["prompt_tokens"], 0),
        fmt(ours_ms),
        fmt(vllm_ms),
        fmt(vllm_ms / ours_ms if ours_ms else None, 1) + "x",
        fmt(result["p50_ms"]["ours"]),
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
    print(format_table(headers, [row], title="~9k-token chat render, sequential, server CPU per request"))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
