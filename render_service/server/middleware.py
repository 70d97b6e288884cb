"""What wraps the handlers: vLLM's API-key check (ASGI middleware) and `json_endpoint`, the
admission, body decoding, error mapping and metrics every JSON POST route shares.

`json_endpoint` is a per-route wrapper rather than an ASGI middleware because it needs the
route's metric name and applies to the JSON routes only: /health, /metrics and the other GET
routes never count as in flight and are never refused for load. It makes each JSON route a
bare ASGI app (`JSONEndpoint`), which `RenderApp` calls without Starlette's routing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from render_service.exceptions import BadRequestError, OverloadedError, RenderServiceError, UnauthorizedError
from render_service.server.body import read_body, read_raw_body
from render_service.server.responses import JSON_CONTENT_TYPE, JSONBody, encode_json, error_response
from render_service.server.state import State

# The HTTP edge logs under one name (operators' log filters use it), whichever module writes.
logger = logging.getLogger("render_service.server.app")

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")

# A JSON route's handler: the decoded body in, a JSON-able result (or a Response) out.
JSONHandler = Callable[[State, Request, Any], Awaitable[Any]]


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


def json_endpoint(name: str, raw_body: bool = False) -> Callable[[JSONHandler], JSONEndpoint]:
    """Make `handler(state, request, body)` a JSON POST route named `name` in the metrics (see
    `JSONEndpoint`). `raw_body`: the handler gets the body's bytes and parses them itself
    (`body.parse_json`), for a route that can skip decoding part of them."""

    def decorate(handler: JSONHandler) -> JSONEndpoint:
        return JSONEndpoint(name, handler, raw_body)

    return decorate


class JSONEndpoint:
    """A JSON POST route as a bare ASGI app: what every render, derender and tokenizer request
    goes through, so it is kept to the work it must do (no Starlette Request body reader, Response
    object or exception middleware on the way in or out; see `RenderApp` for the routing side).

    503 while loading or past `--max-inflight`; the body read within `--max-request-body-bytes`;
    the result encoded with orjson and stamped with the render fingerprint; every
    `RenderServiceError` in vLLM's shape, anything else a logged 500 in the same shape.
    """

    def __init__(self, name: str, handler: JSONHandler, raw_body: bool = False) -> None:
        self.name = name
        self.handler = handler
        self.read = read_raw_body if raw_body else read_body
        self.stamp_components = name.endswith("_render")
        functools.update_wrapper(self, handler)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: State = scope["app"].state.render
        metrics = state.metrics.endpoint(self.name)
        request = Request(scope, receive)
        response: Response | None = None
        headers: list[tuple[bytes, bytes]] = []
        encoded = b""
        state.inflight += 1
        try:
            if not state.ready:
                raise OverloadedError("The model is still loading.", retry_after=5)
            if state.inflight > state.settings.max_inflight:
                state.metrics.rejected.inc()
                raise OverloadedError(
                    f"Server busy: {state.inflight - 1} requests in flight on this worker; "
                    "retry shortly or on another replica.",
                    retry_after=1,
                )
            body = await self.read(scope, receive, state.settings.max_request_body_bytes)
            wall = time.perf_counter()
            cpu = time.thread_time()
            try:
                result = await self.handler(state, request, body)
            finally:
                metrics.observe(time.thread_time() - cpu, time.perf_counter() - wall)
            if isinstance(result, Response):
                response = result
                response.headers["X-Render-Fingerprint"] = state.fingerprint["fingerprint"]
                if self.stamp_components:
                    response.headers["X-Render-Fingerprint-Components"] = state.fingerprint_components
            else:  # the common case: encoded and sent without building a Response
                extra = None
                if isinstance(result, JSONBody):
                    result, extra = result.content, result.headers
                encoded = encode_json(result)
                headers = [(b"content-length", b"%d" % len(encoded)), JSON_CONTENT_TYPE]
                if extra:
                    headers += extra
                headers += state.fingerprint_headers(self.stamp_components)
        except RenderServiceError as exc:
            response = error_response(exc)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s -> %d %s (%s)", self.name, exc.status_code, exc.message[:200], request_ids(request))
        except RecursionError:  # request data nested deeper than Python (or the encoder) can walk
            response = error_response(BadRequestError("The request is nested too deeply to process."))
        except Exception:
            logger.exception("unhandled error on %s (%s)", self.name, request_ids(request))
            response = error_response(RenderServiceError("Internal server error"))
        finally:
            state.inflight -= 1
        if response is None:
            metrics.count(200)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": encoded})
            return
        metrics.count(response.status_code)
        await response(scope, receive, send)


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def request_ids(request: Request) -> str:
    """The caller's W3C trace id (llm-d injects `traceparent`) and `X-Request-Id`, for log lines;
    render makes no downstream call, so there is nothing to propagate them to."""
    match = _TRACEPARENT.match(request.headers.get("traceparent", "").strip().lower())
    trace_id = match.group(1) if match else "-"
    return f"trace_id={trace_id} request_id={request.headers.get('x-request-id', '-')[:128]}"
