#!/usr/bin/env python3
"""One streamed derender chunk at depth, `full` vs `compact` mode, over HTTP, side by side.

derender_bench times whole streams one after the other, so on a shared machine its end-window
ratio moves with whatever else runs meanwhile. This starts one server per mode (`--workers 1`),
drives derender_bench's workload to token `--depth` in each (the llm-d-style client: orjson,
`stream_state` echoed), then re-sends that chunk (a retry: the snapshot stays) `--requests` times
per round, alternating the modes round by round, and prints the server CPU per chunk
(/proc schedstat of the process tree) per round, the medians and full/compact.

    python3 -m benchmarks.derender_depth_ab [--depth 4000] [--requests 300] [--rounds 6]
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    model = example_model_dir(args.model)
    logs = Path(tempfile.mkdtemp(prefix="derender-ab-"))
    servers = {}
    try:
        for mode in MODES:
            flags = [*bench.DEFAULT_SERVER_ARGS.split(), "--stream-state-mode", mode, "--workers", "1"]
            servers[mode] = start_render_service(model, free_port(), flags, log=logs / f"{mode}.log")
        clients = {mode: httpx.Client(base_url=s.url, trust_env=False, timeout=60) for mode, s in servers.items()}
        request = bench.chat_request(0)
        rendered = clients["full"].post(bench.RENDER_PATH, content=orjson.dumps(request), headers=bench.HEADERS)
        prompt = orjson.loads(rendered.content)["token_ids"]
        output = bench.OutputBuilder(model).build(args.depth + 8, 0).token_ids
        payloads = {}
        for mode, client in clients.items():
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
                    raise SystemExit(f"ABORT: {mode} answered {response.status_code}: {response.text[:300]}")
                payloads[mode] = payload
                state = orjson.loads(response.content)["stream_state"]
            print(f"{mode}: chunk at token {args.depth}: {len(payloads[mode])} bytes in, {len(response.content)} out")
        cpus = {mode: bench.TreeCpu([server.pid]) for mode, server in servers.items() if server.pid is not None}
        per_round: dict[str, list[float]] = {mode: [] for mode in MODES}
        for round_index in range(args.rounds):
            for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
                before = cpus[mode].ns()
                for _ in range(args.requests):
                    response = clients[mode].post(bench.DERENDER_PATH, content=payloads[mode], headers=bench.HEADERS)
                    if response.status_code != 200:
                        raise SystemExit(f"ABORT: {mode} answered {response.status_code}: {response.text[:300]}")
                per_round[mode].append((cpus[mode].ns() - before) / args.requests / 1e6)
        for mode, values in per_round.items():
            shown = " ".join(f"{v:.3f}" for v in values)
            print(f"{mode:<8} server CPU ms/chunk per round: {shown}  median {statistics.median(values):.3f}")
        ratios = [f / c for f, c in zip(per_round["full"], per_round["compact"], strict=True)]
        print(
            f"full/compact at token {args.depth}: per round {' '.join(f'{r:.2f}' for r in ratios)}, "
            f"median {statistics.median(ratios):.2f}x"
        )
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
