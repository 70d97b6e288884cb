"""Streaming derender over HTTP, per parser family: per-chunk server CPU at the start and the end
of a long stream, as an llm-d client drives it.

A benchmark script, not a timed test. For each family of `benchmarks.parsers_bench` (same model
fixtures, same N-token outputs whose tool-call string argument carries most of the tokens),
one render-service process is started with the family's parser flags and `--stream-state-mode`
(compact by default), and the output is streamed one token per chunk to
POST /v1/chat/completions/derender with `derender_bench`'s client: every request echoes the
previous response's `stream_state`; compact mode sends `prompt_token_ids` and `chat_request`
on the first chunk only. Per-chunk server CPU comes from /proc schedstat around every chunk.

    for f in llama3 llama4 granite nemotron; do python -m tests.parsers.families.llama MODELS/$f $f; done
    python -m benchmarks.derender_family_bench --models MODELS [--family granite_tool ...] [--sizes 2000,4000]

With `--redis`, two render-service processes share a private redis-server and the chunks
alternate between them (every chunk resumes from a snapshot the other replica wrote, and held
text is read from Redis by the bytes the replica lacks); the CPU is both processes'.

Printed per family and size: the median per-chunk server CPU of the first and the last
`--window` chunks, their ratio (flat = 1.0x), and the reconstructed tool call's name and
argument length (a sanity check; exact parity is what the parity tests and
`tests.parity.compare_parsers` check).
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks import derender_bench as db
from benchmarks import parsers_bench as pb
from benchmarks._common import Server, free_port, start_render_service


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, required=True, help="folder with llama3/ llama4/ granite/ nemotron/")
    ap.add_argument("--family", action="append", choices=sorted(pb.FAMILIES))
    ap.add_argument("--sizes", default="2000,4000")
    ap.add_argument("--window", type=int, default=100, help="chunks in the start / end medians")
    ap.add_argument("--mode", default="compact", choices=("compact", "full"))
    ap.add_argument("--redis", action="store_true", help="two replicas sharing a redis-server, chunks alternating")
    args = ap.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",")]
    where = ", two replicas over Redis" if args.redis else ""
    print(
        f"family           tokens  start us/chunk  end us/chunk  end/start  tool call ({args.mode} mode, HTTP{where})"
    )
    with tempfile.TemporaryDirectory() as logs:
        redis = db.start_redis(free_port(), Path(logs) / "redis.log") if args.redis else None
        try:
            for name in args.family or list(pb.FAMILIES):
                _family(args, name, sizes, Path(logs), redis)
        finally:
            if redis is not None:
                redis.stop()
    return 0


def _family(args: argparse.Namespace, name: str, sizes: list[int], logs: Path, redis: Server | None) -> None:
    from transformers import AutoTokenizer

    model, reasoning, tool, eos_name = pb.FAMILIES[name]
    model_dir = args.models / model
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    eos_id = tok.convert_tokens_to_ids(eos_name)
    flags = ["--served-model-name", db.MODEL_NAME, "--stream-state-mode", args.mode, *db.ours_default_args()]
    if reasoning:
        flags += ["--reasoning-parser", reasoning]
    if tool:
        flags += ["--tool-call-parser", tool, "--enable-auto-tool-choice"]
    if redis is not None:
        flags += ["--redis-url", redis.url, "--snapshot-key", secrets.token_hex(32)]
    servers: list[Server] = [
        start_render_service(str(model_dir), free_port(), flags, log=logs / f"{name}-{i}.log", timeout=300)
        for i in range(2 if redis is not None else 1)
    ]
    target = db.Target(
        args.mode + ("-redis" if redis is not None else ""), servers, compact=args.mode == "compact", redis=redis
    )
    try:
        target.open()
        request = {"model": db.MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "tools": pb.TOOLS}
        prompt = tok.encode("hi", add_special_tokens=False)
        for n in sizes:
            ids = [*pb.output_ids(name, tok, n), eos_id]
            output = db.Output(ids, "", "", "", "", {})
            run = db.run_stream(target, output, prompt, request, size=n, repeat=0)
            per_chunk = [run.chunk_cpu_ns[i] / 1e3 for i in range(len(ids))]
            start = statistics.median(per_chunk[: args.window])
            end = statistics.median(per_chunk[-args.window :])
            calls = (run.summary or {}).get("tool_calls") or []
            shown = json.dumps([(c[1], len(c[2])) for c in calls])
            print(
                f"{name:<16} {len(ids):>6}  {start:>14.1f}  {end:>12.1f}  {end / start:>8.2f}x  {shown}",
                flush=True,
            )
    finally:
        target.close()
        for server in servers:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
