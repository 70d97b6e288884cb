"""Soak: a steady mixed load on a real service (workers + Redis) for a long time, on loopback only.

Starts redis-server and `render-service serve --workers N --redis-url ...` (parsers qwen3 + hermes),
then offers a steady open-loop load for `--duration` seconds:

- chat renders (a ~300-token chat, and a coding-agent conversation with 15 tools),
- streaming derender with parsers, one token per chunk, echoing `stream_state` like an llm-d client:
  half the streams keep their connection (in-process snapshots), half open a new connection per
  chunk (the kernel picks the worker: snapshots come from Redis); each finished stream is checked
  against the batch derender of the same output (reasoning, content, tool calls and their ids),
- the batch derenders themselves.

Every 10 s it records each worker's RSS and open file descriptors, the parent's, and Redis's
`connected_clients`, memory and key count. At the end it prints requests, errors, latency,
RSS start (after the warm-up) and end per worker, fd and Redis-connection ranges, and writes every
sample to `--out` (JSON). Exit code 1 on any error or wrong answer.

    python3 -m loadtests.soak --duration 600 --rate 20 --out soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from loadtests.payloads import DERENDER_PATH, MODEL, RENDER_PATH, chat_payloads, derender_case

SERVER_FLAGS = (
    "--served-model-name",
    MODEL,
    "--reasoning-parser",
    "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--max-model-len",
    "16384",
)
SAMPLE_EVERY = 10.0
WARM_UP = 60.0  # RSS "start" is the first sample after this (caches, allocator arenas and pools filled)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the service exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the service did not become healthy")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Soak:
    def __init__(self, url: str, service_pid: int, redis_port: int, rate: float, duration: float) -> None:
        self.url = url
        self.service_pid = service_pid
        self.redis_port = redis_port
        self.duration = duration
        self.render_rate = rate * 0.4
        self.streams = 4  # concurrent streams; together they send rate * 0.6 chunks/s
        self.chunk_interval = self.streams / (rate * 0.6)
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.streams_done = 0
        self.stop_at = 0.0

    def error(self, text: str) -> None:
        self.errors.append(text[:300])
        if len(self.errors) <= 5:
            print(f"ERROR {text[:300]}", file=sys.stderr)

    async def post(
        self, client: httpx.AsyncClient, kind: str, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> Any:
        start = time.perf_counter()
        try:
            response = await client.post(self.url + path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            self.error(f"{kind}: {type(exc).__name__}: {exc}")
            return None
        self.latency[kind].append(time.perf_counter() - start)
        if response.status_code != 200:
            self.error(f"{kind}: HTTP {response.status_code}: {response.text}")
            return None
        return response.json()

    async def renders(self, client: httpx.AsyncClient) -> None:
        bodies = [("render_short", b) for b in chat_payloads("short")] + [
            ("render_agent", b) for b in chat_payloads("agent")[:4]
        ]
        interval = 1.0 / self.render_rate
        tasks: set[asyncio.Task[Any]] = set()
        next_at = time.monotonic()
        index = 0
        while time.monotonic() < self.stop_at:
            kind, body = bodies[index % len(bodies)]
            index += 1
            # Open loop: requests leave on schedule whether or not earlier ones have answered.
            task = asyncio.create_task(self.post(client, kind, RENDER_PATH, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks)

    async def stream_worker(self, worker: int, client: httpx.AsyncClient) -> None:
        sticky = worker % 2 == 0
        headers = None if sticky else {"Connection": "close"}
        seed = 0
        while time.monotonic() < self.stop_at:
            seed += 1
            case = derender_case(self.url, 100 + (worker * 7 + seed) % 6, words=60)
            request_id = f"generate-tokens-chatcmpl-soak-{worker}-{seed}"
            batch = await self.post(client, "derender_batch", DERENDER_PATH, case.batch_body(request_id))
            if batch is None:
                continue
            expected = batch["choices"][0]["message"]
            state = None
            reasoning, content = [], []
            calls: dict[int, dict[str, str]] = {}
            next_at = time.monotonic()
            failed = False
            for build in case.stream_bodies(request_id):
                if time.monotonic() >= self.stop_at:
                    failed = True  # the soak is over: leave this stream unfinished (not an error)
                    break
                answer = await self.post(client, "derender_stream_chunk", DERENDER_PATH, build(state), headers)
                if answer is None:
                    failed = True
                    break
                state = answer["stream_state"]
                for choice in answer["chunk"]["choices"]:
                    delta = choice["delta"]
                    reasoning.append(delta.get("reasoning") or "")
                    content.append(delta.get("content") or "")
                    for call in delta.get("tool_calls") or []:
                        entry = calls.setdefault(call["index"], {"id": call["id"], "name": "", "arguments": ""})
                        entry["name"] += call["function"].get("name") or ""
                        entry["arguments"] += call["function"].get("arguments") or ""
                next_at += self.chunk_interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if failed:
                continue
            got = (
                "".join(reasoning),
                "".join(content) or None,
                [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())],
            )
            want = (
                expected["reasoning"],
                expected["content"],
                [
                    (c["id"], c["function"]["name"], c["function"]["arguments"])
                    for c in expected.get("tool_calls") or []
                ],
            )
            if got != want:
                self.error(f"stream {request_id} differs from batch: {got!r:.200} != {want!r:.200}")
            self.streams_done += 1

    def redis_info(self) -> dict[str, Any]:
        import redis

        info = redis.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=2).info()
        return {
            "connected_clients": info["connected_clients"],
            "used_memory": info["used_memory"],
            "keys": sum(v.get("keys", 0) for k, v in info.items() if k.startswith("db") and isinstance(v, dict)),
        }

    async def sampler(self, started: float) -> None:
        while True:
            workers = children(self.service_pid)
            sample = {
                "t": round(time.monotonic() - started, 1),
                "requests": sum(len(v) for v in self.latency.values()),
                "errors": len(self.errors),
                "streams": self.streams_done,
                "parent": {"rss_kib": rss_kib(self.service_pid), "fds": fd_count(self.service_pid)},
                "workers": {str(pid): {"rss_kib": rss_kib(pid), "fds": fd_count(pid)} for pid in workers},
            }
            try:
                sample["redis"] = await asyncio.to_thread(self.redis_info)
            except Exception as exc:  # report, keep soaking
                sample["redis"] = {"error": str(exc)}
            self.samples.append(sample)
            print(json.dumps(sample), flush=True)
            if time.monotonic() >= self.stop_at:
                return
            await asyncio.sleep(min(SAMPLE_EVERY, max(0.0, self.stop_at - time.monotonic())))

    async def run(self) -> None:
        for seed in range(100, 106):  # built through the service once, before the clock starts
            await asyncio.to_thread(derender_case, self.url, seed, 60)
        started = time.monotonic()
        self.stop_at = started + self.duration
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        async with httpx.AsyncClient(timeout=10, limits=limits) as shared:
            stream_clients = [
                httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=1)) for _ in range(self.streams)
            ]
            try:
                await asyncio.gather(
                    self.sampler(started),
                    self.renders(shared),
                    *(self.stream_worker(i, c) for i, c in enumerate(stream_clients)),
                )
            finally:
                for client in stream_clients:
                    await client.aclose()

    def summary(self) -> dict[str, Any]:
        after = [s for s in self.samples if s["t"] >= WARM_UP] or self.samples
        first, last = after[0], self.samples[-1]
        workers = {}
        for pid, end in last["workers"].items():
            start = first["workers"].get(pid)
            workers[pid] = {
                "rss_start_mib": round(start["rss_kib"] / 1024, 1) if start else None,
                "rss_end_mib": round(end["rss_kib"] / 1024, 1),
                "rss_growth_pct": round(100 * (end["rss_kib"] / start["rss_kib"] - 1), 2) if start else None,
                "fds_start": start["fds"] if start else None,
                "fds_end": end["fds"],
                "fds_max": max(s["workers"].get(pid, {}).get("fds") or 0 for s in self.samples),
            }
        clients = [s["redis"]["connected_clients"] for s in self.samples if "connected_clients" in s["redis"]]
        latency = {
            kind: {
                "count": len(v),
                "p50_ms": round(statistics.median(v) * 1e3, 2),
                "p99_ms": round(sorted(v)[int(len(v) * 0.99) - 1] * 1e3, 2) if len(v) >= 100 else None,
            }
            for kind, v in sorted(self.latency.items())
        }
        requests = sum(len(v) for v in self.latency.values()) + len(self.errors)
        return {
            "duration_s": self.duration,
            "requests": requests,
            "errors": len(self.errors),
            "error_samples": self.errors[:5],
            "streams_checked": self.streams_done,
            "request_rate": round(requests / self.duration, 1),
            "latency": latency,
            "rss_window_s": [first["t"], last["t"]],
            "workers": workers,
            "worker_pids_changed": set(self.samples[0]["workers"]) != set(last["workers"]),
            "parent": {
                "rss_start_mib": round(first["parent"]["rss_kib"] / 1024, 1),
                "rss_end_mib": round(last["parent"]["rss_kib"] / 1024, 1),
                "fds_start": first["parent"]["fds"],
                "fds_end": last["parent"]["fds"],
            },
            "redis_connected_clients": {
                "min": min(clients, default=None),
                "max": max(clients, default=None),
                "first_after_warm_up": first["redis"].get("connected_clients"),
                "end": last["redis"].get("connected_clients"),
            },
            "redis_keys_end": last["redis"].get("keys"),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: build the tiny Qwen3 example model)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second offered (default 20)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write samples and the summary here (JSON)")
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        model = args.model
        if model is None:
            from render_service.model.example import build_example_model

            model = str(build_example_model(Path(tmp) / "tinyqwen3", "qwen3"))
        redis_port, port = free_port(), free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        log = open(Path(tmp) / "service.log", "wb")
        service = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "render_service.cli",
                "serve",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                str(args.workers),
                "--redis-url",
                f"redis://127.0.0.1:{redis_port}/0",
                "--snapshot-key",
                secrets.token_hex(16),
                *SERVER_FLAGS,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, service)
            soak = Soak(url, service.pid, redis_port, args.rate, args.duration)
            asyncio.run(soak.run())
            summary = soak.summary()
        finally:
            service.send_signal(signal.SIGTERM)
            try:
                service.wait(60)
            except subprocess.TimeoutExpired:
                service.kill()
            redis.terminate()
            redis.wait(10)
            log.close()
            service_log = (Path(tmp) / "service.log").read_text(errors="replace")
        print(json.dumps(summary, indent=2))
        problems = [line for line in service_log.splitlines() if " ERROR " in line or "Traceback" in line]
        if problems:
            print("service log errors:\n" + "\n".join(problems[:20]), file=sys.stderr)
        if args.out:
            args.out.write_text(
                json.dumps(
                    {
                        "command": " ".join(sys.argv),
                        "summary": summary,
                        "samples": soak.samples,
                        "service_log_errors": problems[:50],
                    },
                    indent=1,
                )
            )
        return 1 if summary["errors"] or problems else 0


if __name__ == "__main__":
    sys.exit(main())
