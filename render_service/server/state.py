"""`State`: everything the handlers read, built once per app and loaded at start-up.

The app holds it as `app.state.render`; `State.of(request)` is how a handler reaches it.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from render_service.audit.fingerprint import components_header, fingerprint
from render_service.derender import pipeline as derender
from render_service.derender.snapshots import LocalStore, RedisStore, SnapshotCodec, SnapshotStore
from render_service.exceptions import RenderServiceError
from render_service.model.loader import Model, load_model, release_freed_memory
from render_service.multimodal import imagecache
from render_service.render import pipeline as render
from render_service.server.metrics import Metrics
from render_service.settings import Settings

if TYPE_CHECKING:  # imported when an audit is configured (see `lifespan`)
    from render_service.audit.audit import ContinuousAudit

# The HTTP edge logs under one name (operators' log filters use it), whichever module writes.
logger = logging.getLogger("render_service.server.app")


class State:
    """Everything a handler reads: immutable after start-up, except the in-flight counters."""

    # Set by `load()`, before the first request is served (the lifespan runs it).
    context: render.RenderContext
    derender: derender.DerenderContext
    fingerprint: dict[str, Any]
    fingerprint_components: str
    store: SnapshotStore

    def __init__(self, settings: Settings, model: Model | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.model = model
        self.ready = False
        self.started = int(time.time())
        self.inflight = 0
        self.mm_hits_seen = self.mm_misses_seen = 0  # image-cache counters already exported
        self.audit: ContinuousAudit | None = None
        self.image_tier: imagecache.ImageTier | None = None  # --mm-cache-redis

    @staticmethod
    def of(request: Request) -> State:
        """The State of the app serving `request`."""
        state: State = request.app.state.render
        return state

    def load(self) -> Model:
        """Load the model (unless given), build every context and store, warm up; then ready."""
        model = self.model = self.model if self.model is not None else load_model(self.settings)
        self.context = render.make_context(model, self.settings)
        self.fingerprint = fingerprint(self.settings, model)
        self.fingerprint_components = components_header(self.fingerprint)
        self.store = build_store(self.settings, self.metrics)
        self.derender = derender.make_context(self.context, self.fingerprint["fingerprint"], self.store, self.metrics)
        self.image_tier = build_image_tier(self.settings, self.context, self.fingerprint, self.metrics)
        self.warm_up()
        release_freed_memory()
        self.metrics.tokenizer_backend.labels(model.backend.name).set(1)
        self.metrics.model_info.labels(self.settings.served_names[0], str(model.max_model_len)).set(1)
        self.ready = True
        return model

    def warm_up(self) -> None:
        """Compile the template (and its minijinja check) and touch the tokenizer before /health is 200."""
        try:
            render.render_chat(self.context, {"messages": [{"role": "user", "content": "warm up"}]})
        except RenderServiceError as exc:  # a template that rejects this probe is still served
            logger.info("warm-up render refused (%s); continuing", exc.message)

    @property
    def healthy(self) -> bool:
        """Loaded, and (when the audit gates readiness) the audit still agrees with its peers."""
        audit = self.audit
        return self.ready and (audit is None or not self.settings.audit_gates_readiness or audit.healthy)


def build_store(settings: Settings, metrics: Metrics) -> SnapshotStore:
    """In-process LRU always; Redis too when configured (then a shared HMAC key is required)."""
    key = settings.snapshot_key.encode() if settings.snapshot_key else secrets.token_bytes(32)
    redis = None
    if settings.redis_url:
        redis = RedisStore(settings.redis_url, metrics, ttl=settings.snapshot_ttl_seconds)
    local = LocalStore(ttl=settings.snapshot_ttl_seconds)
    return SnapshotStore(SnapshotCodec(key), metrics, local=local, redis=redis)


def build_image_tier(
    settings: Settings, context: render.RenderContext, print_: dict[str, Any], metrics: Metrics
) -> imagecache.ImageTier | None:
    """The Redis tier of the processed-image cache: only when asked for and the model has images."""
    if not settings.mm_cache_redis or context.vision is None or not settings.redis_url:
        return None
    space = imagecache.namespace(print_["components"].get("multimodal", ""), context.vision)
    return imagecache.ImageTier(
        settings.redis_url,
        (settings.snapshot_key or "").encode(),
        space,
        metrics,
        ttl=settings.mm_cache_redis_ttl_seconds,
        max_entry_bytes=settings.mm_cache_redis_max_entry_bytes,
    )
