"""The derender endpoints: engine token ids in, an OpenAI chat or completions response out,
batch or one streaming chunk at a time (parser state carried in `stream_state`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from render_service.api.derender import Vouched, validate_chat_derender, validate_completion_derender
from render_service.audit.fingerprint import fingerprint_conflict
from render_service.derender import echo, generated
from render_service.derender import pipeline as derender
from render_service.exceptions import ConflictError, RenderServiceError
from render_service.server.body import parse_json
from render_service.server.middleware import json_endpoint
from render_service.server.state import State


@json_endpoint("chat_derender", raw_body=True)
async def chat_derender(state: State, request: Request, raw: bytes) -> Any:
    body, vouch = await read_chat_body(state, request, raw)
    try:
        stream = validate_chat_derender(body, vouch.vouched)
    except RenderServiceError:
        if not vouch.from_bytes:
            raise
        # An `EchoedArray` is no list to the full checks a failed validation lists its errors
        # with: the errors are those of the body parsed whole. Those checks may have filled
        # defaults into request values kept for the stream: they are dropped.
        derender.forget_kept(state.derender, vouch)
        body, vouch = await read_chat_body(state, request, raw, prior=vouch)
        stream = validate_chat_derender(body, vouch.vouched)
    if stream:
        result = await derender.derender_chat_stream(state.derender, body, vouch)
        if state.generated is not None:  # --preserve-generated-tokens: a handle on the final chunk
            await generated.issue_stream(state.generated, state.derender, body, result)
        return result
    response = derender.derender_chat(state.derender, body)
    if state.generated is not None:  # --preserve-generated-tokens: a handle on each message
        await generated.issue_batch(state.generated, body, response)
    return response


async def read_chat_body(
    state: State, request: Request, raw: bytes, prior: derender.Vouch | None = None
) -> tuple[Any, derender.Vouch]:
    """The body, fingerprint-checked, and what the last chunk's snapshot vouches for (full mode).

    A full-mode stream chunk echoes the whole output so far; when those bytes are exactly what
    this service sent (their digest is the snapshot's), they are not decoded at all
    (`echo.split_body`, `pipeline.vouch_raw`). Any other body, or any body after such a read
    (`prior`), is parsed whole and checked as before: the fast path answers exactly as the whole
    parse would, or gives way to it. The store is asked once either way."""
    ctx = state.derender
    split = echo.split_body(raw, ctx.sent) if prior is None and ctx.reads_raw_echo else None
    # The fingerprint is checked before the store is asked, as for a body parsed whole (a stale
    # stream is a 409 whatever else it holds, and costs no lookup).
    if split is not None and fingerprint_error(state, request, split.body) is None:
        vouch = await derender.vouch_raw(ctx, split)
        if Vouched.ECHO in vouch.vouched:
            return split.body, vouch
        prior = vouch
    body = parse_json(raw)
    check_fingerprint(state, request, body)
    return body, await derender.vouch(ctx, body, prior)


@json_endpoint("completion_derender")
async def completion_derender(state: State, request: Request, body: Any) -> Any:
    check_fingerprint(state, request, body)
    if validate_completion_derender(body):
        return await derender.derender_completion_stream(state.derender, body)
    return derender.derender_completion(state.derender, body)


def check_fingerprint(state: State, request: Request, body: Any) -> None:
    """Fail closed when the caller says its render (or stream) came from another configuration
    (before validation, as before: a stale stream is a 409 whatever else its body holds)."""
    error = fingerprint_error(state, request, body)
    if error is not None:
        raise error


def fingerprint_error(state: State, request: Request, body: Any) -> ConflictError | None:
    """`check_fingerprint`'s 409, or None."""
    if not isinstance(body, dict):
        return None  # validation refuses it
    ours = state.fingerprint["fingerprint"]
    claimed = request.headers.get("x-render-fingerprint")
    stream_state = body.get("stream_state")
    if claimed is None and isinstance(stream_state, dict) and isinstance(stream_state.get("rs_fp"), str):
        claimed = stream_state["rs_fp"]
    if claimed is None or (ours.startswith(claimed[:32]) and len(claimed) >= 16):
        return None
    return fingerprint_conflict(state.fingerprint, claimed, request.headers.get("x-render-fingerprint-components"))
