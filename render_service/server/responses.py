"""Response classes and error bodies: orjson-encoded JSON, image data sent in pieces, vLLM's error shape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from render_service.exceptions import RenderServiceError
from render_service.render.encoded_ids import as_fragment

JSON_CONTENT_TYPE = (b"content-type", b"application/json")


def encode_json(content: Any) -> bytes:
    """A response body: orjson, or the stdlib for data nested past orjson's limit."""
    try:
        return orjson.dumps(as_fragment(content))
    except orjson.JSONEncodeError as exc:
        if "Recursion limit" not in str(exc):
            raise
        # orjson encodes at most 254 levels but parses 1024, and responses echo request data
        # (tools, kwargs, kv_transfer_params): encode those with the stdlib, whose own limit
        # (a RecursionError) the endpoint answers with a 400.
        return json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=_too_deep).encode()


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_json(content)


@dataclass(slots=True)
class JSONBody:
    """A handler's JSON result with extra response headers (names lower-case), for a 200 that
    needs no Response object (`json_endpoint` encodes it)."""

    content: Any
    headers: list[tuple[bytes, bytes]]


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
    """An error in vLLM's shape (`{"error": {...}}`), with its status and headers (e.g. Retry-After)."""
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers())


# Unknown paths and methods: FastAPI's bodies, as vLLM answers them.
async def not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": "Not Found"}, status_code=404)


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)
