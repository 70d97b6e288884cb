"""What wraps the handlers: vLLM's API-key check (ASGI middleware) and `json_endpoint`, the
admission, body decoding, error mapping and metrics every JSON POST route shares.

`json_endpoint` is a per-route wrapper rather than an ASGI middleware because it needs the
route's metric name and applies to the JSON routes only: /health, /metrics and the other GET
routes never count as in flight and are never refused for load.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from render_service.exceptions import BadRequestError, OverloadedError, RenderServiceError, UnauthorizedError
from render_service.server.body import read_json
from render_service.server.responses import JSONResponse, error_response
from render_service.server.state import State

# The HTTP edge logs under one name (operators' log filters use it), whichever module writes.
logger = logging.getLogger("render_service.server.app")

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")

# A JSON route's handler: the decoded body in, a JSON-able result (or a Response) out.
JSONHandler = Callable[[State, Request, Any], Awaitable[Any]]
Endpoint = Callable[[Request], Awaitable[Response]]


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


def json_endpoint(name: str) -> Callable[[JSONHandler], Endpoint]:
    """Make `handler(state, request, body)` a Starlette endpoint named `name` in the metrics:

    503 while loading or past `--max-inflight`; the body read within `--max-request-body-bytes`;
    the result encoded with orjson and stamped with the render fingerprint; every
    `RenderServiceError` in vLLM's shape, anything else a logged 500 in the same shape.
    """

    def decorate(handler: JSONHandler) -> Endpoint:
        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            state = State.of(request)
            metrics = state.metrics
            state.inflight += 1
            metrics.inflight.set(state.inflight)
            try:
                if not state.ready:
                    raise OverloadedError("The model is still loading.", retry_after=5)
                if state.inflight > state.settings.max_inflight:
                    metrics.rejected.inc()
                    raise OverloadedError(
                        f"Server busy: {state.inflight - 1} requests in flight on this worker; "
                        "retry shortly or on another replica.",
                        retry_after=1,
                    )
                body = await read_json(request, state.settings.max_request_body_bytes)
                with metrics.measure(name):
                    result = await handler(state, request, body)
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

        return endpoint

    return decorate


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def request_ids(request: Request) -> str:
    """The caller's W3C trace id (llm-d injects `traceparent`) and `X-Request-Id`, for log lines;
    render makes no downstream call, so there is nothing to propagate them to."""
    match = _TRACEPARENT.match(request.headers.get("traceparent", "").strip().lower())
    trace_id = match.group(1) if match else "-"
    return f"trace_id={trace_id} request_id={request.headers.get('x-request-id', '-')[:128]}"
