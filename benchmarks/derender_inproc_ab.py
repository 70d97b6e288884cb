#!/usr/bin/env python3
"""One streamed derender chunk at depth, in process (no HTTP), this tree against another checkout,
both modes, side by side.

For a change to the handler's fixed per-chunk cost: derender_depth_ab times the same chunk over
HTTP, where the server's HTTP layer and the socket are most of the CPU on a busy machine, so a
handler change shows there diluted and noisy. Here one worker process per tree (`--baseline DIR`
first on its path, this tree on the other's) drives derender_split's workload (the llm-d-style
client: `full` echoes `stream_state` and resends `prompt_token_ids` and `chat_request`,
`compact` sends the handle) to token `--depth` in both modes, then, round by round and
alternating which tree goes first, re-sends that chunk `--requests` times through the /derender
route's handler (given the body's bytes, as the route is) and encodes the answer: CPU ms per
chunk (process time) per round, the medians, and new/old per mode from the same rounds.

    git archive REV | tar -x -C BASE_DIR
    python3 -m benchmarks.derender_inproc_ab --baseline BASE_DIR [--depth 2000] [--requests 400] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("full", "compact")


def worker(depth: int, model_dir: str | None) -> None:
    """Drive both modes to `depth`, then time the chunk there on request (`MODE N` per stdin line)."""
    import orjson

    from benchmarks import derender_bench as bench
    from benchmarks import derender_split as split
    from benchmarks._common import example_model_dir
    from render_service import cli
    from render_service.model.loader import load_model
    from render_service.render import pipeline as render

    model_dir = example_model_dir(model_dir)
    argv = ["serve", model_dir, *bench.DEFAULT_SERVER_ARGS.split()]
    model = load_model(cli.settings_from_args(cli._parser().parse_args(argv)))
    modes = {name: split.Mode(name, model_dir, model) for name in MODES}
    request = bench.chat_request(0)
    prompt = render.render_chat(modes["full"].render_context, dict(request), None)["token_ids"]
    output = bench.OutputBuilder(model_dir).build(max(depth + 8, 400), 0).token_ids
    bodies: dict[str, bytes] = {}
    for name, mode in modes.items():
        state: Any = None
        for index in range(depth):
            chunk = bench._chunk_body("generate-tokens-chatcmpl-inproc", output[index], None, None)
            answer = mode.handle(mode.body(chunk, state, prompt, request))
            state = orjson.loads(orjson.dumps(answer["stream_state"]))  # as a client reads it
        chunk = bench._chunk_body("generate-tokens-chatcmpl-inproc", output[depth], None, None)
        bodies[name] = mode.body(chunk, state, prompt, request)
        orjson.dumps(modes[name].handle(bodies[name]))  # the snapshot the retries resume from
    print("ready", flush=True)
    for line in sys.stdin:
        name, count = line.split()
        mode, body = modes[name], bodies[name]
        started = time.process_time()
        for _ in range(int(count)):
            orjson.dumps(mode.handle(body))
        print((time.process_time() - started) / int(count) * 1000, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="another checkout of the repository (the old code)")
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--depth", type=int, default=2000, help="output tokens before the timed chunk")
    parser.add_argument("--requests", type=int, default=400, help="timed chunks per mode, tree and round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, the trees alternating")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.depth, args.model)
        return
    trees = {"old": Path(args.baseline).resolve(), "new": Path(__file__).resolve().parent.parent}
    procs = {}
    for name, tree in trees.items():
        # This file run as a script: its imports (`benchmarks`, `render_service`) come from `tree`.
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--baseline", "-"]
        command += ["--depth", str(args.depth), *(["--model", args.model] if args.model else [])]
        env = dict(os.environ, PYTHONPATH=str(tree))
        procs[name] = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    for name, proc in procs.items():
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"ABORT: the {name} worker did not start (run it with --worker to see why)")
    per_round: dict[tuple[str, str], list[float]] = {(tree, mode): [] for tree in trees for mode in MODES}
    for round_index in range(args.rounds):
        order = list(trees) if round_index % 2 == 0 else list(trees)[::-1]
        for mode in MODES:
            for tree in order:
                proc = procs[tree]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{mode} {args.requests}\n")
                proc.stdin.flush()
                per_round[tree, mode].append(float(proc.stdout.readline()))
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(f"CPU ms per chunk at token {args.depth}, in process (handler + answer encode), per round")
    for mode in MODES:
        for tree in trees:
            values = per_round[tree, mode]
            shown = " ".join(f"{v:.3f}" for v in values)
            print(f"{mode:<8} {tree:<4} {shown}  median {statistics.median(values):.3f}")
        ratios = [a / b for a, b in zip(per_round["new", mode], per_round["old", mode], strict=True)]
        print(
            f"{mode:<8} new/old per round {' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.3f}x"
        )
    for tree in trees:
        ratios = [a / b for a, b in zip(per_round[tree, "full"], per_round[tree, "compact"], strict=True)]
        print(f"{tree} full/compact median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
