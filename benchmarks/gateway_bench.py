"""What gateway mode adds to a streamed request: TTFT, inter-token latency and CPU per output token
of `render-service serve --engine URL` in front of an engine, against calling the engine directly.

Every path streams chat requests' tokens from the same engine, each request its own prompt
("Tell me about fox P-K.", never repeated, so no prefix or render cache serves it twice):

- direct: the client posts the rendered `GenerateRequest` (rendered by the gateway up front) to
  the engine's `/inference/v1/generate` and reads its token chunks;
- gateway: the client posts the chat request to the gateway's `/v1/chat/completions`, which
  renders, calls the engine and derenders each chunk into OpenAI SSE;
- vllm (with --vllm-engine): the chat request to the engine's own `/v1/chat/completions`
  (`vllm serve` on the same engine settings).

For each concurrency level (`--concurrency 1,2,8`): `--rounds` separate rounds of `--requests`
requests per path, alternating, with CPU read around each round; then `--pairs` interleaved
groups, one request per path back to back (the order rotating from group to group), which gives
the p50 of paired differences: on a shared, noisy machine the load drifts between rounds, and a
difference of two rounds' p50s carries that drift, while a pair's two requests see the same
moment's load. TTFT is the client's time to the first event that carries a token; inter-token
latency the gaps between later ones. The client is the gateway's own lean HTTP/1.1 client (one
write per request, keep-alive), the same on every path.

CPU per output token is the gateway process tree's CPU (utime+stime from /proc) over its rounds,
less its idle CPU over the same time, divided by the output tokens it streamed (render and
derender included); the engine's own CPU per token is shown for scale, and with --vllm-engine its
API server process alone (vLLM's front end, without the engine core).

The engine is the scripted fake engine of tests/gateway (vLLM 0.33's generate protocol, a token
every --itl-ms, the first one at once), started as a child process, unless --engine-url names a
real `--tokens-only` engine (then --model must be the engine's model), or --vllm-engine starts a
real vLLM CPU engine with its tokenizer (VLLM_ENGINE_PYTHON, the tiny random-weight Qwen3 of the
live tests). The gateway's own share of TTFT comes from its
`render_gateway_added_latency_seconds` histogram (to_engine: arrival to the generate request
written; to_client: the engine's first chunk to its SSE bytes). With --render-split it also times
`render_chat` of such a chat in its own process, back to back and after a 20 ms pause: the
render's share of to_engine, most of which, on a shared machine, is caches lost while idle. Run
from the repository root:

    python -m benchmarks.gateway_bench --concurrency 1,2,8 --requests 48 --rounds 2 --tokens 64
    VLLM_ENGINE_PYTHON=.../bin/python python -m benchmarks.gateway_bench --vllm-engine --concurrency 1,2,4 --tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

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
from render_service.gateway.connection import ConnectionPool

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


# -- the client -------------------------------------------------------------------------------
#
# The client runs on the same two cores as the gateway and the engine, so it is kept lean: the
# gateway's own HTTP/1.1 client (one write per request, pooled keep-alive connections, httptools),
# bodies encoded up front, and the same code on every path. (httpx wrote the headers and the body
# in two writes, which every server then waited for, and parsed each line in Python.)


@dataclass
class Sample:
    """One streamed request as the client saw it."""

    ttft: float  # to the first event that carries a token
    gaps: list[float]  # between later token-carrying events
    tokens: int


def _event_tokens(event: Any) -> int:
    """Output tokens an event carries (token ids when the path returns them, else a non-empty
    text delta or a finish counts as one)."""
    count = 0
    for choice in (event.get("choices") or []) if isinstance(event, dict) else []:
        ids = choice.get("token_ids")
        if ids is not None:
            count += len(ids)
        elif (choice.get("delta") or {}).get("content") or choice.get("finish_reason"):
            count += 1
    return count


async def stream_once(pool: ConnectionPool, url: str, body: bytes) -> Sample:
    """Stream one request; times are taken when its bytes arrive."""
    start = time.perf_counter()
    response = await pool.request("POST", url, body)
    ttft = 0.0
    gaps: list[float] = []
    tokens = 0
    last = start
    pending = b""
    try:
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {(await response.read())[:300]!r}")
        async for received in response.aiter_bytes():
            now = time.perf_counter()
            *lines, pending = (pending + received).split(b"\n")
            for line in lines:
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                count = _event_tokens(orjson.loads(line[5:]))
                if not count:
                    continue  # a role chunk, a usage chunk
                tokens += count
                if not ttft:
                    ttft = now - start
                else:
                    gaps.append(now - last)
                last = now
    finally:
        await response.aclose()
    return Sample(ttft, gaps, tokens)


@dataclass
class BenchPath:
    """One way to stream the request: where to post and the body of each request (unique prompts,
    encoded up front; request k uses bodies[k])."""

    name: str
    url: str
    bodies: list[bytes]


async def run_round(pool: ConnectionPool, path: BenchPath, first: int, requests: int, concurrency: int) -> list[Sample]:
    """`requests` requests on one path, `concurrency` at a time."""
    samples: list[Sample] = []
    queue = list(range(first + requests - 1, first - 1, -1))

    async def worker() -> None:
        while queue:
            index = queue.pop()
            samples.append(await stream_once(pool, path.url, path.bodies[index]))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def run_paired(
    pool: ConnectionPool, paths: list[BenchPath], first: int, pairs: int, concurrency: int
) -> list[dict[str, Sample]]:
    """`pairs` groups of one request per path, `concurrency` groups at a time; within a group the
    requests run back to back (the same prompt number on every path), in an order that rotates
    from group to group, so that both sides of each difference see the same moment's load."""
    groups: list[dict[str, Sample]] = []
    queue = list(range(first + pairs - 1, first - 1, -1))

    async def worker() -> None:
        while queue:
            index = queue.pop()
            shift = index % len(paths)
            group: dict[str, Sample] = {}
            for path in paths[shift:] + paths[:shift]:
                group[path.name] = await stream_once(pool, path.url, path.bodies[index])
            groups.append(group)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return groups


# -- the render's share -----------------------------------------------------------------------


def render_split(model_dir: str, count: int = 120, pause: float = 0.02) -> dict[str, float]:
    """`render_chat` of the benchmark's chats in this process, p50 microseconds of wall time:
    back to back ("hot") and each after a `pause`-second sleep ("after_pause"), as the gateway
    renders a request that arrives after an idle wait. The gap is the cost of caches the render's
    code and data lost meanwhile (to other processes on a shared machine, or just the wait)."""
    from render_service.render import pipeline as render
    from render_service.server.state import State
    from render_service.settings import Settings

    settings = Settings(model=model_dir, engine=["http://127.0.0.1:9"], max_model_len=4096).validate()
    state = State(settings)
    state.load()
    served = settings.served_names[0]
    out: dict[str, float] = {}
    for mode, sleep in (("hot", 0.0), ("after_pause", pause)):
        times = []
        for k in range(count):
            if sleep:
                time.sleep(sleep)
            chat = {
                "model": served,
                "messages": [{"role": "user", "content": f"Tell me about fox {mode}-{k:06d}."}],
                "max_tokens": 32,
                "temperature": 0,
                "stream": True,
            }
            started = time.perf_counter()
            render.render_chat(state.context, chat, None)
            times.append(time.perf_counter() - started)
        out[f"{mode}_p50_us"] = percentile(times[count // 5 :], 50) * 1e6
    return out


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


def build_paths(gateway: Server, engine: Server, served: str, args: argparse.Namespace, count: int) -> list[BenchPath]:
    """The paths, each with `count` unique chat requests (prompt numbers differ between paths too,
    so that an engine's prefix cache never serves one path the prompt another just sent); the
    direct path's bodies are the gateway's own renders of its chats."""
    names = ["direct", "gateway"] + (["vllm"] if args.vllm_engine else [])
    paths = []
    with httpx.Client(timeout=60) as http:
        for number, name in enumerate(names):
            bodies = []
            for k in range(count):
                chat: dict[str, Any] = {
                    "model": served,
                    "messages": [{"role": "user", "content": f"Tell me about fox {number}-{k:06d}."}],
                    "max_tokens": args.tokens,
                    "temperature": 0,
                    "stream": True,
                }
                if args.vllm_engine or args.engine_url:
                    chat.update(ignore_eos=True, return_token_ids=True)  # every request streams --tokens tokens
                if name == "direct":
                    rendered = http.post(f"{gateway.url}/v1/chat/completions/render", json=chat)
                    rendered.raise_for_status()
                    bodies.append(rendered.content)
                else:
                    bodies.append(orjson.dumps(chat))
            url = {
                "direct": f"{engine.url}/inference/v1/generate",
                "gateway": f"{gateway.url}/v1/chat/completions",
                "vllm": f"{engine.url}/v1/chat/completions",
            }[name]
            paths.append(BenchPath(name, url, bodies))
    return paths


def thread_schedstat(pid: int | None) -> tuple[int, int]:
    """(run-queue wait in ns, times it ran) of `pid`'s main thread, the event loop's."""
    if pid is None:
        return 0, 0
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as handle:
            _, wait, slices = handle.read().split()[:3]
        return int(wait), int(slices)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return 0, 0


def wait_per_wakeup_us(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Mean wait for a CPU each time the thread became runnable, in microseconds."""
    slices = after[1] - before[1]
    return (after[0] - before[0]) / slices / 1000 if slices > 0 else None


def cpu_reading(gateway: Server, engine: Server) -> tuple[float, float, float]:
    """(gateway tree, engine API server process alone, engine tree) CPU seconds so far."""
    api = own_cpu_seconds(engine.pid) if engine.pid else 0.0
    return gateway.cpu_seconds() or 0.0, api, engine.cpu_seconds() or 0.0


async def measure_level(
    paths: list[BenchPath], gateway: Server, engine: Server, args: argparse.Namespace, concurrency: int
) -> dict[str, Any]:
    """One concurrency level: warm-up, `--rounds` separate rounds per path (alternating; CPU is
    read around each), then `--pairs` interleaved groups."""
    pool = ConnectionPool(timeout=120, connect_timeout=10)
    results: dict[str, dict[str, Any]] = {
        path.name: {"samples": [], "seconds": 0.0, "gateway_cpu": 0.0, "api_cpu": 0.0, "engine_cpu": 0.0}
        for path in paths
    }
    cursor = 0  # the next unused prompt number
    try:
        for path in paths:  # connections opened, caches warm
            await run_round(pool, path, cursor, concurrency * 2, concurrency)
        cursor += concurrency * 2
        metrics_before = added_latency_histogram(httpx.get(f"{gateway.url}/metrics").text)
        for round_number in range(args.rounds):
            order = paths if round_number % 2 == 0 else paths[::-1]
            for path in order:
                before = cpu_reading(gateway, engine)
                started = time.perf_counter()
                samples = await run_round(pool, path, cursor, args.requests, concurrency)
                after = cpu_reading(gateway, engine)
                into = results[path.name]
                into["seconds"] += time.perf_counter() - started
                into["samples"] += samples
                into["gateway_cpu"] += after[0] - before[0]
                into["api_cpu"] += after[1] - before[1]
                into["engine_cpu"] += after[2] - before[2]
            cursor += args.requests
        waits_before = thread_schedstat(gateway.pid), thread_schedstat(engine.pid)
        groups = await run_paired(pool, paths, cursor, args.pairs, concurrency) if args.pairs else []
        waits_after = thread_schedstat(gateway.pid), thread_schedstat(engine.pid)
        metrics_after = added_latency_histogram(httpx.get(f"{gateway.url}/metrics").text)
    finally:
        await pool.aclose()
    waits = {
        "gateway_wait_us_per_wakeup": wait_per_wakeup_us(waits_before[0], waits_after[0]),
        "engine_wait_us_per_wakeup": wait_per_wakeup_us(waits_before[1], waits_after[1]),
    }
    return {"results": results, "groups": groups, "own": added_latency(metrics_before, metrics_after), "waits": waits}


def ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


def report_level(
    level: dict[str, Any], args: argparse.Namespace, concurrency: int, idle_rate: float, engine: Server
) -> dict[str, Any]:
    """Print one level's tables and lines; the numbers for --json."""
    results: dict[str, dict[str, Any]] = level["results"]
    groups: list[dict[str, Sample]] = level["groups"]

    def per_token(seconds: float, tokens: int) -> float | None:
        return seconds / tokens * 1e6 if tokens and engine.pid else None

    rows = []
    summary: dict[str, Any] = {
        "concurrency": concurrency,
        "separate": {},
        "paired": {},
        "own": level["own"],
        "waits": level["waits"],
    }
    for name, r in results.items():
        samples: list[Sample] = r["samples"]
        ttfts = [x.ttft for x in samples]
        gaps = [g for x in samples for g in x.gaps]
        tokens = sum(x.tokens for x in samples)
        gateway_cpu = max(0.0, r["gateway_cpu"] - idle_rate * r["seconds"])
        gw_per_token = gateway_cpu / tokens * 1e6 if tokens and name == "gateway" else None
        summary["separate"][name] = {
            "requests": len(samples),
            "tokens": tokens,
            "ttft_p50_ms": ms(ttfts, 50),
            "ttft_p99_ms": ms(ttfts, 99),
            "itl_p50_ms": ms(gaps, 50),
            "itl_p99_ms": ms(gaps, 99),
            "gateway_cpu_us_per_token": gw_per_token,
            "api_cpu_us_per_token": per_token(r["api_cpu"], tokens),
            "engine_cpu_us_per_token": per_token(r["engine_cpu"], tokens),
        }
        rows.append(
            [
                name,
                str(len(samples)),
                str(tokens),
                fmt(ms(ttfts, 50), 3),
                fmt(ms(ttfts, 99), 3),
                fmt(ms(gaps, 50), 3),
                fmt(ms(gaps, 99), 3),
                fmt(gw_per_token, 1),
                fmt(per_token(r["api_cpu"], tokens), 1),
                fmt(per_token(r["engine_cpu"], tokens), 1),
            ]
        )
    headers = ["path", "requests", "tokens", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"]
    headers += ["gw CPU/tok", "eng API CPU/tok", "eng CPU/tok"]
    kind = f"fake engine, {args.itl_ms:g} ms between tokens"
    if args.vllm_engine or args.engine_url:
        kind = "vLLM CPU engine (tiny random-weight Qwen3)" if args.vllm_engine else "real engine"
    title = (
        f"{kind}, {concurrency} concurrent, {args.tokens} tokens per request, {args.rounds} separate rounds "
        "(ms; CPU in us per output token)"
    )
    print("\n" + format_table(headers, rows, title))
    separate = summary["separate"]
    for name in results:
        if name == "gateway":
            continue
        print(
            f"separate rounds, gateway vs {name}: TTFT p50 "
            f"{separate['gateway']['ttft_p50_ms'] - separate[name]['ttft_p50_ms']:+.3f} ms, "
            f"p99 {separate['gateway']['ttft_p99_ms'] - separate[name]['ttft_p99_ms']:+.3f} ms; inter-token p50 "
            f"{separate['gateway']['itl_p50_ms'] - separate[name]['itl_p50_ms']:+.3f} ms, "
            f"p99 {separate['gateway']['itl_p99_ms'] - separate[name]['itl_p99_ms']:+.3f} ms"
        )
    if groups:
        through = [g["gateway"].ttft for g in groups]
        for name in results:
            if name == "gateway":
                continue
            other = [g[name].ttft for g in groups]
            differences = [g["gateway"].ttft - g[name].ttft for g in groups]
            paired = {
                "pairs": len(groups),
                f"{name}_ttft_p50_ms": ms(other, 50),
                "gateway_ttft_p50_ms": ms(through, 50),
                "difference_of_p50s_ms": ms(through, 50) - ms(other, 50),
                "paired_difference_p50_ms": ms(differences, 50),
                "paired_difference_p25_ms": ms(differences, 25),
                "paired_difference_p75_ms": ms(differences, 75),
            }
            summary["paired"][name] = paired
            print(
                f"interleaved ({len(groups)} groups), gateway vs {name}: TTFT p50 {paired[f'{name}_ttft_p50_ms']:.3f} / "
                f"{paired['gateway_ttft_p50_ms']:.3f} ms ({paired['difference_of_p50s_ms']:+.3f}); "
                f"p50 of paired differences {paired['paired_difference_p50_ms']:+.3f} ms "
                f"(p25 {paired['paired_difference_p25_ms']:+.3f}, p75 {paired['paired_difference_p75_ms']:+.3f})"
            )
    waits = level["waits"]
    if groups and waits["gateway_wait_us_per_wakeup"] is not None:
        # The gateway path wakes the gateway twice more before its first token (the request, the
        # engine's first chunk) than the direct path: on a loaded machine each waits for a core.
        print(
            f"waiting for a CPU per wakeup during the interleaved groups (schedstat, event-loop thread): gateway "
            f"{waits['gateway_wait_us_per_wakeup']:.0f} us, engine {fmt(waits['engine_wait_us_per_wakeup'], 0)} us"
        )
    gateway_row = separate["gateway"]
    print(
        f"gateway CPU per output token: {fmt(gateway_row['gateway_cpu_us_per_token'], 1)} us (its idle CPU, "
        f"{idle_rate * 100:.2f}% of a core, subtracted)"
        + (
            f"; vLLM's API server on its own path: {fmt(separate['vllm']['api_cpu_us_per_token'], 1)} us"
            if args.vllm_engine
            else ""
        )
    )
    for phase, values in level["own"].items():
        print(
            f"the gateway's own time ({phase}, from its metrics): mean {values['mean_ms']:.3f} ms, "
            f"p50 ~{values['p50_ms']:.3f} ms"
        )
    return summary


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
    parser.add_argument("--requests", type=int, default=48, help="streamed requests per path and separate round")
    parser.add_argument("--rounds", type=int, default=2, help="separate rounds per path (alternating)")
    parser.add_argument(
        "--pairs", type=int, default=None, help="interleaved groups (one request per path each; default --requests)"
    )
    parser.add_argument(
        "--concurrency", default="1,2,8", help="concurrent requests; a comma-separated list runs each level in turn"
    )
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="how long the gateway's idle CPU is sampled")
    parser.add_argument(
        "--itl-ms", type=float, default=20.0, help="the fake engine's time between tokens (a decode step)"
    )
    parser.add_argument(
        "--render-split",
        action="store_true",
        help="also time render_chat in this process, back to back and after a 20 ms pause (the render's share of "
        "the gateway's to_engine time, and how much of it is caches lost while idle)",
    )
    parser.add_argument("--fake-engine", nargs=3, metavar=("PORT", "TOKENS", "INTERVAL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake_engine:
        serve_fake_engine(int(args.fake_engine[0]), json.loads(args.fake_engine[1]), float(args.fake_engine[2]))
        return 0
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if args.pairs is None:
        args.pairs = args.requests

    scratch = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    vllm_process = None
    if args.vllm_engine:
        from tests.integration.engine_fixture import build_weighted_model, start_engine

        model_dir = str(build_weighted_model())
        vllm_process = start_engine(model_dir, max_model_len=4096, tokens_only=False, timeout=900)
        engine = Server("vllm", vllm_process.url, vllm_process.process.pid)
    else:
        model_dir = example_model_dir(args.model)
        engine = (
            Server("engine", args.engine_url.rstrip("/"), None)
            if args.engine_url
            else start_fake_engine(model_dir, args.tokens, args.itl_ms / 1000, scratch / "engine.log")
        )
    gateway = None
    summaries = []
    extra_json: dict[str, Any] = {}
    try:
        extra = ["--max-model-len", "4096", "--served-model-name", "tinyqwen3"] if args.vllm_engine else []
        gateway = start_render_service(
            model_dir, free_port(), ["--engine", engine.url, "--workers", "1", *extra], log=scratch / "gateway.log"
        )
        served = httpx.get(f"{gateway.url}/v1/models").json()["data"][0]["id"]
        per_level = max(levels) * 2 + args.rounds * args.requests + args.pairs
        paths = build_paths(gateway, engine, served, args, per_level * len(levels))
        # The gateway's CPU when idle (its event-loop lag probe, engine health probes), subtracted below.
        idle_start, idle_cpu = time.perf_counter(), gateway.cpu_seconds() or 0.0
        time.sleep(args.idle_seconds)
        idle_rate = ((gateway.cpu_seconds() or 0.0) - idle_cpu) / (time.perf_counter() - idle_start)
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}")
        if args.render_split:
            split = render_split(model_dir)
            extra_json["render_split"] = split
            print(
                f"render_chat of one such chat in this process, p50: {split['hot_p50_us']:.0f} us back to back, "
                f"{split['after_pause_p50_us']:.0f} us after a 20 ms pause"
            )
        for number, concurrency in enumerate(levels):
            # Each level its own prompt numbers (never one the engine has seen).
            shifted = [BenchPath(p.name, p.url, p.bodies[number * per_level : (number + 1) * per_level]) for p in paths]
            level = asyncio.run(measure_level(shifted, gateway, engine, args, concurrency))
            summaries.append(report_level(level, args, concurrency, idle_rate, engine))
        print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}")
    finally:
        if gateway is not None:
            gateway.stop()
        if vllm_process is not None:
            vllm_process.stop()
        else:
            engine.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"levels": summaries, "args": vars(args), **extra_json}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
