"""Gateway mode: `render-service serve MODEL --engine URL ...` answers /v1/chat/completions and
/v1/completions as `vllm serve` does, with vLLM `--tokens-only` engines doing the generation.

Each request renders here (render/pipeline), runs on one engine's `/inference/v1/generate`
(`client`, over the `pool`), and derenders here: batch through derender/pipeline, streaming
through `streams` with the parser state alive for the whole request. `handlers` holds the
endpoints, `metrics` the Prometheus series.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from render_service.gateway import client
from render_service.gateway.metrics import GatewayMetrics
from render_service.gateway.pool import EnginePool
from render_service.server.metrics import Metrics
from render_service.settings import Settings


class Gateway:
    """What the gateway endpoints share in one worker: the engine pool and the metrics."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.metrics = GatewayMetrics(metrics.registry)
        self.pool = EnginePool(
            settings.engine,
            self.metrics,
            timeout=settings.engine_timeout,
            health_interval=settings.engine_health_interval,
            max_inflight=settings.engine_max_inflight,
        )

    @staticmethod
    def of(request: Request) -> Gateway:
        gateway: Gateway = request.app.state.gateway
        return gateway

    def start(self) -> None:
        """Start the health probes (on the running loop)."""
        self.pool.start()

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming generate of a rendered `GenerateRequest`."""
        return await client.generate(self.pool, body)

    async def open_stream(self, body: dict[str, Any]) -> client.EngineStream:
        """A streaming generate, open once its first chunk has arrived."""
        return await client.open_stream(self.pool, body)

    async def close(self) -> None:
        await self.pool.close()
