#!/usr/bin/env python3
"""Streaming derender without HTTP: where one chunk's CPU goes, `full` vs `compact` mode, at depth.

In this process, on derender_bench's workload (the same chat request and N-token output, one
token per chunk, the client echoing `stream_state`; `full` resends `prompt_token_ids` and
`chat_request` on every chunk, `compact` on the first only): a stream is driven to token
`--depth`, then the next `--window` chunks are timed phase by phase (`time.process_time` over
many repetitions of each chunk, so the snapshot store sees the same retried chunk, as with a
client retry): the body's JSON decode, our handler, and the JSON encode of the answer; also
the first chunks of the stream for the start-vs-depth ratio. The handler is the /derender
route's, given the body's bytes: in `full` mode an echo that is byte for byte what the service
sent is not decoded (`derender/echo.py`), so `decode` is then the body minus the echo (and minus
the resent prompt ids and chat request when they are the bytes kept for the stream). With
`--profile`, a cProfile of the handler at depth (tottime; cProfile inflates Python-heavy code,
read it for the split).

    python3 -m benchmarks.derender_split [--depth 4000] [--window 20] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request

from benchmarks import derender_bench as bench
from benchmarks._common import example_model_dir
from render_service import cli
from render_service.derender import echo
from render_service.model.loader import load_model
from render_service.render import pipeline as render
from render_service.server.app import create_app
from render_service.server.handlers.derender import chat_derender


class Mode:
    """One service configuration (`full` or `compact`) and a stream driven through it."""

    def __init__(self, name: str, model_dir: str, model: Any) -> None:
        argv = ["serve", model_dir, *bench.DEFAULT_SERVER_ARGS.split(), "--stream-state-mode", name]
        settings = cli.settings_from_args(cli._parser().parse_args(argv))
        state = create_app(settings, model).state.render
        state.load()
        self.state = state
        self.request = Request({"type": "http", "method": "POST", "path": "/", "headers": []})
        self.name = name
        self.compact = name == "compact"
        self.render_context = state.context
        self.context = state.derender
        self.loop = asyncio.new_event_loop()

    def body(self, chunk: dict[str, Any], state: dict[str, Any] | None, prompt: list[int], request: Any) -> bytes:
        body: dict[str, Any] = {
            "stream": True,
            "model": bench.MODEL_NAME,
            "generate_chunk": chunk,
            "stream_state": state,
        }
        if not (self.compact and state is not None):
            body["prompt_token_ids"] = prompt
            body["chat_request"] = request
        return orjson.dumps(body)

    def handle(self, raw: bytes) -> dict[str, Any]:
        """What the /derender route does with the body's bytes: read, vouch, validate, derender."""
        return self.loop.run_until_complete(chat_derender.handler(self.state, self.request, raw))

    def decode(self, raw: bytes) -> Any:
        """The body read as the route reads it: without the echo when it can be (full mode)."""
        split = echo.split_body(raw, self.context.sent) if self.context.reads_raw_echo else None
        return split if split is not None else orjson.loads(raw)


def timed(function: Callable[[], Any], repeats: int) -> float:
    """CPU ms per call, the best of three batches of `repeats` (the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(repeats):
            function()
        best = min(best, (time.process_time() - started) / repeats * 1000)
    return best


def measure(mode: Mode, output: list[int], prompt: list[int], request: Any, depth: int, window: int, repeats: int):
    """Drive the stream to `depth + window`, timing chunks [1, 1 + window) and [depth, depth + window)."""
    phases: dict[str, dict[str, list[float]]] = {"start": {}, "depth": {}}
    state: dict[str, Any] | None = None
    request_id = "generate-tokens-chatcmpl-split"
    for index in range(depth + window):
        chunk = bench._chunk_body(request_id, output[index], None, None)
        raw = mode.body(chunk, state, prompt, request)
        where = "start" if 1 <= index < 1 + window else "depth" if index >= depth else None
        if where is not None:
            answer = mode.handle(raw)
            split = phases[where]
            split.setdefault("decode", []).append(timed(lambda raw=raw: mode.decode(raw), repeats))
            both = timed(lambda raw=raw: mode.handle(raw), repeats)
            split.setdefault("handler", []).append(max(0.0, both - split["decode"][-1]))
            split.setdefault("encode", []).append(timed(lambda answer=answer: orjson.dumps(answer), repeats))
            split.setdefault("bytes in", []).append(len(raw))
        else:
            answer = mode.handle(raw)
        state = orjson.loads(orjson.dumps(answer["stream_state"]))  # as a client reads it
    return {where: {k: sorted(v)[len(v) // 2] for k, v in split.items()} for where, split in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", help="model folder (default: the tiny Qwen3 example model, built into a temp folder)"
    )
    parser.add_argument("--depth", type=int, default=4000, help="position of the timed chunks (default: %(default)s)")
    parser.add_argument("--window", type=int, default=20, help="chunks timed at the start and at depth")
    parser.add_argument("--repeats", type=int, default=20, help="repetitions of each timed chunk per batch")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of each mode's handler at depth")
    args = parser.parse_args()
    args.model = example_model_dir(args.model)

    base_argv = ["serve", args.model, *bench.DEFAULT_SERVER_ARGS.split()]
    model = load_model(cli.settings_from_args(cli._parser().parse_args(base_argv)))
    modes = [Mode("full", args.model, model), Mode("compact", args.model, model)]
    request = bench.chat_request(0)
    prompt = render.render_chat(modes[0].render_context, dict(request), None)["token_ids"]
    output = bench.OutputBuilder(args.model).build(max(args.depth + args.window + 8, 400), 0).token_ids

    results = {m.name: measure(m, output, prompt, request, args.depth, args.window, args.repeats) for m in modes}
    print(f"per-chunk CPU ms (median of {args.window} chunks; prompt {len(prompt)} tokens)")
    print(f"{'mode':<9}{'where':<12}{'decode':>9}{'handler':>9}{'encode':>9}{'total':>9}{'KB in':>8}")
    totals = {}
    for name, result in results.items():
        for where, split in result.items():
            total = split["decode"] + split["handler"] + split["encode"]
            totals[name, where] = total
            label = "start" if where == "start" else f"@{args.depth}"
            print(
                f"{name:<9}{label:<12}{split['decode']:>9.3f}{split['handler']:>9.3f}{split['encode']:>9.3f}"
                f"{total:>9.3f}{split['bytes in'] / 1024:>8.1f}"
            )
    at = ("full", "depth"), ("compact", "depth")
    print(f"full/compact at token {args.depth}: {totals[at[0]] / totals[at[1]]:.2f}x (decode+handler+encode)")
    for name in ("full", "compact"):
        print(f"{name}: depth/start {totals[name, 'depth'] / totals[name, 'start']:.2f}x")

    if args.profile:
        for mode in modes:
            state = None
            for index in range(args.depth):
                chunk = bench._chunk_body("generate-tokens-chatcmpl-prof", output[index], None, None)
                answer = mode.handle(mode.body(chunk, state, prompt, request))
                state = orjson.loads(orjson.dumps(answer["stream_state"]))
            chunk = bench._chunk_body("generate-tokens-chatcmpl-prof", output[args.depth], None, None)
            raw = mode.body(chunk, state, prompt, request)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(300):
                mode.handle(raw)
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
            print(f"== {mode.name} at token {args.depth}\n{out.getvalue()}")


if __name__ == "__main__":
    main()
