"""Prometheus metrics: one registry per app, so tests and several apps in one process stay apart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from render_service.render.history import HistoryRenderer
    from render_service.render.prefix import PrefixGuard
    from render_service.render.segments import SegmentEncoder

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self._endpoints: dict[str, EndpointMetrics] = {}
        self.registry = CollectorRegistry()
        r = self.registry
        # process_cpu_seconds_total, resident memory, ...: what sizing reads from every worker.
        ProcessCollector(registry=r)
        self.requests = Counter(
            "render_requests", "Requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "render_request_seconds", "Wall time per request", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.cpu_seconds = Counter("render_cpu_seconds", "Thread CPU time spent per endpoint", ["endpoint"], registry=r)
        self.prompt_tokens = Counter("render_prompt_tokens", "Prompt tokens rendered", registry=r)
        self.tokenizer_backend = Gauge(
            "render_tokenizer_backend_info", "Tokenizer backend in use (1)", ["backend"], registry=r
        )
        # Multimodal: processed images served from the content-hash cache vs processed.
        self.mm_cache_hits = Counter("render_mm_cache_hits", "Images served from the processed-image cache", registry=r)
        self.mm_cache_misses = Counter("render_mm_cache_misses", "Images decoded and processed", registry=r)
        self.mm_cache_bytes = Gauge("render_mm_cache_bytes", "Bytes held by the processed-image cache", registry=r)
        # The optional Redis tier of that cache (--mm-cache-redis): asked for the local misses.
        self.mm_redis_hits = Counter(
            "render_mm_cache_redis_hits", "Images served from Redis (not processed here)", registry=r
        )
        self.mm_redis_misses = Counter(
            "render_mm_cache_redis_misses",
            "Local cache misses Redis did not serve (absent, rejected, Redis down)",
            registry=r,
        )
        self.mm_redis_rejected = Counter(
            "render_mm_cache_redis_rejected",
            "Redis entries refused (bad MAC, malformed, other format version)",
            ["reason"],
            registry=r,
        )
        self.mm_redis_errors = Counter(
            "render_mm_cache_redis_errors", "Redis failures (images processed here)", ["op"], registry=r
        )
        self.mm_redis_fetched_bytes = Counter(
            "render_mm_cache_redis_fetched_bytes", "Bytes of processed images read from Redis", registry=r
        )
        self.mm_redis_stored = Counter(
            "render_mm_cache_redis_stored", "Processed images written to Redis", ["kind"], registry=r
        )
        self.mm_redis_oversized = Counter(
            "render_mm_cache_redis_oversized",
            "Processed images not stored: above --mm-cache-redis-max-entry-bytes",
            registry=r,
        )
        self.model_info = Gauge("render_model_info", "Loaded model (1)", ["model", "max_model_len"], registry=r)
        # Snapshot store and derender (issue: derender).
        self.snapshot_hits = Counter("render_snapshot_hits", "Parser snapshots found", ["tier"], registry=r)
        self.snapshot_misses = Counter("render_snapshot_misses", "Parser snapshots missing", registry=r)
        self.snapshot_rejected = Counter("render_snapshot_rejected", "Snapshots rejected", ["reason"], registry=r)
        self.replays = Counter("render_stream_replays", "Streaming chunks served by replay", registry=r)
        self.replayed_tokens = Counter("render_stream_replayed_tokens", "Tokens replayed", registry=r)
        # The vLLM adapter's live parser streams (render_service/adapter): a miss replays once.
        self.adapter_stream_hits = Counter(
            "render_adapter_stream_hits", "Adapter stream chunks served by a live parser of this worker", registry=r
        )
        self.adapter_stream_misses = Counter(
            "render_adapter_stream_misses",
            "Adapter stream chunks that rebuilt the vLLM parser (first chunk, or replay of the carried output)",
            registry=r,
        )
        self.adapter_stream_cache_bytes = Gauge(
            "render_adapter_stream_cache_bytes", "Estimated bytes of live adapter parser streams", registry=r
        )
        self.snapshot_bytes = Histogram(
            "render_snapshot_bytes",
            "Encoded snapshot size",
            registry=r,
            buckets=(64, 128, 256, 512, 1024, 2048, 4096, 16384, 65536),
        )
        self.redis_latency = Histogram(
            "render_redis_seconds", "Redis round trips", ["op"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.redis_errors = Counter("render_redis_errors", "Redis failures (served by replay)", ["op"], registry=r)

        # Token-identical continuation (--preserve-generated-tokens; render/continuation.py).
        self.generated_issued = Counter(
            "render_continuation_handles_issued", "Generated-token handles returned by derender", registry=r
        )
        self.generated_skipped = Counter(
            "render_continuation_handles_skipped",
            "Derendered replies that asked for a handle and got none, by reason",
            ["reason"],
            registry=r,
        )
        self.generated_hits = Counter(
            "render_continuation_hits", "Assistant turns whose generated ids a render spliced in", registry=r
        )
        self.generated_misses = Counter(
            "render_continuation_misses",
            "Assistant turns with a handle whose ids could not be used, by cause",
            ["cause"],
            registry=r,
        )
        self.generated_renders = Counter(
            "render_continuation_renders",
            "Chat renders that asked for continuation, by whether the prompt extends the previous turn's "
            "prompt + output (and why not)",
            ["prefix_extends", "reason"],
            registry=r,
        )

        # Worker pool (one registry per worker process).
        self.worker_info = Gauge("render_worker_info", "This worker's index (1)", ["worker"], registry=r)
        self.inflight = Gauge("render_inflight_requests", "Requests in flight in this worker (the queue)", registry=r)
        self.rejected = Counter("render_overload_rejections", "Requests refused with 503 (back-pressure)", registry=r)
        lag_buckets = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.5)
        self.loop_lag = Histogram(
            "render_event_loop_lag_seconds",
            "How late a 250 ms timer fires on the event loop",
            buckets=lag_buckets,
            registry=r,
        )
        # Lag minus the time the loop thread sat runnable in the kernel's run queue (Linux schedstat):
        # what this process's own work held the loop, apart from CPU starvation by other processes.
        self.loop_held = Histogram(
            "render_event_loop_held_seconds",
            "Event-loop lag not explained by waiting for a CPU (the loop's own work)",
            buckets=lag_buckets,
            registry=r,
        )
        self.loop_runqueue = Counter(
            "render_event_loop_runqueue_wait_seconds",
            "Time the event-loop thread waited for a CPU while runnable",
            registry=r,
        )

    def watch_prompt_reuse(
        self, segments: SegmentEncoder | None, guard: PrefixGuard | None, history: HistoryRenderer | None = None
    ) -> None:
        """Export the segment cache's, the prefix guard's and incremental templating's counters
        (read at scrape time: the render path only bumps plain integers)."""
        self.registry.register(_PromptReuseCollector(segments, guard, history))

    def export(self) -> bytes:
        return generate_latest(self.registry)

    def endpoint(self, name: str) -> EndpointMetrics:
        """The metrics of endpoint `name`, their label children looked up once (not per request)."""
        found = self._endpoints.get(name)
        if found is None:
            found = self._endpoints[name] = EndpointMetrics(self, name)
        return found

    @contextmanager
    def measure(self, endpoint: str) -> Iterator[None]:
        wall = time.perf_counter()
        cpu = time.thread_time()
        try:
            yield
        finally:
            self.endpoint(endpoint).observe(time.thread_time() - cpu, time.perf_counter() - wall)


class EndpointMetrics:
    """One endpoint's label children of the request counter, CPU counter and latency histogram."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._metrics = metrics
        self.name = name
        self._cpu = metrics.cpu_seconds.labels(name)
        self._latency = metrics.latency.labels(name)
        self._statuses: dict[int, Any] = {}

    def observe(self, cpu_seconds: float, wall_seconds: float) -> None:
        self._cpu.inc(cpu_seconds)
        self._latency.observe(wall_seconds)

    def count(self, status_code: int) -> None:
        child = self._statuses.get(status_code)
        if child is None:
            child = self._statuses[status_code] = self._metrics.requests.labels(self.name, str(status_code))
        child.inc()


def _unlabelled(
    family: type[CounterMetricFamily | GaugeMetricFamily], name: str, help_text: str, value: float
) -> Metric:
    metric = family(name, help_text)
    metric.add_metric([], value)
    return metric


class _PromptReuseCollector(Collector):
    def __init__(
        self, segments: SegmentEncoder | None, guard: PrefixGuard | None, history: HistoryRenderer | None
    ) -> None:
        self._segments = segments
        self._guard = guard
        self._history = history

    def collect(self) -> Iterator[Metric]:
        enabled = GaugeMetricFamily("render_segment_cache_enabled", "Segment cache on (1) or off (0)")
        enabled.add_metric([], 1 if self._segments is not None else 0)
        yield enabled
        if self._segments is not None:
            stats = self._segments.stats()
            for name, help_text, value in (
                ("render_segment_cache_hits", "Prompt pieces whose ids came from the segment cache", stats.hits),
                ("render_segment_cache_misses", "Prompt pieces encoded (not in the segment cache)", stats.misses),
                ("render_segment_cache_hit_tokens", "Ids served from the segment cache", stats.hit_tokens),
                ("render_segment_cache_miss_tokens", "Ids encoded on a segment-cache miss", stats.miss_tokens),
                ("render_segment_prefix_reuses", "Prompts that copied an earlier turn's ids", stats.reused_prompts),
                (
                    "render_segment_prefix_reused_tokens",
                    "Ids copied from an earlier turn's prompt",
                    stats.reused_tokens,
                ),
            ):
                yield _unlabelled(CounterMetricFamily, name, help_text, value)
            for name, help_text, value in (
                ("render_segment_cache_bytes", "Bytes held by the segment cache (pieces)", stats.bytes),
                ("render_segment_cache_entries", "Pieces held by the segment cache", stats.entries),
                (
                    "render_segment_cache_max_bytes",
                    "The segment cache's budget for pieces (half of --segment-cache-bytes)",
                    stats.max_bytes,
                ),
            ):
                yield _unlabelled(GaugeMetricFamily, name, help_text, value)
        if self._guard is not None:
            statuses, causes, records, held = self._guard.stats()
            checks = CounterMetricFamily(
                "render_prefix_checks", "Chat renders by prefix-stability verdict", labels=["status"]
            )
            for status, value in statuses.items():
                checks.add_metric([status], value)
            yield checks
            breaks = CounterMetricFamily(
                "render_prefix_breaks",
                "Turns whose prompt does not extend the previous prompt + output, by cause",
                labels=["cause"],
            )
            for cause, value in causes.items():
                breaks.add_metric([cause], value)
            yield breaks
            for name, help_text, value in (
                ("render_prefix_records", "Recent prompts held for the next turn's check", records),
                ("render_prefix_record_bytes", "Bytes held by those prompts", held),
            ):
                yield _unlabelled(GaugeMetricFamily, name, help_text, value)
        if self._history is not None:
            history = self._history.stats()
            for name, help_text, value in (
                (
                    "render_history_incremental",
                    "Chat prompts templated from the previous turn's prompt + the new messages",
                    history.incremental,
                ),
                ("render_history_full", "Chat prompts with a known previous turn rendered in full", history.full),
                ("render_history_verified", "Incremental renders checked against a full render", history.verified),
                (
                    "render_history_mismatches",
                    "Checked incremental renders that differed (that kind of turn then renders in full)",
                    history.mismatches,
                ),
            ):
                yield _unlabelled(CounterMetricFamily, name, help_text, value)
