"""The gateway's Prometheus series, registered on the worker's registry next to the render tier's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Token latencies: sub-millisecond (a busy stream) to tens of seconds (a long prefill, a queue).
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# The gateway's own share of a stream's latency: tens of microseconds to a few milliseconds.
_ADDED_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


@dataclass(frozen=True, slots=True)
class StreamSeries:
    """One endpoint's per-stream series, resolved once (a `labels()` call takes a lock and hashes
    its values: a stream would pay it on its first token's path)."""

    ttft: Histogram
    inter_token: Histogram
    to_engine: Histogram
    to_client: Histogram


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._streams: dict[str, StreamSeries] = {}
        self._inflight: dict[str, list[Any]] = {}  # engine URL -> its `Engine`s (one per pool it is in)
        self.ttft = Histogram(
            "render_gateway_time_to_first_token_seconds",
            "From the request's arrival to its first generated token (render, queue and prefill)",
            ["endpoint"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.added = Histogram(
            "render_gateway_added_latency_seconds",
            "The gateway's own part of a stream's time to first token: to_engine, from the request's "
            "arrival to its generate request written to the engine (render included; not with P/D, "
            "where the prefill hop lies between); to_client, from the engine's first chunk arriving "
            "to its client bytes written",
            ["endpoint", "phase"],
            buckets=_ADDED_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "render_gateway_inter_token_seconds",
            "Time between consecutive engine chunks of a stream, per token",
            ["endpoint"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.engine_inflight = Gauge(
            "render_gateway_engine_inflight_requests",
            "Requests in flight on each engine (this worker)",
            ["engine"],
            registry=r,
        )
        self.engine_requests = Counter(
            "render_gateway_engine_requests", "Attempts sent to each engine", ["engine"], registry=r
        )
        self.engine_errors = Counter(
            "render_gateway_engine_errors",
            "Failed attempts per engine (connect, timeout, status, dropped, stream_error, health)",
            ["engine", "kind"],
            registry=r,
        )
        self.engine_healthy = Gauge(
            "render_gateway_engine_healthy", "1 while the engine answers /health and requests", ["engine"], registry=r
        )
        self.retries = Counter(
            "render_gateway_retries",
            "Requests sent to another engine after a failure before the first token",
            registry=r,
        )
        self.disconnects = Counter(
            "render_gateway_client_disconnects",
            "Requests whose client left before the answer (engine request closed)",
            registry=r,
        )
        self.pd_requests = Counter(
            "render_gateway_pd_requests",
            "Requests through the prefill/decode pools, by outcome: remote_prefill (KV handed off), "
            "prompt_keyed (handed off through a connector keyed by the prompt, --prefill-kv-by-prompt), "
            "recompute (prefill failed, decoded alone), prefill_failed (503), prefill_rejected (the "
            "prefill engine's 4xx), passthrough (the request carried its own kv_transfer_params)",
            ["outcome"],
            registry=r,
        )
        self.affinity = Counter(
            "render_gateway_affinity_picks",
            "Engine picks under prefix affinity: hit (the prefix's engine), miss (new or unusable prefix)",
            ["result"],
            registry=r,
        )

    def stream_series(self, endpoint: str) -> StreamSeries:
        series = self._streams.get(endpoint)
        if series is None:
            series = self._streams[endpoint] = StreamSeries(
                self.ttft.labels(endpoint),
                self.inter_token.labels(endpoint),
                self.added.labels(endpoint, "to_engine"),
                self.added.labels(endpoint, "to_client"),
            )
        return series

    def track_inflight(self, engine: Any) -> None:
        """Export `engine.inflight` (a `pool.Engine`) as its URL's in-flight gauge, read when
        scraped rather than set on every request (summed over the pools the URL is in)."""
        engines = self._inflight.setdefault(engine.url, [])
        engines.append(engine)
        self.engine_inflight.labels(engine.url).set_function(lambda: sum(e.inflight for e in engines))
