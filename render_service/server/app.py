"""The Starlette app: routes, body decoding, error mapping, auth and lifespan.

Handlers are thin: decode the body, call a pure function (`render`, `derender`, ...), encode
the result with orjson. Every error is a `RenderServiceError` rendered in vLLM's shape;
anything else is a bug, logged with its traceback and answered with a 500 in the same shape.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from render_service import __version__
from render_service.api import messages, openapi, responses
from render_service.audit.fingerprint import components_header, fingerprint, fingerprint_conflict
from render_service.derender import pipeline as derender
from render_service.derender.snapshots import LocalStore, RedisStore, SnapshotCodec, SnapshotStore
from render_service.exceptions import (
    BadRequestError,
    OverloadedError,
    PayloadTooLargeError,
    RenderServiceError,
    RequestValidationError,
    UnauthorizedError,
)
from render_service.model.loader import Model, load_model, release_freed_memory
from render_service.multimodal import imagecache, media
from render_service.render import pipeline as render
from render_service.server.metrics import Metrics
from render_service.settings import Settings

logger = logging.getLogger("render_service.server.app")
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
VLLM_COMPAT_VERSION = "0.33.0"


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except orjson.JSONEncodeError as exc:
            if "Recursion limit" not in str(exc):
                raise
            # orjson encodes at most 254 levels but parses 1024, and responses echo request data
            # (tools, kwargs, kv_transfer_params): encode those with the stdlib, whose own limit
            # (a RecursionError) the endpoint answers with a 400.
            return json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=_too_deep).encode()


def _too_deep(value: Any) -> Any:
    # Pre-encoded image data (orjson.Fragment) cannot go through the stdlib encoder: a request that
    # is both this deep and carries images is refused like one nested past the stdlib's limit.
    raise RecursionError(f"cannot encode {type(value).__name__} in a deeply nested response")


class PartsResponse(Response):
    """A JSON body sent as the pieces `ImageProcessor.json_parts` returns: megabytes of cached image
    data go to the socket as they are, not copied into a new body on every request."""

    media_type = "application/json"

    def __init__(self, parts: list[bytes], status_code: int = 200) -> None:
        self.parts = parts
        super().__init__(b"", status_code=status_code)
        self.headers["content-length"] = str(sum(len(part) for part in parts))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self.parts) - 1
        for index, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})


def error_response(exc: RenderServiceError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers())


class AuthMiddleware:
    """vLLM's API-key check: Bearer token, constant-time, only on the guarded prefixes."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.token_hash = hashlib.sha256(api_key.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith(GUARDED_PREFIXES) and not self._verify(scope):
                await error_response(UnauthorizedError("Unauthorized"))(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _verify(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() != "bearer":
                    return False
                return secrets.compare_digest(hashlib.sha256(token.encode()).digest(), self.token_hash)
        return False


class State:
    """Everything a handler reads: immutable after start-up."""

    def __init__(self, settings: Settings, model: Model | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.model = model
        self.ready = False
        self.started = int(time.time())
        self.inflight = 0
        self.mm_hits_seen = self.mm_misses_seen = 0  # image-cache counters already exported
        self.audit: Any = None
        self.image_tier: imagecache.ImageTier | None = None  # --mm-cache-redis

    def warm_up(self) -> None:
        """Compile the template (and its minijinja check) and touch the tokenizer before /health is 200."""
        try:
            render.render_chat(self.context, {"messages": [{"role": "user", "content": "warm up"}]})
        except RenderServiceError as exc:  # a template that rejects this probe is still served
            logger.info("warm-up render refused (%s); continuing", exc.message)

    def load(self) -> None:
        if self.model is None:
            self.model = load_model(self.settings)
        self.context = render.make_context(self.model, self.settings)
        self.fingerprint = fingerprint(self.settings, self.model)
        self.fingerprint_components = components_header(self.fingerprint)
        self.store = build_store(self.settings, self.metrics)
        self.derender = derender.make_context(self.context, self.fingerprint["fingerprint"], self.store, self.metrics)
        self.image_tier = build_image_tier(self.settings, self.context, self.fingerprint, self.metrics)
        self.warm_up()
        release_freed_memory()
        self.metrics.tokenizer_backend.labels(self.model.backend.name).set(1)
        self.metrics.model_info.labels(self.settings.served_names[0], str(self.model.max_model_len)).set(1)
        self.ready = True


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


async def read_json(request: Request, limit: int) -> Any:
    content_type = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if content_type != "application/json":
        raise RequestValidationError(
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"Request body of {declared} bytes exceeds the limit of {limit} bytes.")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _json_error(raw, exc) from None


def _json_error(raw: bytes, parse_error: orjson.JSONDecodeError) -> RequestValidationError:
    """FastAPI's report of a body that is not JSON: stdlib json's message and offset."""
    if parse_error.msg.startswith("depth limit exceeded"):
        # orjson's bound (1024 levels); the stdlib would recurse until its own limit.
        reason, position = "JSON nested deeper than 1024 levels", parse_error.pos
    else:
        try:
            json.loads(raw)
            reason, position = "Invalid JSON", 0
        except json.JSONDecodeError as exc:
            reason, position = exc.msg, exc.pos
        except UnicodeDecodeError:
            reason, position = "Invalid UTF-8", 0
        except (RecursionError, ValueError):  # e.g. an integer of more than 4300 digits
            reason, position = parse_error.msg, parse_error.pos
    detail = {
        "type": "json_invalid",
        "loc": f"body.{position}",
        "msg": "JSON decode error",
        "input": "<dict of 0 items>",
        "ctx": {"error": reason},
    }
    return RequestValidationError(f"1 validation error:\n  {detail}", param=f"body.{position}")


def _object_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestValidationError(
            "1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', "
            "'msg': 'Input should be a valid dictionary or object to extract fields from'}",
            param="body",
        )
    return body


@contextmanager
def union_params(body: dict[str, Any], batch_model: str) -> Iterator[None]:
    """Name schema errors as vLLM does: derender bodies validate against a batch | stream union,
    and the batch model's errors come first (so a stream body's first error is its `stream`)."""
    try:
        yield
    except RequestValidationError as exc:
        if body.get("stream") is True:
            exc.param = f"body.{batch_model}stream"
            # The batch member's error comes first, then the stream member's own (ours).
            detail = {"type": "literal_error", "loc": exc.param, "msg": "Input should be False", "input": True}
            own = exc.message.split("\n", 1)[1] if "\n" in exc.message else f"  {exc.message}"
            exc.message = f"2 validation errors:\n  {detail}\n{own}"
        elif exc.param and exc.param.startswith("body."):
            old = exc.param
            exc.param = f"body.{batch_model}{old[5:]}"
            exc.message = exc.message.replace(f"'loc': '{old}'", f"'loc': '{exc.param}'", 1)
        raise


def _batch_only(body: dict[str, Any]) -> None:
    stream = body.get("stream", False)
    if stream not in (False, None):
        raise RequestValidationError(
            f"1 validation error:\n  {{'type': 'literal_error', 'loc': 'body.stream', 'msg': "
            f"\"Input should be False\", 'input': {stream!r}}}",
            param="body.stream",
        )


def runqueue_wait_seconds() -> float | None:
    """Seconds this thread has waited runnable for a CPU (Linux schedstat); None elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def request_ids(request: Request) -> str:
    """The caller's W3C trace id (llm-d injects `traceparent`) and `X-Request-Id`, for log lines;
    render makes no downstream call, so there is nothing to propagate them to."""
    match = _TRACEPARENT.match(request.headers.get("traceparent", "").strip().lower())
    trace_id = match.group(1) if match else "-"
    return f"trace_id={trace_id} request_id={request.headers.get('x-request-id', '-')[:128]}"


def create_app(settings: Settings, model: Model | None = None) -> Starlette:
    state = State(settings, model)
    limit = settings.max_request_body_bytes

    def endpoint(name: str, handler: Callable[[Request, Any], Any]) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            metrics = state.metrics
            state.inflight += 1
            metrics.inflight.set(state.inflight)
            try:
                if not state.ready:
                    raise OverloadedError("The model is still loading.", retry_after=5)
                if state.inflight > settings.max_inflight:
                    metrics.rejected.inc()
                    raise OverloadedError(
                        f"Server busy: {state.inflight - 1} requests in flight on this worker; "
                        "retry shortly or on another replica.",
                        retry_after=1,
                    )
                body = await read_json(request, limit)
                with metrics.measure(name):
                    result = handler(request, body)
                    if inspect.isawaitable(result):
                        result = await result
                response = result if isinstance(result, Response) else JSONResponse(result)
                response.headers["X-Render-Fingerprint"] = state.fingerprint["fingerprint"]
                if name.endswith("_render"):
                    response.headers["X-Render-Fingerprint-Components"] = state.fingerprint_components
            except RenderServiceError as exc:
                response = error_response(exc)
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("%s -> %d %s (%s)", name, exc.status_code, exc.message[:200], request_ids(request))
            except RecursionError:  # request data nested deeper than Python (or the encoder) can walk
                response = error_response(BadRequestError("The request is nested too deeply to process."))
            except Exception:
                logger.exception("unhandled error on %s (%s)", name, request_ids(request))
                response = error_response(RenderServiceError("Internal server error"))
            finally:
                state.inflight -= 1
                metrics.inflight.set(state.inflight)
            metrics.requests.labels(name, str(response.status_code)).inc()
            return response

        return run

    def chat_render(request: Request, body: Any) -> Any:
        body = _object_body(body)
        render_one = partial(render.render_chat, state.context, body, request.headers.get("x-request-id"))
        return with_images(body.get("messages"), render_one, body)

    def messages_render(request: Request, body: Any) -> Any:
        chat = messages.convert(state.context, _object_body(body))
        render_one = partial(
            render.render_chat, state.context, chat, request.headers.get("x-request-id"), converted=True
        )
        return with_images(chat["messages"], render_one, chat)

    def responses_render(request: Request, body: Any) -> Any:
        body = _object_body(body)
        context = state.context
        conversation = None
        if context.vision is not None:  # find the image URLs to fetch (a valid request only)
            responses.validate_responses_request(body)
            conversation = responses.input_messages(body)
        return with_images(conversation, partial(responses.render_responses, context, body), body)

    def with_images(
        conversation: Any, render_one: Callable[..., dict[str, Any]], body: dict[str, Any] | None = None
    ) -> Any:
        """Render, after fetching the conversation's http(s) image URLs (off the loop's CPU path).
        `body`: where the render reads `mm_payload` and `mm_processor_kwargs` (the Redis tier's step)."""
        if state.context.vision is None:
            return finish_render(render_one(None))
        tiered_images = state.image_tier is not None and body is not None
        urls = media.image_urls(conversation, include_data=tiered_images)
        if tiered_images and urls:
            return tiered(urls, render_one, body)
        if urls:
            return fetching(urls, render_one)
        return finish_render(render_one(None))

    async def fetching(urls: list[str], render_one: Callable[..., dict[str, Any]]) -> Any:
        fetched = await media.fetch_all(urls, state.context.media_limits)
        return finish_render(render_one(fetched))

    async def tiered(urls: list[str], render_one: Callable[..., dict[str, Any]], body: dict[str, Any]) -> Any:
        """`fetching` with the Redis tier: the local cache is filled from Redis before the render
        (which runs on the loop and cannot wait for Redis), what it processed is stored after."""
        tier, vision, context = state.image_tier, state.context.vision, state.context
        assert tier is not None and vision is not None
        remote = [url for url in urls if not url.startswith("data:")]
        fetched = await media.fetch_all(remote, context.media_limits) if remote else {}
        # render validates mm_payload later; `return_mm_kwargs: false` already means "none" here
        payload = body.get("mm_payload", "none" if body.get("return_mm_kwargs") is False else "tensors")
        prepared = await tier.prepare(
            vision,
            urls,
            fetched,
            body.get("mm_processor_kwargs"),
            payload != "none",
            context.media_limits,
            settings.trust_request_mm_kwargs,
        )
        response = finish_render(render_one(prepared))
        await tier.store(vision, prepared)
        return response

    def finish_render(result: dict[str, Any]) -> Any:
        vision = state.context.vision
        state.metrics.prompt_tokens.inc(len(result["token_ids"]))
        if vision is not None:
            state.metrics.mm_cache_hits.inc(vision.cache.hits - state.mm_hits_seen)
            state.metrics.mm_cache_misses.inc(vision.cache.misses - state.mm_misses_seen)
            state.mm_hits_seen, state.mm_misses_seen = vision.cache.hits, vision.cache.misses
            state.metrics.mm_cache_bytes.set(vision.cache.bytes)
            if result.get("features") is not None:
                return PartsResponse(vision.json_parts(result))
        return result

    def completion_render(request: Request, body: Any) -> Any:
        body = _object_body(body)
        results = render.render_completion(state.context, body, request.headers.get("x-request-id"))
        state.metrics.prompt_tokens.inc(sum(len(r["token_ids"]) for r in results))
        return results

    def check_fingerprint(request: Request, body: dict[str, Any]) -> None:
        """Fail closed when the caller says its render (or stream) came from another configuration."""
        ours = state.fingerprint["fingerprint"]
        claimed = request.headers.get("x-render-fingerprint")
        stream_state = body.get("stream_state")
        if claimed is None and isinstance(stream_state, dict) and isinstance(stream_state.get("rs_fp"), str):
            claimed = stream_state["rs_fp"]
        if claimed is None or (ours.startswith(claimed[:32]) and len(claimed) >= 16):
            return
        raise fingerprint_conflict(state.fingerprint, claimed, request.headers.get("x-render-fingerprint-components"))

    async def chat_derender(request: Request, body: Any) -> Any:
        body = _object_body(body)
        check_fingerprint(request, body)
        with union_params(body, "DerenderChatRequest."):
            if body.get("stream") is True:
                return await derender.derender_chat_stream(state.derender, body)
            _batch_only(body)
            return derender.derender_chat(state.derender, body)

    async def completion_derender(request: Request, body: Any) -> Any:
        body = _object_body(body)
        check_fingerprint(request, body)
        # DerenderCompletionRequest has a model validator, whose label vLLM's cleaner drops.
        with union_params(body, ""):
            if body.get("stream") is True:
                return await derender.derender_completion_stream(state.derender, body)
            _batch_only(body)
            return derender.derender_completion(state.derender, body)

    def tokenize(request: Request, body: Any) -> Any:
        from render_service.render.tokenize import tokenize as run_tokenize

        return run_tokenize(state.context, _object_body(body))

    def detokenize(request: Request, body: Any) -> Any:
        from render_service.render.tokenize import detokenize as run_detokenize

        return run_detokenize(state.context, _object_body(body))

    async def health(request: Request) -> Response:
        healthy = state.ready and (state.audit is None or not settings.audit_gates_readiness or state.audit.healthy)
        return Response(status_code=200 if healthy else 503)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VLLM_COMPAT_VERSION}, headers={"X-Render-Service-Version": __version__})

    async def models(request: Request) -> Response:
        max_model_len = state.model.max_model_len if state.model else None
        cards = [
            {
                "id": name,
                "object": "model",
                "created": state.started,
                "owned_by": "vllm",
                "root": settings.model,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{render.random_uuid()}",
                        "object": "model_permission",
                        "created": state.started,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in settings.served_names
        ]
        return JSONResponse({"object": "list", "data": cards})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(state.metrics.export(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def render_config(request: Request) -> Response:
        return JSONResponse(
            {**state.fingerprint, "vllm_parity_version": VLLM_COMPAT_VERSION, "service_version": __version__},
            headers={
                "X-Render-Fingerprint": state.fingerprint["fingerprint"],
                "X-Render-Fingerprint-Components": components_header(state.fingerprint),
            },
        )

    async def load(request: Request) -> Response:
        return JSONResponse({"server_load": 0})

    routes = [
        Route("/v1/chat/completions/render", endpoint("chat_render", chat_render), methods=["POST"]),
        Route("/v1/completions/render", endpoint("completion_render", completion_render), methods=["POST"]),
        Route("/v1/messages/render", endpoint("messages_render", messages_render), methods=["POST"]),
        Route("/v1/responses/render", endpoint("responses_render", responses_render), methods=["POST"]),
        Route("/v1/chat/completions/derender", endpoint("chat_derender", chat_derender), methods=["POST"]),
        Route("/v1/completions/derender", endpoint("completion_derender", completion_derender), methods=["POST"]),
        Route("/tokenize", endpoint("tokenize", tokenize), methods=["POST"]),
        Route("/detokenize", endpoint("detokenize", detokenize), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/version", version, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/v1/render/config", render_config, methods=["GET"]),
        Route("/openapi.json", openapi.openapi_endpoint, methods=["GET"]),
    ]

    async def watch_loop_lag() -> None:
        """CPU work runs inline on each worker's loop; this proves it never blocks the loop long, and
        separates that from time the OS kept the loop off a CPU (a saturated or shared machine)."""
        interval = 0.05
        metrics = state.metrics
        waited = runqueue_wait_seconds()
        while True:
            start = time.perf_counter()
            await asyncio.sleep(interval)
            lag = max(0.0, time.perf_counter() - start - interval)
            metrics.loop_lag.observe(lag)
            if waited is not None:
                now = runqueue_wait_seconds()
                if now is not None:
                    metrics.loop_runqueue.inc(max(0.0, now - waited))
                    metrics.loop_held.observe(max(0.0, lag - (now - waited)))
                    waited = now

    @asynccontextmanager
    async def lifespan(app: Starlette):
        state.load()
        state.metrics.worker_info.labels(os.environ.get("RENDER_WORKER_ID", "0")).set(1)
        lag_task = asyncio.get_running_loop().create_task(watch_loop_lag())
        if settings.audit_engine or settings.audit_render:
            from render_service.audit.audit import ContinuousAudit

            state.audit = ContinuousAudit(
                settings.audit_render,
                settings.audit_engine,
                local=(settings, state.model),
                registry=state.metrics.registry,
                interval=settings.audit_interval,
                api_key=settings.api_key,
            ).start()
        logger.info(
            "ready: %s (max_model_len=%d, tokenizer backend %s, fingerprint %s)",
            settings.served_names[0],
            state.model.max_model_len,
            state.model.backend.name,
            state.fingerprint["fingerprint"],
        )
        yield
        lag_task.cancel()
        if state.audit is not None:
            state.audit.stop()
        await state.store.close()
        if state.image_tier is not None:
            await state.image_tier.close()

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.render = state
    if settings.api_key:
        app.add_middleware(AuthMiddleware, api_key=settings.api_key)
    return app
