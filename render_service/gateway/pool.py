"""The engine pool: which `--tokens-only` engine serves a request, and how each engine is doing.

Picking is least-outstanding-requests among the healthy engines (ties go round-robin, so an idle
pool still spreads load). With prefix affinity (`--engine-affinity-prefix-tokens N`), a request
goes to the engine that rendezvous hashing assigns its first N prompt tokens among the healthy
engines, so requests sharing a prefix meet the KV cache the first one left there; every worker
and replica computes the same assignment without sharing state, and an engine going down moves
only its own prefixes. An assigned engine more than `AFFINITY_SLACK` requests busier than the
least loaded one is passed over (a hot prefix must not pile onto one engine). An engine is unhealthy after a failed request or a failed `GET /health`
probe, and healthy again after a probe answers 200; when every engine is unhealthy the pool still
tries them (a probe may simply not have run yet), least recently failed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from render_service.gateway.connection import ConnectionPool, TransportError
from render_service.gateway.metrics import GatewayMetrics

logger = logging.getLogger("render_service.gateway")

HEALTH_TIMEOUT = 2.0  # seconds a /health probe may take
AFFINITY_SLACK = 8  # requests in flight above the least loaded engine that affinity tolerates


@dataclass(eq=False)
class Engine:
    """One engine as this worker sees it."""

    url: str
    healthy: bool = True
    inflight: int = 0
    failed_at: float = 0.0  # monotonic time of the last failure (0: never)
    order: int = field(default=0)  # round-robin tie-breaker: when it was last picked
    # Its labelled series, looked up once (a `labels()` call takes a lock and hashes the labels).
    requests_counter: Any = None

    @property
    def key(self) -> bytes:
        return self.url.encode()


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
        affinity_prefix_tokens: int = 0,
    ) -> None:
        if not urls:
            raise ValueError("an engine pool needs at least one engine URL")
        self.engines = [Engine(url) for url in urls]
        self.metrics = metrics
        self.timeout = timeout
        self.health_interval = health_interval
        self.max_inflight = max_inflight
        self.affinity_prefix_tokens = affinity_prefix_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        # One connection pool per worker; `timeout` bounds every silence (connect, first byte, between bytes).
        self.client = ConnectionPool(timeout=timeout, connect_timeout=min(timeout, 10.0), headers=headers)
        self._ticket = itertools.count(1)
        self._health_task: asyncio.Task[None] | None = None
        for engine in self.engines:
            metrics.engine_healthy.labels(engine.url).set(1)
            metrics.track_inflight(engine)
            engine.requests_counter = metrics.engine_requests.labels(engine.url)

    # -- picking ----------------------------------------------------------------------------

    def pick(
        self, exclude: set[Engine] | frozenset[Engine] = frozenset(), prompt: Sequence[int] | None = None
    ) -> Engine:
        """The engine for the next attempt: the prompt prefix's engine under affinity, else healthy
        first, then fewest in flight, then least recently picked."""
        candidates = [e for e in self.engines if e not in exclude]
        if self.max_inflight:
            candidates = [e for e in candidates if e.inflight < self.max_inflight]
        if not candidates:
            raise NoEngineError(
                "every engine is at --engine-max-inflight" if self.max_inflight else "no engine left to try"
            )
        healthy = [e for e in candidates if e.healthy]
        engine = None
        if healthy and prompt and self.affinity_prefix_tokens:
            engine = self._affine(healthy, prompt)
            self.metrics.affinity.labels("hit" if engine is not None else "miss").inc()
        if engine is None and healthy:
            engine = min(healthy, key=lambda e: (e.inflight, e.order))
        elif engine is None:  # all marked down (a probe may not have run since): the least loaded, longest ago failed
            engine = min(candidates, key=lambda e: (e.inflight, e.failed_at))
        engine.order = next(self._ticket)
        return engine

    def _affine(self, healthy: list[Engine], prompt: Sequence[int]) -> Engine | None:
        """The prefix's engine by rendezvous hashing (highest hash of prefix and engine), unless it
        is over `AFFINITY_SLACK` busier than the least loaded engine."""
        prefix = array("q", prompt[: self.affinity_prefix_tokens]).tobytes()
        digest = hashlib.blake2b(prefix, digest_size=16).digest()
        engine = max(healthy, key=lambda e: hashlib.blake2b(digest + e.key, digest_size=8).digest())
        if engine.inflight > min(e.inflight for e in healthy) + AFFINITY_SLACK:
            return None
        return engine

    def acquire(self, engine: Engine) -> None:
        engine.inflight += 1  # the gauge reads it at scrape time (`GatewayMetrics.track_inflight`)
        engine.requests_counter.inc()

    def release(self, engine: Engine) -> None:
        engine.inflight -= 1

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
            response = await self.client.request("GET", f"{engine.url}/health", timeout=HEALTH_TIMEOUT)
            try:
                await response.read()
            finally:
                await response.aclose()
            ok = response.status_code == 200
        except TransportError:
            ok = False
        if ok != engine.healthy:
            logger.info("engine %s is %s", engine.url, "healthy again" if ok else "unhealthy")
        if ok:
            engine.healthy = True
        elif engine.healthy:
            self.failed(engine, "health")
        self.metrics.engine_healthy.labels(engine.url).set(1 if ok else 0)
