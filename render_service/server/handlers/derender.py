"""The derender endpoints: engine token ids in, an OpenAI chat or completions response out,
batch or one streaming chunk at a time (parser state carried in `stream_state`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.requests import Request

from render_service.audit.fingerprint import fingerprint_conflict
from render_service.derender import pipeline as derender
from render_service.exceptions import RequestValidationError
from render_service.server.body import object_body
from render_service.server.middleware import json_endpoint
from render_service.server.state import State


@json_endpoint("chat_derender")
async def chat_derender(state: State, request: Request, body: Any) -> Any:
    body = object_body(body)
    check_fingerprint(state, request, body)
    with union_params(body, "DerenderChatRequest."):
        if body.get("stream") is True:
            return await derender.derender_chat_stream(state.derender, body)
        _batch_only(body)
        return derender.derender_chat(state.derender, body)


@json_endpoint("completion_derender")
async def completion_derender(state: State, request: Request, body: Any) -> Any:
    body = object_body(body)
    check_fingerprint(state, request, body)
    # DerenderCompletionRequest has a model validator, whose label vLLM's cleaner drops.
    with union_params(body, ""):
        if body.get("stream") is True:
            return await derender.derender_completion_stream(state.derender, body)
        _batch_only(body)
        return derender.derender_completion(state.derender, body)


def check_fingerprint(state: State, request: Request, body: dict[str, Any]) -> None:
    """Fail closed when the caller says its render (or stream) came from another configuration."""
    ours = state.fingerprint["fingerprint"]
    claimed = request.headers.get("x-render-fingerprint")
    stream_state = body.get("stream_state")
    if claimed is None and isinstance(stream_state, dict) and isinstance(stream_state.get("rs_fp"), str):
        claimed = stream_state["rs_fp"]
    if claimed is None or (ours.startswith(claimed[:32]) and len(claimed) >= 16):
        return
    raise fingerprint_conflict(state.fingerprint, claimed, request.headers.get("x-render-fingerprint-components"))


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
