#!/usr/bin/env python3
"""Ours vs the floor server without HTTP: where render-service's handler spends more CPU.

In this process, on render_bench's payloads: render-service's chat-render handler work
(`render.render_chat` + `orjson.dumps` of its result) against the floor server's
(orjson decode, tool-call arguments parsed, the same minijinja `FastTemplate`, the same encoder,
orjson encode of a response of the same shape), CPU ms per request (`time.process_time`);
with `--profile`, a cProfile of ours (tottime; cProfile roughly doubles Python-heavy code, so
read it for the split, not the totals).

    python3 -m benchmarks.handler_split [--scenarios short,long9k,agent] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks import render_bench
from benchmarks._common import example_model_dir
from render_service import cli
from render_service.model.loader import load_model
from render_service.render import pipeline as render
from render_service.render.templating import FastTemplate
from render_service.server.app import create_app


def per_call_ms(function: Callable[[bytes], Any], bodies: list[bytes], seconds: float) -> float:
    for body in bodies:  # warm: template compiled, segment cache filled, as in a server
        function(body)
    calls = 0
    started = time.process_time()
    while time.process_time() - started < seconds:
        for body in bodies:
            function(body)
        calls += len(bodies)
    return (time.process_time() - started) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", help="model folder (default: the tiny Qwen3 example model, built into a temp folder)"
    )
    parser.add_argument("--scenarios", default="short,long9k,agent")
    parser.add_argument("--seconds", type=float, default=1.5, help="CPU seconds per measurement")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of ours per scenario")
    args = parser.parse_args()
    args.model = example_model_dir(args.model)

    settings = cli.settings_from_args(
        cli._parser().parse_args(["serve", args.model, *render_bench.DEFAULT_SERVER_ARGS.split()])
    )
    model = load_model(settings)
    state = create_app(settings, model).state.render
    state.load()
    context = state.context
    config = json.loads((Path(args.model) / "tokenizer_config.json").read_text())
    specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if config.get(k)}
    template = FastTemplate(config["chat_template"], specials)
    backend = model.backend

    def floor(body: bytes) -> bytes:  # floor_server.py's handler, minus HTTP
        request = orjson.loads(body)
        for message in request["messages"]:
            for call in message.get("tool_calls") or ():
                if isinstance(call["function"].get("arguments"), str):
                    call["function"]["arguments"] = orjson.loads(call["function"]["arguments"])
        text = template.render(request["messages"], request.get("tools"), {"add_generation_prompt": True})
        ids = backend.encode(text)
        return orjson.dumps(
            {
                "token_ids": ids,
                "sampling_params": {"max_tokens": 16384 - len(ids)},
                "parse_context": {"tools": request.get("tools")},
            }
        )

    def ours(body: bytes) -> bytes:
        return orjson.dumps(render.render_chat(context, orjson.loads(body), None))

    print(f"{'scenario':<8}{'floor ms':>10}{'ours ms':>10}{'ours - floor':>14}{'ours/floor':>12}")
    for name in args.scenarios.split(","):
        bodies = render_bench.build_workload(render_bench.SCENARIOS[name], 0, 8).bodies
        floor_ms = per_call_ms(floor, bodies, args.seconds)
        ours_ms = per_call_ms(ours, bodies, args.seconds)
        print(
            f"{name:<8}{floor_ms:>10.3f}{ours_ms:>10.3f}{ours_ms - floor_ms:>14.3f}{ours_ms / floor_ms:>11.2f}x",
            flush=True,
        )
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(50):
                for body in bodies:
                    ours(body)
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(20)
            print(out.getvalue())


if __name__ == "__main__":
    main()
