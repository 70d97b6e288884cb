#!/usr/bin/env python3
"""One streamed derender chunk at depth, `full` vs `compact` mode, over HTTP, side by side.

derender_bench times whole streams one after the other, so on a shared machine its end-window
ratio moves with whatever else runs meanwhile. This starts one server per mode (`--workers 1`),
drives derender_bench's workload to token `--depth` in each (the llm-d-style client: orjson,
`stream_state` echoed), then re-sends that chunk (a retry: the snapshot stays) `--requests` times
per round, alternating the modes round by round, and prints the server CPU per chunk
(/proc schedstat of the process tree) per round, the medians and full/compact.

    python3 -m benchmarks.derender_depth_ab [--depth 4000] [--requests 300] [--rounds 6]

`--baseline DIR` also starts both modes from another checkout of the repository (e.g. the
commit before a change, `git archive REV | tar -x -C DIR`), so old and new code are timed in
the same rounds: every server's chunk, then the ratios new/old per mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import httpx
import orjson

from benchmarks import derender_bench as bench
from benchmarks._common import example_model_dir, free_port, start_render_service

MODES = ("full", "compact")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--depth", type=int, default=4000, help="output tokens before the timed chunk")
    parser.add_argument("--requests", type=int, default=300, help="timed chunks per mode and round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, the modes alternating")
    parser.add_argument("--baseline", help="another checkout whose servers run in the same rounds (`MODE@base`)")
    args = parser.parse_args()
    model = example_model_dir(args.model)
    logs = Path(tempfile.mkdtemp(prefix="derender-ab-"))
    servers = {}
    names = [*MODES, *(f"{mode}@base" for mode in MODES)] if args.baseline else list(MODES)
    try:
        for name in names:
            mode, _, tree = name.partition("@")
            flags = [*bench.DEFAULT_SERVER_ARGS.split(), "--stream-state-mode", mode, "--workers", "1"]
            saved = os.environ.get("PYTHONPATH")
            if tree:  # the baseline's package first on the server's path
                os.environ["PYTHONPATH"] = str(Path(args.baseline).resolve())
            try:
                servers[name] = start_render_service(model, free_port(), flags, log=logs / f"{name}.log")
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        clients = {mode: httpx.Client(base_url=s.url, trust_env=False, timeout=60) for mode, s in servers.items()}
        request = bench.chat_request(0)
        rendered = clients["full"].post(bench.RENDER_PATH, content=orjson.dumps(request), headers=bench.HEADERS)
        prompt = orjson.loads(rendered.content)["token_ids"]
        output = bench.OutputBuilder(model).build(args.depth + 8, 0).token_ids
        payloads = {}
        for name, client in clients.items():
            mode = name.partition("@")[0]
            state = None
            for index in range(args.depth + 1):
                chunk = bench._chunk_body("generate-tokens-chatcmpl-ab", output[index], None, None)
                body = {"stream": True, "model": bench.MODEL_NAME, "generate_chunk": chunk, "stream_state": state}
                if not (mode == "compact" and state is not None):
                    body["prompt_token_ids"] = prompt
                    body["chat_request"] = request
                payload = orjson.dumps(body)
                response = client.post(bench.DERENDER_PATH, content=payload, headers=bench.HEADERS)
                if response.status_code != 200:
                    raise SystemExit(f"ABORT: {name} answered {response.status_code}: {response.text[:300]}")
                payloads[name] = payload
                state = orjson.loads(response.content)["stream_state"]
            print(f"{name}: chunk at token {args.depth}: {len(payloads[name])} bytes in, {len(response.content)} out")
        cpus = {name: bench.TreeCpu([server.pid]) for name, server in servers.items() if server.pid is not None}
        per_round: dict[str, list[float]] = {name: [] for name in names}
        for round_index in range(args.rounds):
            shift = round_index % len(names)  # each server first in turn
            for name in (names[shift:] + names[:shift])[:: 1 if round_index % 2 == 0 else -1]:
                before = cpus[name].ns()
                for _ in range(args.requests):
                    response = clients[name].post(bench.DERENDER_PATH, content=payloads[name], headers=bench.HEADERS)
                    if response.status_code != 200:
                        raise SystemExit(f"ABORT: {name} answered {response.status_code}: {response.text[:300]}")
                per_round[name].append((cpus[name].ns() - before) / args.requests / 1e6)
        for name, values in per_round.items():
            shown = " ".join(f"{v:.3f}" for v in values)
            print(f"{name:<13} server CPU ms/chunk per round: {shown}  median {statistics.median(values):.3f}")

        def compare(label: str, top: str, bottom: str) -> None:
            ratios = [a / b for a, b in zip(per_round[top], per_round[bottom], strict=True)]
            print(f"{label}: per round {' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.2f}x")

        compare(f"full/compact at token {args.depth}", "full", "compact")
        if args.baseline:
            compare(f"baseline full/compact at token {args.depth}", "full@base", "compact@base")
            for mode in MODES:
                compare(f"{mode} new/baseline", mode, f"{mode}@base")
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
