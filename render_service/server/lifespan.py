"""Start-up and shutdown: load the model and stores, watch the event loop, run the audit; then
close what start-up opened (Redis connections, the audit thread)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from render_service.server.metrics import Metrics
from render_service.server.state import State

# The HTTP edge logs under one name (operators' log filters use it), whichever module writes.
logger = logging.getLogger("render_service.server.app")

# Seconds between the lag watcher's timer ticks: each tick wakes an idle worker (0.1-0.2 ms of CPU
# on a shared VM), so 4 a second, not 20; a block of the loop shows in the next tick's lateness.
LOOP_LAG_INTERVAL = 0.25


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    state: State = app.state.render
    settings = state.settings
    model = state.load()
    await state.store.connect()  # a first Redis connection before serving (a TLS handshake is slow)
    state.metrics.worker_info.labels(os.environ.get("RENDER_WORKER_ID", "0")).set(1)
    lag_task = asyncio.get_running_loop().create_task(watch_loop_lag(state.metrics))
    gateway = None
    if settings.gateway_mode:
        from render_service.gateway import Gateway  # gateway mode only

        gateway = app.state.gateway = Gateway(settings, state.metrics)
        gateway.start()
    if settings.audit_engine or settings.audit_render:
        from render_service.audit.audit import ContinuousAudit  # only when an audit is configured

        state.audit = ContinuousAudit(
            settings.audit_render,
            settings.audit_engine,
            local=(settings, model),
            registry=state.metrics.registry,
            interval=settings.audit_interval,
            api_key=settings.api_key,
        ).start()
    logger.info(
        "ready: %s (max_model_len=%d, tokenizer backend %s, fingerprint %s)",
        settings.served_names[0],
        model.max_model_len,
        model.backend.name,
        state.fingerprint["fingerprint"],
    )
    yield
    lag_task.cancel()
    if gateway is not None:
        await gateway.close()
    if state.audit is not None:
        state.audit.stop()
    await state.store.close()
    if state.generated is not None:
        await state.generated.close()
    if state.image_tier is not None:
        await state.image_tier.close()


async def watch_loop_lag(metrics: Metrics, interval: float = LOOP_LAG_INTERVAL) -> None:
    """CPU work runs inline on each worker's loop; this proves it never blocks the loop long, and
    separates that from time the OS kept the loop off a CPU (a saturated or shared machine).
    The schedstat file stays open (re-read at offset 0): a tick costs one read, not the five
    syscalls of opening, checking and closing it again, on every tick of every worker."""
    schedstat = SchedStat()
    waited = schedstat.runqueue_wait_seconds()
    try:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(interval)
            lag = max(0.0, time.perf_counter() - start - interval)
            metrics.loop_lag.observe(lag)
            if waited is not None:
                now = schedstat.runqueue_wait_seconds()
                if now is not None:
                    metrics.loop_runqueue.inc(max(0.0, now - waited))
                    metrics.loop_held.observe(max(0.0, lag - (now - waited)))
                    waited = now
    finally:
        schedstat.close()


class SchedStat:
    """This thread's /proc/thread-self/schedstat, opened once (by the thread that reads it: the
    path names the opening thread)."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = None

    def runqueue_wait_seconds(self) -> float | None:
        """Seconds this thread has waited runnable for a CPU (second field, ns); None elsewhere."""
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 256, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def runqueue_wait_seconds() -> float | None:
    """Seconds this thread has waited runnable for a CPU (Linux schedstat); None elsewhere."""
    schedstat = SchedStat()
    try:
        return schedstat.runqueue_wait_seconds()
    finally:
        schedstat.close()
