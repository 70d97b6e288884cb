"""`State`: everything the handlers read, built once per app and loaded at start-up.

The app holds it as `app.state.render`; `State.of(request)` is how a handler reaches it.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from render_service.audit.fingerprint import components_header, fingerprint, with_adapters
from render_service.derender import generated
from render_service.derender import pipeline as derender
from render_service.derender.snapshots import LocalStore, RedisStore, SnapshotCodec, SnapshotStore
from render_service.exceptions import RenderServiceError
from render_service.model.loader import Model, load_model, release_freed_memory
from render_service.model.lora import AdapterRegistry
from render_service.multimodal import imagecache
from render_service.redis_target import RedisTarget
from render_service.render import pipeline as render
from render_service.server.metrics import Metrics
from render_service.settings import Settings

if TYPE_CHECKING:  # imported when an audit is configured (see `lifespan`)
    from render_service.audit.audit import ContinuousAudit

RawHeaders = tuple[tuple[bytes, bytes], ...]

# The HTTP edge logs under one name (operators' log filters use it), whichever module writes.
logger = logging.getLogger("render_service.server.app")


class State:
    """Everything a handler reads: immutable after start-up, except the in-flight counters."""

    # Set by `load()`, before the first request is served (the lifespan runs it).
    context: render.RenderContext
    derender: derender.DerenderContext
    store: SnapshotStore
    generated: generated.GeneratedStore | None  # --preserve-generated-tokens
    adapters: AdapterRegistry
    _fingerprint: dict[str, Any]
    _fingerprint_components: str
    _fingerprint_generation: int  # the adapter set's generation `_fingerprint` was computed at

    def __init__(self, settings: Settings, model: Model | None = None, adapters: AdapterRegistry | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.model = model
        if adapters is not None:  # shared by the workers (built before they fork); else built by `load`
            self.adapters = adapters
        self.ready = False
        self.started = int(time.time())
        self.inflight = 0
        self.metrics.inflight.set_function(lambda: self.inflight)  # read at scrape time, not set per request
        self._encoded_fingerprint: tuple[int, RawHeaders, RawHeaders] | None = None
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
        if not hasattr(self, "adapters"):
            self.adapters = AdapterRegistry.start(
                self.settings.served_names, self.settings.lora_module_paths, shared=False
            )
        self.context = render.make_context(model, self.settings, self.adapters)
        self.metrics.watch_prompt_reuse(self.context.segments, self.context.prefix_guard, self.context.history)
        self._fingerprint_generation = self.adapters.current_generation()
        self._fingerprint = fingerprint(self.settings, model, self.adapters.fingerprint_value())
        self._fingerprint_components = components_header(self._fingerprint)
        self.store = build_store(self.settings, self.metrics)
        self.derender = derender.make_context(self.context, self._fingerprint["fingerprint"], self.store, self.metrics)
        self.generated = build_generated_store(self.settings, self._fingerprint["fingerprint"], self.metrics)
        self.image_tier = build_image_tier(self.settings, self.context, self._fingerprint, self.metrics)
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
    def fingerprint(self) -> dict[str, Any]:
        """The config fingerprint, its `lora_adapters` component as of now (a runtime load or unload
        on any worker of this replica included)."""
        generation = self.adapters.current_generation()
        if generation != self._fingerprint_generation:  # a runtime load or unload since
            self._fingerprint = with_adapters(self._fingerprint, self.adapters.fingerprint_value())
            self._fingerprint_components = components_header(self._fingerprint)
            self._fingerprint_generation = generation
        return self._fingerprint

    @property
    def fingerprint_components(self) -> str:
        self.fingerprint  # noqa: B018 - brings the components up to date
        return self._fingerprint_components

    def fingerprint_headers(self, components: bool) -> RawHeaders:
        """`X-Render-Fingerprint` (and `-Components` when asked) as raw response headers, encoded
        once per adapter-set generation rather than per response."""
        self.fingerprint  # noqa: B018 - brings the fingerprint up to date
        encoded = self._encoded_fingerprint
        if encoded is None or encoded[0] != self._fingerprint_generation:
            short = ((b"x-render-fingerprint", self._fingerprint["fingerprint"].encode("latin-1")),)
            full = (*short, (b"x-render-fingerprint-components", self._fingerprint_components.encode("latin-1")))
            encoded = self._encoded_fingerprint = (self._fingerprint_generation, short, full)
        return encoded[2] if components else encoded[1]

    @property
    def healthy(self) -> bool:
        """Loaded, and (when the audit gates readiness) the audit still agrees with its peers."""
        audit = self.audit
        return self.ready and (audit is None or not self.settings.audit_gates_readiness or audit.healthy)


def build_store(settings: Settings, metrics: Metrics) -> SnapshotStore:
    """In-process LRU always; Redis too when configured (then a shared HMAC key is required)."""
    key = settings.snapshot_key.encode() if settings.snapshot_key else secrets.token_bytes(32)
    redis = None
    if (target := RedisTarget.from_settings(settings)) is not None:
        redis = RedisStore(target, metrics, ttl=settings.snapshot_ttl_seconds)
    local = LocalStore(ttl=settings.snapshot_ttl_seconds)
    return SnapshotStore(SnapshotCodec(key), metrics, local=local, redis=redis)


def build_generated_store(settings: Settings, fingerprint: str, metrics: Metrics) -> generated.GeneratedStore | None:
    """The generated-token store (--preserve-generated-tokens), sharing Redis when configured."""
    redis = None
    if settings.preserve_generated_tokens and (target := RedisTarget.from_settings(settings)) is not None:
        redis = RedisStore(target, metrics, timeout=0.25, ttl=settings.preserve_generated_tokens_ttl_seconds)
    return generated.build(settings, fingerprint, metrics, redis)


def build_image_tier(
    settings: Settings, context: render.RenderContext, print_: dict[str, Any], metrics: Metrics
) -> imagecache.ImageTier | None:
    """The Redis tier of the processed-image cache: only when asked for and the model has images."""
    target = RedisTarget.from_settings(settings)
    if not settings.mm_cache_redis or context.vision is None or target is None:
        return None
    space = imagecache.namespace(print_["components"].get("multimodal", ""), context.vision)
    return imagecache.ImageTier(
        target,
        (settings.snapshot_key or "").encode(),
        space,
        metrics,
        ttl=settings.mm_cache_redis_ttl_seconds,
        max_entry_bytes=settings.mm_cache_redis_max_entry_bytes,
    )
