"""vLLM's /tokenize and /detokenize: a prompt or chat in, token ids out, and back."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from render_service.render import tokenize as tokens
from render_service.server.body import object_body
from render_service.server.middleware import json_endpoint
from render_service.server.state import State


@json_endpoint("tokenize")
async def tokenize(state: State, request: Request, body: Any) -> Any:
    return tokens.tokenize(state.context, object_body(body))


@json_endpoint("detokenize")
async def detokenize(state: State, request: Request, body: Any) -> Any:
    return tokens.detokenize(state.context, object_body(body))
