#!/usr/bin/env python3
"""`render-service serve` with an event-loop lag probe in every worker (for workers_bench.py --lag-study).

The service's own `render_event_loop_lag_seconds` histogram says how late a 50 ms timer fires,
in buckets. To tell *why* it is late, this launcher serves the very same app (same settings,
same worker pool, uvloop + httptools) wrapped in a thin ASGI layer that runs a second 50 ms
timer and keeps, per sample:

- `lag`: how late it fired (seconds, exact, not bucketed);
- `cpu`: CPU time of the loop's thread over the sample (schedstat, ns resolution): the loop
  held by callbacks (request parsing, rendering, writing) rather than sleeping in epoll;
- `wait`: run-queue delay of the loop's thread over the sample (schedstat's run_delay): time it
  was runnable but another task (wrk, the other worker, anything else) had the core.

`wait` bounds the scheduling share of a sample's lag from above (min(lag, wait)); the rest,
lag - wait, is at least what the loop's own callbacks (and libuv's 1 ms timer rounding) cost.

It also times every step of every asyncio task (a request's handler runs in one task per
request, uvicorn's `run_asgi`): wall and thread-CPU time of each step, i.e. how long the loop
is held by one piece of Python work, and how much of that hold the thread spent off the CPU.
Tasks are then pure-Python `asyncio.Task`s (a few microseconds more per step than the C ones).
`GET /_probe/lag` returns this worker's samples and steps (a new connection lands on any worker).

    python3 -m benchmarks.lag_probe serve MODEL --workers 2 [render-service serve flags]
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import threading
import time
from typing import Any

import orjson

from render_service import cli
from render_service.model.loader import load_model
from render_service.server import workers
from render_service.server.app import create_app

INTERVAL = 0.05  # the service's own sampler's interval


class TimedTask(asyncio.tasks._PyTask):  # type: ignore[name-defined,misc]
    """An asyncio Task that records (end time, wall s, thread CPU s) of each of its steps."""

    def __init__(
        self, coro: Any, *, loop: Any, steps: collections.deque[tuple[float, float, float]], **kwargs: Any
    ) -> None:
        self._steps = steps  # set before the base class schedules the first step
        super().__init__(coro, loop=loop, **kwargs)

    def _Task__step(self, exc: BaseException | None = None) -> None:  # the base class's private __step
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            super()._Task__step(exc)
        finally:
            end = time.perf_counter()
            self._steps.append((time.time(), end - wall, time.thread_time() - cpu))


class LagProbe:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.samples: collections.deque[tuple[float, float, float, float]] = collections.deque(maxlen=100_000)
        self.steps: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=1_000_000)
        self.task: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":

            async def send_started(message: dict[str, Any]) -> None:
                if message["type"] == "lifespan.startup.complete":
                    loop = asyncio.get_running_loop()
                    steps = self.steps

                    def factory(loop: Any, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
                        return TimedTask(coro, loop=loop, steps=steps, **kwargs)

                    loop.set_task_factory(factory)
                    self.task = loop.create_task(self.sample())
                await send(message)

            await self.app(scope, receive, send_started)
            return
        if scope["type"] == "http" and scope["path"] == "/_probe/lag":
            body = orjson.dumps(
                {
                    "worker": os.environ.get("RENDER_WORKER_ID", "0"),
                    "pid": os.getpid(),
                    "samples": list(self.samples),
                    "steps": list(self.steps),
                }
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    async def sample(self) -> None:
        fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)

        def schedstat() -> tuple[int, int]:
            cpu, wait = os.pread(fd, 128, 0).split()[:2]
            return int(cpu), int(wait)

        perf = time.perf_counter
        while True:
            cpu0, wait0 = schedstat()
            start = perf()
            await asyncio.sleep(INTERVAL)
            end = perf()
            cpu1, wait1 = schedstat()
            self.samples.append(
                (time.time(), max(0.0, end - start - INTERVAL), (cpu1 - cpu0) / 1e9, (wait1 - wait0) / 1e9)
            )


def main(argv: list[str]) -> int:
    args = cli._parser().parse_args(argv)
    settings = cli.settings_from_args(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = load_model(settings)
    count = settings.workers or workers.available_cpus()
    return workers.serve(
        lambda: LagProbe(create_app(settings, model)), settings.host, settings.port, count, settings.log_level
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
