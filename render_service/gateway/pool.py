"""The engine pool: which `--tokens-only` engine serves a request, and how each engine is doing.

Picking is least-outstanding-requests among the healthy engines (ties go round-robin, so an idle
pool still spreads load). An engine is unhealthy after a failed request or a failed `GET /health`
probe, and healthy again after a probe answers 200; when every engine is unhealthy the pool still
tries them (a probe may simply not have run yet), least recently failed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field

import httpx

from render_service.gateway.metrics import GatewayMetrics

logger = logging.getLogger("render_service.gateway")

HEALTH_TIMEOUT = 2.0  # seconds a /health probe may take


@dataclass(eq=False)
class Engine:
    """One engine as this worker sees it."""

    url: str
    healthy: bool = True
    inflight: int = 0
    failed_at: float = 0.0  # monotonic time of the last failure (0: never)
    order: int = field(default=0)  # round-robin tie-breaker: when it was last picked


class NoEngineError(Exception):
    """No engine can take a request right now (all busy past their limit, or none configured)."""


class EnginePool:
    def __init__(
        self,
        urls: list[str],
        metrics: GatewayMetrics,
        *,
        timeout: float,
        health_interval: float,
        max_inflight: int = 0,
        api_key: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("an engine pool needs at least one engine URL")
        self.engines = [Engine(url) for url in urls]
        self.metrics = metrics
        self.timeout = timeout
        self.health_interval = health_interval
        self.max_inflight = max_inflight
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        # One connection pool per worker; `timeout` bounds every silence (connect, first byte, between bytes).
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            headers=headers,
        )
        self._ticket = itertools.count(1)
        self._health_task: asyncio.Task[None] | None = None
        for engine in self.engines:
            metrics.engine_healthy.labels(engine.url).set(1)
            metrics.engine_inflight.labels(engine.url).set(0)

    # -- picking ----------------------------------------------------------------------------

    def pick(self, exclude: set[Engine] | frozenset[Engine] = frozenset()) -> Engine:
        """The engine for the next attempt: healthy first, then fewest in flight, then least recently picked."""
        candidates = [e for e in self.engines if e not in exclude]
        if self.max_inflight:
            candidates = [e for e in candidates if e.inflight < self.max_inflight]
        if not candidates:
            raise NoEngineError(
                "every engine is at --engine-max-inflight" if self.max_inflight else "no engine left to try"
            )
        healthy = [e for e in candidates if e.healthy]
        if healthy:
            engine = min(healthy, key=lambda e: (e.inflight, e.order))
        else:  # all marked down (a probe may not have run since): the least loaded, longest ago failed
            engine = min(candidates, key=lambda e: (e.inflight, e.failed_at))
        engine.order = next(self._ticket)
        return engine

    def acquire(self, engine: Engine) -> None:
        engine.inflight += 1
        self.metrics.engine_inflight.labels(engine.url).set(engine.inflight)
        self.metrics.engine_requests.labels(engine.url).inc()

    def release(self, engine: Engine) -> None:
        engine.inflight -= 1
        self.metrics.engine_inflight.labels(engine.url).set(engine.inflight)

    def succeeded(self, engine: Engine) -> None:
        """An engine that answered is up, whatever the last probe said."""
        if not engine.healthy:
            engine.healthy = True
            self.metrics.engine_healthy.labels(engine.url).set(1)

    def failed(self, engine: Engine, kind: str) -> None:
        """An attempt on `engine` failed (`kind`: connect, timeout, status, dropped, ...): mark it down."""
        engine.healthy = False
        engine.failed_at = time.monotonic()
        self.metrics.engine_errors.labels(engine.url, kind).inc()
        self.metrics.engine_healthy.labels(engine.url).set(0)

    # -- health -----------------------------------------------------------------------------

    def start(self) -> None:
        """Probe every engine now and then every `health_interval` seconds (on the running loop)."""
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._watch_health())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        await self.client.aclose()

    async def check_health(self) -> None:
        await asyncio.gather(*(self._probe(engine) for engine in self.engines))

    async def _watch_health(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.health_interval)

    async def _probe(self, engine: Engine) -> None:
        try:
            response = await self.client.get(f"{engine.url}/health", timeout=HEALTH_TIMEOUT)
            ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok != engine.healthy:
            logger.info("engine %s is %s", engine.url, "healthy again" if ok else "unhealthy")
        if ok:
            engine.healthy = True
        elif engine.healthy:
            self.failed(engine, "health")
        self.metrics.engine_healthy.labels(engine.url).set(1 if ok else 0)
