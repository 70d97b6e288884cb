"""What gateway mode adds to a streamed request: TTFT, inter-token latency and CPU per output token
of `render-service serve --engine URL` in front of an engine, against calling the engine directly.

Both paths stream the same chat request's tokens from the same engine, side by side, in
alternating rounds at the same concurrency:

- direct: the client posts the rendered `GenerateRequest` (rendered once, up front) to the
  engine's `/inference/v1/generate` and reads its token chunks;
- gateway: the client posts the chat request to the gateway's `/v1/chat/completions`, which
  renders, calls the engine and derenders each chunk into OpenAI SSE.

TTFT is measured by the client to the first `data:` event; the gateway's added TTFT is the
difference of the two paths' percentiles. CPU per output token is the gateway process tree's
CPU (utime+stime from /proc) over its rounds, less its idle CPU over the same time, divided by
the output tokens it streamed (render and derender included); the engine's own CPU per token is
shown for scale.

The engine is the scripted fake engine of tests/gateway (vLLM 0.33's generate protocol, a token
every --itl-ms), started as a child process, unless --engine-url names a real `--tokens-only`
engine (then --model must be the engine's model). Run from the repository root:

    python -m benchmarks.gateway_bench --requests 200 --concurrency 8 --tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import (
    Server,
    example_model_dir,
    fmt,
    format_table,
    free_port,
    percentile,
    start_render_service,
    wait_healthy,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog while the band plays on, and every listener in the "
    "square keeps time with a tapping foot. "
)


# -- the fake engine (a child process) ---------------------------------------------------------


def serve_fake_engine(port: int, token_ids: list[int], interval: float) -> None:
    """Serve the scripted engine on `port` until killed (the child process's whole job)."""
    import uvicorn

    from tests.gateway.scripted_engine import Script, ScriptedEngine

    engine = ScriptedEngine(Script(token_ids, chunk_size=1, interval=interval))
    uvicorn.run(engine.app(), host="127.0.0.1", port=port, log_level="warning")


def start_fake_engine(model_dir: str, tokens: int, interval: float, log: Path) -> Server:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    ids = tokenizer.encode(TEXT * (1 + tokens // 20), add_special_tokens=False).ids[: tokens - 1]
    eos = tokenizer.token_to_id("<|im_end|>")
    port = free_port()
    token_ids = json.dumps([*ids, eos])
    command = [sys.executable, "-m", "benchmarks.gateway_bench", "--fake-engine", str(port), token_ids, str(interval)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server("fake-engine", f"http://127.0.0.1:{port}", process.pid, owned=True, log=log)
    try:
        wait_healthy(server.url, 60, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


# -- one streamed request ----------------------------------------------------------------------


async def stream_once(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, list[float], int]:
    """(TTFT, the gaps between later events, output tokens) of one streamed request."""
    start = time.perf_counter()
    ttft = 0.0
    gaps: list[float] = []
    tokens = 0
    last = start
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            if not ttft:
                ttft = now - start
            else:
                gaps.append(now - last)
            last = now
            event = json.loads(line[5:])
            for choice in event.get("choices") or []:
                ids = choice.get("token_ids")
                tokens += len(ids) if ids is not None else (1 if choice.get("delta", {}).get("content") else 0)
    return ttft, gaps, tokens


async def run_round(url: str, body: dict[str, Any], requests: int, concurrency: int) -> dict[str, Any]:
    ttfts: list[float] = []
    gaps: list[float] = []
    tokens = 0
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def worker() -> None:
            nonlocal tokens
            while queue:
                queue.pop()
                ttft, request_gaps, request_tokens = await stream_once(client, url, body)
                ttfts.append(ttft)
                gaps.extend(request_gaps)
                tokens += request_tokens

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"ttfts": ttfts, "gaps": gaps, "tokens": tokens}


# -- the benchmark -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--engine-url", help="a real --tokens-only engine instead of the fake one")
    parser.add_argument("--requests", type=int, default=200, help="streamed requests per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per path")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request (fake engine)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="how long the gateway's idle CPU is sampled")
    parser.add_argument(
        "--itl-ms", type=float, default=20.0, help="the fake engine's time between tokens (a decode step)"
    )
    parser.add_argument("--fake-engine", nargs=3, metavar=("PORT", "TOKENS", "INTERVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake_engine:
        serve_fake_engine(int(args.fake_engine[0]), json.loads(args.fake_engine[1]), float(args.fake_engine[2]))
        return 0

    model_dir = example_model_dir(args.model)
    scratch = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    engine = (
        Server("engine", args.engine_url.rstrip("/"), None)
        if args.engine_url
        else start_fake_engine(model_dir, args.tokens, args.itl_ms / 1000, scratch / "engine.log")
    )
    gateway = None
    try:
        gateway = start_render_service(
            model_dir, free_port(), ["--engine", engine.url, "--workers", "1"], log=scratch / "gateway.log"
        )
        served = httpx.get(f"{gateway.url}/v1/models").json()["data"][0]["id"]
        chat = {
            "model": served,
            "messages": [{"role": "user", "content": "Tell me about the fox."}],
            "max_tokens": args.tokens,
            "temperature": 0,
            "stream": True,
        }
        rendered = httpx.post(f"{gateway.url}/v1/chat/completions/render", json=chat).json()
        paths = {
            "direct": (f"{engine.url}/inference/v1/generate", rendered),
            "gateway": (f"{gateway.url}/v1/chat/completions", chat),
        }
        for url, body in paths.values():  # warm both paths (connections, caches)
            asyncio.run(run_round(url, body, args.concurrency * 2, args.concurrency))
        # The gateway's CPU when idle (its event-loop lag probe, engine health probes), subtracted below.
        idle_start, idle_cpu = time.perf_counter(), gateway.cpu_seconds() or 0.0
        time.sleep(args.idle_seconds)
        idle_rate = ((gateway.cpu_seconds() or 0.0) - idle_cpu) / (time.perf_counter() - idle_start)
        results: dict[str, dict[str, Any]] = {
            name: {"ttfts": [], "gaps": [], "tokens": 0, "gateway_cpu": 0.0, "engine_cpu": 0.0, "seconds": 0.0}
            for name in paths
        }
        for _ in range(args.rounds):
            for name, (url, body) in paths.items():
                gateway_cpu, engine_cpu = gateway.cpu_seconds() or 0.0, engine.cpu_seconds() or 0.0
                started = time.perf_counter()
                round_result = asyncio.run(run_round(url, body, args.requests, args.concurrency))
                results[name]["seconds"] += time.perf_counter() - started
                into = results[name]
                into["ttfts"] += round_result["ttfts"]
                into["gaps"] += round_result["gaps"]
                into["tokens"] += round_result["tokens"]
                into["gateway_cpu"] += (gateway.cpu_seconds() or 0.0) - gateway_cpu
                into["engine_cpu"] += (engine.cpu_seconds() or 0.0) - engine_cpu
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()

    def ms(values: list[float], q: float) -> float:
        return percentile(values, q) * 1000

    rows = []
    for r in results.values():
        r["gateway_cpu"] = max(0.0, r["gateway_cpu"] - idle_rate * r["seconds"])
    for name, r in results.items():
        per_token = r["gateway_cpu"] / r["tokens"] * 1e6 if r["tokens"] else None
        engine_per_token = r["engine_cpu"] / r["tokens"] * 1e6 if r["tokens"] and engine.pid else None
        rows.append(
            [
                name,
                str(len(r["ttfts"])),
                str(r["tokens"]),
                fmt(ms(r["ttfts"], 50)),
                fmt(ms(r["ttfts"], 99)),
                fmt(ms(r["gaps"], 50), 3),
                fmt(ms(r["gaps"], 99), 3),
                fmt(per_token, 1),
                fmt(engine_per_token, 1),
            ]
        )
    direct, through = results["direct"], results["gateway"]
    added = {
        "ttft_p50_ms": ms(through["ttfts"], 50) - ms(direct["ttfts"], 50),
        "ttft_p99_ms": ms(through["ttfts"], 99) - ms(direct["ttfts"], 99),
        "itl_p50_ms": ms(through["gaps"], 50) - ms(direct["gaps"], 50),
        "itl_p99_ms": ms(through["gaps"], 99) - ms(direct["gaps"], 99),
        "gateway_cpu_us_per_token": through["gateway_cpu"] / through["tokens"] * 1e6 if through["tokens"] else None,
    }
    headers = ["path", "requests", "tokens", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "gw CPU/tok", "eng CPU/tok"]
    title = (
        f"{'fake' if engine.pid and not args.engine_url else 'real'} engine, {args.concurrency} concurrent, "
        f"{args.tokens} tokens per request, {args.itl_ms:g} ms between tokens (ms; CPU in us per output token)"
    )
    print(format_table(headers, rows, title))
    print(
        f"\ngateway adds: TTFT p50 {added['ttft_p50_ms']:.2f} ms, p99 {added['ttft_p99_ms']:.2f} ms; "
        f"inter-token p50 {added['itl_p50_ms']:.3f} ms, p99 {added['itl_p99_ms']:.3f} ms; "
        f"{fmt(added['gateway_cpu_us_per_token'], 1)} us of gateway CPU per output token "
        f"(its idle CPU, {idle_rate * 100:.2f}% of a core, subtracted)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"added": added, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
