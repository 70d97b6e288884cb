#!/usr/bin/env python3
"""gpt-oss (Harmony) CPU per ~9k-token chat render: render-service vs vLLM 0.33, side by side.

The `harmony` row of `benchmarks.renderer_bench`: builds the tiny gpt-oss folder
(`tests/render/gpt_oss_model.py`: the real o200k_harmony vocabulary from $TIKTOKEN_ENCODINGS_BASE),
starts `render-service serve` (one worker) and `vllm launch render` on it with gpt-oss's parser
flags and the same pinned VLLM_SYSTEM_START_DATE, checks both return identical `token_ids` for
every payload (the ~9k-token multi-turn chats of renderer_bench: reasoning history, tools, a tool
round trip), then times them in alternating rounds and prints server CPU-ms per request and the
vLLM/ours ratio.

    TIKTOKEN_ENCODINGS_BASE=DIR python -m benchmarks.harmony_bench [--requests 40] [--json out.json]

Takes renderer_bench's options (`--fresh`: payloads neither server has seen). Needs a vLLM 0.33
environment (VLLM_ORACLE_PYTHON or --oracle-python). A script, not a test.
"""

from __future__ import annotations

import sys

from benchmarks.renderer_bench import main as renderer_bench


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--renderers" in args:
        raise SystemExit("harmony_bench measures the harmony renderer only; use benchmarks.renderer_bench for others")
    return renderer_bench(["--renderers", "harmony", *args])


if __name__ == "__main__":
    sys.exit(main())
