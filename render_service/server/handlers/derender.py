"""The derender endpoints: engine token ids in, an OpenAI chat or completions response out,
batch or one streaming chunk at a time (parser state carried in `stream_state`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from render_service.api.derender import validate_chat_derender, validate_completion_derender
from render_service.audit.fingerprint import fingerprint_conflict
from render_service.derender import generated
from render_service.derender import pipeline as derender
from render_service.server.middleware import json_endpoint
from render_service.server.state import State


@json_endpoint("chat_derender")
async def chat_derender(state: State, request: Request, body: Any) -> Any:
    check_fingerprint(state, request, body)
    vouch = await derender.vouch(state.derender, body)  # full mode: what the last chunk's snapshot vouches for
    if validate_chat_derender(body, vouch.vouched):
        result = await derender.derender_chat_stream(state.derender, body, vouch)
        if state.generated is not None:  # --preserve-generated-tokens: a handle on the final chunk
            await generated.issue_stream(state.generated, state.derender, body, result)
        return result
    response = derender.derender_chat(state.derender, body)
    if state.generated is not None:  # --preserve-generated-tokens: a handle on each message
        await generated.issue_batch(state.generated, body, response)
    return response


@json_endpoint("completion_derender")
async def completion_derender(state: State, request: Request, body: Any) -> Any:
    check_fingerprint(state, request, body)
    if validate_completion_derender(body):
        return await derender.derender_completion_stream(state.derender, body)
    return derender.derender_completion(state.derender, body)


def check_fingerprint(state: State, request: Request, body: Any) -> None:
    """Fail closed when the caller says its render (or stream) came from another configuration
    (before validation, as before: a stale stream is a 409 whatever else its body holds)."""
    if not isinstance(body, dict):
        return  # validation refuses it
    ours = state.fingerprint["fingerprint"]
    claimed = request.headers.get("x-render-fingerprint")
    stream_state = body.get("stream_state")
    if claimed is None and isinstance(stream_state, dict) and isinstance(stream_state.get("rs_fp"), str):
        claimed = stream_state["rs_fp"]
    if claimed is None or (ours.startswith(claimed[:32]) and len(claimed) >= 16):
        return
    raise fingerprint_conflict(state.fingerprint, claimed, request.headers.get("x-render-fingerprint-components"))
