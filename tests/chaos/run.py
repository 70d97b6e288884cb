"""One chaos run: two pools of 3 replicas (stream-state modes `full` and `compact`) behind HAProxy,
one real redis-server, `concurrency` streams per pool always in flight plus renders, while the fault
script runs: a replica SIGKILLed (and restarted), Redis restarted, Redis frozen (SIGSTOP) for 5 s,
Redis filled to maxmemory, and every replica rolled to a new build whose configuration (and so
fingerprint) differs, mid-stream. The result holds every number the report prints and the checks
the tests assert."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.cluster import SNAPSHOT_KEY, HAProxy, RedisProcess, Replica, process_rss_and_fds
from tests.chaos.workload import (
    CHAT_REQUEST,
    DERENDER,
    OUTPUT_TEXTS,
    ProtocolViolation,
    Stats,
    StreamCase,
    batch_view,
    make_cases,
    run_render,
    run_stream,
)
from tests.helpers import metric

MODES = ("full", "compact")
BASE_FLAGS = [
    "--served-model-name",
    "tinyqwen3",
    "--reasoning-parser",
    "qwen3",
    "--tool-call-parser",
    "hermes",
    "--enable-auto-tool-choice",
    "--max-model-len",
    "8192",
    "--snapshot-key",
    SNAPSHOT_KEY,
]
NEW_BUILD_FLAGS = ["--max-logprobs", "21"]  # changes the fingerprint, not a streamed answer
COUNTERS = (
    "render_stream_replays_total",
    "render_stream_replayed_tokens_total",
    "render_redis_errors_total",
    "render_overload_rejections_total",
)


@dataclass
class ChaosConfig:
    replicas: int = 3  # per pool
    concurrency: int = 200  # streams in flight per pool
    render_concurrency: int = 20
    chunk_pause: float = 0.05  # between a stream's chunks (the engine's decode pace)
    warmup: float = 10.0
    baseline: float = 10.0
    settle: float = 5.0  # between faults
    freeze_seconds: float = 5.0
    full_seconds: float = 5.0
    replica_down_seconds: float = 2.0


@dataclass
class FaultWindow:
    name: str
    started: float
    ended: float = 0.0


@dataclass
class ChaosResult:
    config: ChaosConfig
    stats: dict[str, Stats]
    windows: list[FaultWindow]
    faults: Counter[str]
    counters: dict[str, float]
    processes: list[dict[str, Any]]
    duration: float
    mismatches: list[str] = field(default_factory=list)

    def latency_ms(self, kind: str, start: float, end: float, q: float = 0.99) -> tuple[int, float | None]:
        values = sorted(
            s.latency * 1e3
            for st in self.stats.values()
            for s in st.samples
            if s.kind == kind and start <= s.started < end
        )
        if not values:
            return 0, None
        return len(values), values[min(len(values) - 1, int(q * len(values)))]


class Sampler(threading.Thread):
    """Every second: RSS and fds of each live replica process, and its counters from /metrics."""

    def __init__(self, replicas: list[Replica]) -> None:
        super().__init__(daemon=True)
        self.replicas = replicas
        self.samples: dict[int, list[tuple[float, int, int]]] = {}
        self.owner: dict[int, str] = {}
        self.counters: dict[int, dict[str, float]] = {}
        self.running = True
        self.http = httpx.Client(timeout=2)

    def run(self) -> None:
        while self.running:
            self.sample()
            time.sleep(1.0)

    def sample(self) -> None:
        for replica in self.replicas:
            pid = replica.pid
            if pid is None or not replica.ready:
                continue
            reading = process_rss_and_fds(pid)
            if reading is not None:
                self.samples.setdefault(pid, []).append((time.monotonic(), *reading))
                self.owner[pid] = f"{replica.name}#{replica.generation}"
            try:
                text = self.http.get(f"{replica.url}/metrics").text
            except httpx.HTTPError:
                continue
            self.counters[pid] = {
                name: sum(
                    metric(text, name, **labels)
                    for labels in ({}, {"op": "get"}, {"op": "set"}, {"op": "mm_get"}, {"op": "mm_set"})
                )
                for name in COUNTERS
            }

    def stop(self) -> None:
        self.running = False
        self.join(5)
        self.http.close()


def _prepare(url: str) -> tuple[list[int], list[list[int]], dict[str, Any], list[int]]:
    with httpx.Client(timeout=30) as http:
        rendered = http.post(f"{url}/v1/chat/completions/render", json=CHAT_REQUEST).json()
        outputs = [http.post(f"{url}/tokenize", json={"prompt": text}).json()["tokens"] for text in OUTPUT_TEXTS]
    render_body = {**CHAT_REQUEST, "messages": [*CHAT_REQUEST["messages"]], "max_tokens": 64}
    with httpx.Client(timeout=30) as http:
        expected_render = http.post(f"{url}/v1/chat/completions/render", json=render_body).json()["token_ids"]
    return rendered["token_ids"], outputs, render_body, expected_render


def _batch(http: httpx.Client, url: str, case: StreamCase) -> dict[str, Any]:
    answer = http.post(
        f"{url}{DERENDER}",
        json={
            "chat_request": CHAT_REQUEST,
            "prompt_token_ids": case.prompt_ids,
            "generate_response": {
                "request_id": case.request_id,
                "choices": [{"index": 0, "finish_reason": "stop", "token_ids": case.output_ids}],
            },
        },
    ).json()
    choice = answer["choices"][0]
    return batch_view(choice["message"], choice["finish_reason"])


async def _workload(
    lb: HAProxy,
    config: ChaosConfig,
    cases: dict[str, list[StreamCase]],
    render_body: dict[str, Any],
    expected_render: list[int],
    stats: dict[str, Stats],
    results: dict[str, dict[str, dict[str, Any]]],
    stop: asyncio.Event,
) -> None:
    # A connection for every request in flight (both pools' streams and the renders): a client that
    # queued for its own pool would measure that queue, not the service.
    in_flight = len(MODES) * config.concurrency + config.render_concurrency
    limits = httpx.Limits(max_connections=in_flight + 16, max_keepalive_connections=None)

    async def streams(mode: str, client: httpx.AsyncClient) -> None:
        queue = list(cases[mode])

        async def worker() -> None:
            while queue and not stop.is_set():
                case = queue.pop()
                try:
                    results[mode][case.request_id] = await run_stream(
                        client, lb.url(mode), case, stats[mode], pause=config.chunk_pause
                    )
                    stats[mode].streams_done += 1
                except ProtocolViolation as exc:
                    stats[mode].violations.append(f"{case.request_id}: {exc}")

        await asyncio.gather(*(worker() for _ in range(config.concurrency)))

    async def renders(client: httpx.AsyncClient) -> None:
        async def worker() -> None:
            while not stop.is_set():
                try:
                    await run_render(client, lb.url("full"), render_body, expected_render, stats["full"])
                except ProtocolViolation as exc:
                    stats["full"].violations.append(f"render: {exc}")

        await asyncio.gather(*(worker() for _ in range(config.render_concurrency)))

    async with httpx.AsyncClient(limits=limits, http2=False) as client:
        await asyncio.gather(*(streams(mode, client) for mode in MODES), renders(client))


def run_chaos(model_dir: Path, log_dir: Path, config: ChaosConfig) -> ChaosResult:
    started = time.monotonic()
    windows: list[FaultWindow] = []
    faults: Counter[str] = Counter()
    with ExitStack() as stack:
        redis = RedisProcess(log_dir)
        redis.start()
        stack.callback(redis.kill)
        pools = {
            mode: [
                Replica(
                    f"{mode}{i}",
                    model_dir,
                    [*BASE_FLAGS, "--redis-url", redis.url, "--stream-state-mode", mode],
                    log_dir,
                )
                for i in range(config.replicas)
            ]
            for mode in MODES
        }
        everyone = [r for pool in pools.values() for r in pool]
        for replica in everyone:
            replica.start(wait=False)
            stack.callback(replica.stop)
        for replica in everyone:
            replica.wait_healthy()
        lb = HAProxy(pools, log_dir)
        lb.start()
        stack.callback(lb.stop)

        prompt_ids, outputs, render_body, expected_render = _prepare(everyone[0].url)
        # Enough streams that `concurrency` stay in flight until the fault script ends.
        per_pool = config.concurrency * 40
        cases = {mode: make_cases(per_pool, prompt_ids, outputs, seed=i) for i, mode in enumerate(MODES)}
        for mode in MODES:
            for case in cases[mode]:
                case.request_id = f"{case.request_id}-{mode}"
        stats = {mode: Stats() for mode in MODES}
        results: dict[str, dict[str, dict[str, Any]]] = {mode: {} for mode in MODES}
        sampler = Sampler(everyone)

        async def main() -> None:
            stop = asyncio.Event()
            load = asyncio.create_task(_workload(lb, config, cases, render_body, expected_render, stats, results, stop))
            await asyncio.sleep(config.warmup)
            sampler.start()

            async def window(name: str, action: Any) -> None:
                entry = FaultWindow(name, time.monotonic())
                windows.append(entry)
                await action()
                entry.ended = time.monotonic()
                await asyncio.sleep(config.settle)

            async def baseline() -> None:
                await asyncio.sleep(config.baseline)

            async def kill_replica() -> None:
                for mode in MODES:
                    pools[mode][1].kill()
                    faults["replica SIGKILL"] += 1
                await asyncio.sleep(config.replica_down_seconds)
                await asyncio.gather(*(asyncio.to_thread(pools[mode][1].start) for mode in MODES))
                faults["replica restart"] += len(MODES)

            async def restart_redis() -> None:
                await asyncio.to_thread(redis.restart)
                faults["Redis restart"] += 1

            async def freeze_redis() -> None:
                redis.freeze()
                faults["Redis SIGSTOP"] += 1
                await asyncio.sleep(config.freeze_seconds)
                redis.thaw()

            async def fill_redis() -> None:
                await asyncio.to_thread(redis.fill)
                faults["Redis at maxmemory"] += 1
                await asyncio.sleep(config.full_seconds)
                await asyncio.to_thread(redis.unfill)

            async def replace(replica: Replica) -> None:
                await asyncio.to_thread(replica.stop)
                replica.flags = [*replica.flags, *NEW_BUILD_FLAGS]
                await asyncio.to_thread(replica.start)
                faults["rolled to the new build"] += 1

            async def roll() -> None:
                # One replica of each pool at a time (maxUnavailable 1), the pools side by side.
                for index in range(config.replicas):
                    await asyncio.gather(*(replace(pools[mode][index]) for mode in MODES))

            await window("baseline (no fault)", baseline)
            await window("replica SIGKILL + restart", kill_replica)
            await window("Redis restart (empty)", restart_redis)
            await window(f"Redis frozen (SIGSTOP {config.freeze_seconds:g} s)", freeze_redis)
            await window("Redis full (maxmemory, noeviction)", fill_redis)
            await window("rolling update, new fingerprint", roll)
            stop.set()  # no new streams; the ones in flight finish
            await load

        asyncio.run(main())
        sampler.sample()
        sampler.stop()
        # Every finished stream against its batch derender (on the new build: same answers).
        mismatches: list[str] = []
        http = stack.enter_context(httpx.Client(timeout=30))
        for mode in MODES:
            by_id = {case.request_id: case for case in cases[mode]}
            for request_id, got in results[mode].items():
                expected = _batch(http, pools[mode][0].url, by_id[request_id])
                if got == expected:
                    stats[mode].streams_correct += 1
                else:
                    mismatches.append(f"{request_id}: streamed {got} != batch {expected}")
        counters = Counter[str]()
        for values in sampler.counters.values():
            counters.update(values)
        processes = []
        for pid, readings in sampler.samples.items():
            first, last = readings[0], readings[-1]
            processes.append(
                {
                    "process": sampler.owner[pid],
                    "pid": pid,
                    "seconds": last[0] - first[0],
                    "rss_first_mib": first[1] / 2**20,
                    "rss_last_mib": last[1] / 2**20,
                    "rss_max_mib": max(r[1] for r in readings) / 2**20,
                    "fds_first": first[2],
                    "fds_last": last[2],
                    "fds_max": max(r[2] for r in readings),
                }
            )
    return ChaosResult(
        config, stats, windows, faults, dict(counters), processes, time.monotonic() - started, mismatches
    )


def summary(result: ChaosResult) -> dict[str, Any]:
    """The numbers, as the report prints them."""
    stats = result.stats.values()
    errors: Counter[str] = Counter()
    restarts: Counter[str] = Counter()
    for st in stats:
        errors.update(st.errors)
        restarts.update(st.restarts)
    chunk_latencies = [s.latency for st in stats for s in st.samples if s.kind == "chunk"]
    return {
        "duration_s": round(result.duration, 1),
        "requests": sum(len(st.samples) for st in stats),
        "chunks": len(chunk_latencies),
        "renders": sum(st.renders_done for st in stats),
        "renders_correct": sum(st.renders_correct for st in stats),
        "streams": sum(st.streams_done for st in stats),
        "streams_correct": sum(st.streams_correct for st in stats),
        "streams_by_mode": {mode: result.stats[mode].streams_done for mode in result.stats},
        "faults": dict(result.faults),
        "restarts_by_code": dict(restarts),
        "errors_by_kind": dict(errors),
        "violations": [v for st in stats for v in st.violations][:20],
        "mismatches": result.mismatches[:20],
        "counters": result.counters,
        "chunk_p50_ms": round(statistics.median(chunk_latencies) * 1e3, 1) if chunk_latencies else None,
        "windows": [
            {
                "fault": w.name,
                "seconds": round(w.ended - w.started, 1),
                "chunks": result.latency_ms("chunk", w.started, w.ended)[0],
                "chunk_p99_ms": _round(result.latency_ms("chunk", w.started, w.ended)[1]),
                "renders": result.latency_ms("render", w.started, w.ended)[0],
                "render_p99_ms": _round(result.latency_ms("render", w.started, w.ended)[1]),
            }
            for w in result.windows
        ],
        "processes": result.processes,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
