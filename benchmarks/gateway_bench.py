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
engine (then --model must be the engine's model), or --vllm-engine starts a real vLLM CPU engine
with its tokenizer (VLLM_ENGINE_PYTHON, the tiny random-weight Qwen3 of the live tests): then a
third path, `vllm`, sends the chat request to that engine's own /v1/chat/completions (`vllm
serve` on the same engine settings), and the engine's API server process is measured alone for
its CPU per output token. The gateway's own share of TTFT comes from its
`render_gateway_added_latency_seconds` histogram (to_engine: arrival to the generate request
written; to_client: the engine's first chunk to its SSE bytes). Run from the repository root:

    python -m benchmarks.gateway_bench --requests 200 --concurrency 8 --tokens 64
    VLLM_ENGINE_PYTHON=.../bin/python python -m benchmarks.gateway_bench --vllm-engine --concurrency 4 --tokens 32
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
    CLK_TCK,
    Server,
    _stat_fields,
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


# -- the benchmark ---------------------------------------------------------------------------


def own_cpu_seconds(pid: int) -> float:
    """utime+stime of `pid` alone (all its threads, none of its children): vLLM's API server
    without its engine-core child."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


Histogram = dict[str, tuple[dict[float, float], float, float]]  # phase -> (cumulative buckets, sum, count)


def added_latency_histogram(metrics_text: str) -> Histogram:
    """The gateway's `render_gateway_added_latency_seconds` series for chat completions, by phase."""
    out: Histogram = {}
    for phase in ("to_engine", "to_client"):
        buckets: dict[float, float] = {}
        total = count = 0.0
        for line in metrics_text.splitlines():
            if not line.startswith("render_gateway_added_latency_seconds") or f'phase="{phase}"' not in line:
                continue
            if 'endpoint="chat_completions"' not in line:
                continue
            name, value = line.rsplit(" ", 1)
            if name.startswith("render_gateway_added_latency_seconds_bucket"):
                bound = name.split('le="')[1].split('"')[0]
                buckets[float("inf") if bound == "+Inf" else float(bound)] = float(value)
            elif name.startswith("render_gateway_added_latency_seconds_sum"):
                total = float(value)
            elif name.startswith("render_gateway_added_latency_seconds_count"):
                count = float(value)
        out[phase] = (buckets, total, count)
    return out


def added_latency(before: Histogram, after: Histogram) -> dict[str, dict[str, float]]:
    """The gateway's own share of TTFT over the measured rounds: per phase, the mean and the p50
    read from the histogram's buckets (linear within the bucket)."""
    out: dict[str, dict[str, float]] = {}
    for phase, (buckets, total, count) in after.items():
        old_buckets, old_total, old_count = before.get(phase, ({}, 0.0, 0.0))
        count -= old_count
        if count <= 0:
            continue
        p50, below, low = float("nan"), 0.0, 0.0
        for bound in sorted(buckets):
            cumulative = buckets[bound] - old_buckets.get(bound, 0.0)
            if cumulative >= count / 2:
                p50 = low + (bound - low) * (count / 2 - below) / max(cumulative - below, 1.0)
                break
            below, low = cumulative, bound
        out[phase] = {"mean_ms": (total - old_total) / count * 1000, "p50_ms": p50 * 1000, "count": count}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the tiny Qwen3 example model)")
    parser.add_argument("--engine-url", help="a real --tokens-only engine instead of the fake one")
    parser.add_argument(
        "--vllm-engine",
        action="store_true",
        help="start a real vLLM CPU engine with its tokenizer (VLLM_ENGINE_PYTHON; tiny random-weight Qwen3) and "
        "add a third path, `vllm serve`'s own /v1/chat/completions on that same engine",
    )
    parser.add_argument("--requests", type=int, default=200, help="streamed requests per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per path")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
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

    scratch = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    vllm_process = None
    if args.vllm_engine:
        from tests.integration.engine_fixture import build_weighted_model, start_engine

        model_dir = str(build_weighted_model())
        vllm_process = start_engine(model_dir, max_model_len=4096, tokens_only=False)
        engine = Server("vllm", vllm_process.url, vllm_process.process.pid)
    else:
        model_dir = example_model_dir(args.model)
        engine = (
            Server("engine", args.engine_url.rstrip("/"), None)
            if args.engine_url
            else start_fake_engine(model_dir, args.tokens, args.itl_ms / 1000, scratch / "engine.log")
        )
    gateway = None
    try:
        extra = ["--max-model-len", "4096", "--served-model-name", "tinyqwen3"] if args.vllm_engine else []
        gateway = start_render_service(
            model_dir, free_port(), ["--engine", engine.url, "--workers", "1", *extra], log=scratch / "gateway.log"
        )
        served = httpx.get(f"{gateway.url}/v1/models").json()["data"][0]["id"]
        chat: dict[str, Any] = {
            "model": served,
            "messages": [{"role": "user", "content": "Tell me about the fox."}],
            "max_tokens": args.tokens,
            "temperature": 0,
            "stream": True,
        }
        if args.vllm_engine or args.engine_url:
            chat.update(ignore_eos=True, return_token_ids=True)  # every request streams --tokens tokens
        rendered = httpx.post(f"{gateway.url}/v1/chat/completions/render", json=chat).json()
        paths = {
            "direct": (f"{engine.url}/inference/v1/generate", rendered),
            "gateway": (f"{gateway.url}/v1/chat/completions", chat),
        }
        if args.vllm_engine:
            paths["vllm"] = (f"{engine.url}/v1/chat/completions", chat)
        for url, body in paths.values():  # warm every path (connections, caches)
            asyncio.run(run_round(url, body, args.concurrency * 2, args.concurrency))
        metrics_before = added_latency_histogram(httpx.get(f"{gateway.url}/metrics").text)
        # The gateway's CPU when idle (its event-loop lag probe, engine health probes), subtracted below.
        idle_start, idle_cpu = time.perf_counter(), gateway.cpu_seconds() or 0.0
        time.sleep(args.idle_seconds)
        idle_rate = ((gateway.cpu_seconds() or 0.0) - idle_cpu) / (time.perf_counter() - idle_start)
        results: dict[str, dict[str, Any]] = {
            name: {"ttfts": [], "gaps": [], "tokens": 0, "gateway_cpu": 0.0, "api_cpu": 0.0, "engine_cpu": 0.0}
            | {"seconds": 0.0}
            for name in paths
        }
        for _ in range(args.rounds):
            for name, (url, body) in paths.items():
                gateway_cpu, engine_cpu = gateway.cpu_seconds() or 0.0, engine.cpu_seconds() or 0.0
                api_cpu = own_cpu_seconds(engine.pid) if engine.pid else 0.0
                started = time.perf_counter()
                round_result = asyncio.run(run_round(url, body, args.requests, args.concurrency))
                into = results[name]
                into["seconds"] += time.perf_counter() - started
                into["ttfts"] += round_result["ttfts"]
                into["gaps"] += round_result["gaps"]
                into["tokens"] += round_result["tokens"]
                into["gateway_cpu"] += (gateway.cpu_seconds() or 0.0) - gateway_cpu
                into["engine_cpu"] += (engine.cpu_seconds() or 0.0) - engine_cpu
                into["api_cpu"] += (own_cpu_seconds(engine.pid) if engine.pid else 0.0) - api_cpu
        own = added_latency(metrics_before, added_latency_histogram(httpx.get(f"{gateway.url}/metrics").text))
    finally:
        if gateway is not None:
            gateway.stop()
        if vllm_process is not None:
            vllm_process.stop()
        else:
            engine.stop()

    def ms(values: list[float], q: float) -> float:
        return percentile(values, q) * 1000

    def per_token(seconds: float, tokens: int) -> float | None:
        return seconds / tokens * 1e6 if tokens and engine.pid else None

    rows = []
    for r in results.values():
        r["gateway_cpu"] = max(0.0, r["gateway_cpu"] - idle_rate * r["seconds"])
    for name, r in results.items():
        rows.append(
            [
                name,
                str(len(r["ttfts"])),
                str(r["tokens"]),
                fmt(ms(r["ttfts"], 50)),
                fmt(ms(r["ttfts"], 99)),
                fmt(ms(r["gaps"], 50), 3),
                fmt(ms(r["gaps"], 99), 3),
                fmt(r["gateway_cpu"] / r["tokens"] * 1e6 if r["tokens"] else None, 1),
                fmt(per_token(r["api_cpu"], r["tokens"]), 1),
                fmt(per_token(r["engine_cpu"], r["tokens"]), 1),
            ]
        )
    through = results["gateway"]

    def versus(other: str) -> dict[str, float]:
        base = results[other]
        return {
            "ttft_p50_ms": ms(through["ttfts"], 50) - ms(base["ttfts"], 50),
            "ttft_p99_ms": ms(through["ttfts"], 99) - ms(base["ttfts"], 99),
            "itl_p50_ms": ms(through["gaps"], 50) - ms(base["gaps"], 50),
            "itl_p99_ms": ms(through["gaps"], 99) - ms(base["gaps"], 99),
        }

    added = {name: versus(name) for name in paths if name != "gateway"}
    headers = ["path", "requests", "tokens", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"]
    headers += ["gw CPU/tok", "eng API CPU/tok", "eng CPU/tok"]
    kind = f"fake engine, {args.itl_ms:g} ms between tokens"
    if args.vllm_engine or args.engine_url:
        kind = "vLLM CPU engine (tiny random-weight Qwen3)" if args.vllm_engine else "real engine"
    title = (
        f"{kind}, "
        f"{args.concurrency} concurrent, {args.tokens} tokens per request, {args.rounds} rounds "
        "(ms; CPU in us per output token)"
    )
    print(format_table(headers, rows, title))
    for name, diff in added.items():
        print(
            f"\ngateway vs {name}: TTFT p50 {diff['ttft_p50_ms']:+.2f} ms, p99 {diff['ttft_p99_ms']:+.2f} ms; "
            f"inter-token p50 {diff['itl_p50_ms']:+.3f} ms, p99 {diff['itl_p99_ms']:+.3f} ms"
        )
    print(
        f"gateway CPU per output token: {fmt(rows[1][7])} us (its idle CPU, {idle_rate * 100:.2f}% of a core, "
        "subtracted)" + (f"; vLLM's API server on its own path: {rows[2][8]} us" if args.vllm_engine else "")
    )
    for phase, values in own.items():
        print(
            f"the gateway's own time ({phase}, from its metrics): mean {values['mean_ms']:.3f} ms, "
            f"p50 ~{values['p50_ms']:.3f} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"added": added, "own": own, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
