"""Gateway mode: `render-service serve MODEL --engine URL ...` (or `--prefill-engine` and
`--decode-engine` pools) answers /v1/chat/completions, /v1/completions, /v1/messages and
/v1/responses as `vllm serve` does, with vLLM `--tokens-only` engines doing the generation.

Each request renders here (render/pipeline), runs on one engine's `/inference/v1/generate`
(`client`, over the `pool`), and derenders here: batch through derender/pipeline, streaming
through `streams` with the parser state alive for the whole request. `handlers` holds the
endpoints, `anthropic` and `responses` those APIs' answer shapes, `disagg` the prefill/decode
hand-off, `metrics` the Prometheus series.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from render_service.gateway import client
from render_service.gateway.disagg import Disaggregated
from render_service.gateway.metrics import GatewayMetrics
from render_service.gateway.pool import EnginePool
from render_service.server.metrics import Metrics
from render_service.settings import Settings


class Gateway:
    """What the gateway endpoints share in one worker: the engine pools and the metrics.

    `pool` serves every request with `--engine`; with `--prefill-engine` / `--decode-engine` it is
    the decode pool, and `disagg` runs the prefill hop before it.
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.metrics = GatewayMetrics(metrics.registry)

        def pool(urls: list[str]) -> EnginePool:
            return EnginePool(
                urls,
                self.metrics,
                timeout=settings.engine_timeout,
                health_interval=settings.engine_health_interval,
                max_inflight=settings.engine_max_inflight,
                affinity_prefix_tokens=settings.engine_affinity_prefix_tokens,
            )

        self.pool = pool(settings.engine or settings.decode_engine)
        self.disagg: Disaggregated | None = None
        self.pools = [self.pool]
        if settings.prefill_engine:
            prefill = pool(settings.prefill_engine)
            self.pools.append(prefill)
            self.disagg = Disaggregated(
                prefill,
                self.pool,
                self.metrics,
                fallback_recompute=settings.prefill_fallback_recompute,
                kv_by_prompt=settings.prefill_kv_by_prompt,
            )

    @staticmethod
    def of(request: Request) -> Gateway:
        gateway: Gateway = request.app.state.gateway
        return gateway

    def start(self) -> None:
        """Start the health probes (on the running loop)."""
        for pool in self.pools:
            pool.start()

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming generate of a rendered `GenerateRequest` (both hops with P/D)."""
        if self.disagg is not None:
            return await self.disagg.generate(body)
        return await client.generate(self.pool, body)

    async def open_stream(
        self, body: dict[str, Any], while_waiting: Callable[[], None] | None = None
    ) -> client.EngineStream:
        """A streaming generate, open once its first chunk has arrived; `while_waiting` runs once
        the (decode) request is written (`client.open_stream`)."""
        if self.disagg is not None:
            return await self.disagg.open_stream(body, while_waiting)
        return await client.open_stream(self.pool, body, while_waiting)

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()
