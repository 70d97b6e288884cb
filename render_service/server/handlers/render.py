"""The render endpoints: a request (OpenAI chat or completions, Anthropic Messages, Responses) in,
token ids and a vLLM `GenerateRequest` out. Image URLs are fetched here, before the render."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from render_service.api import messages, responses
from render_service.multimodal import media
from render_service.render import continuation, prefix
from render_service.render import pipeline as render
from render_service.server.body import object_body
from render_service.server.middleware import json_endpoint
from render_service.server.responses import JSONBody, PartsResponse
from render_service.server.state import State

# One render, given the request's fetched images (None: none to fetch).
RenderOne = Callable[[dict[str, bytes] | None], dict[str, Any]]


@json_endpoint("chat_render")
async def chat_render(state: State, request: Request, body: Any) -> Any:
    body = object_body(body)
    checks: list[prefix.PrefixCheck] = []
    generated = await generated_ids(state, body)
    render_one = partial(
        render.render_chat,
        state.context,
        body,
        request.headers.get("x-request-id"),
        prefix_checks=checks,
        generated=generated,
    )
    result = await _with_images(state, body.get("messages"), render_one, body)
    return _with_prefix_header(with_continuation(state, result, generated), checks)


async def generated_ids(state: State, body: dict[str, Any]) -> continuation.Lookup | None:
    """Token-identical continuation, when the server allows it and the request asks for it: each
    assistant message's handle checked (an altered one is a 400) and its ids fetched."""
    store = state.generated
    if store is None or not continuation.asked(body):
        return None
    return await store.resolve(body.get("messages"))


def with_continuation(state: State, result: Any, generated: continuation.Lookup | None) -> Any:
    """The continuation verdict in the body (`continuation`) and as a header; only for requests that
    asked for it, so every other response stays vLLM's byte for byte."""
    if generated is None:
        return result
    if generated.result is None:  # rendered without templating (forwarded prompt ids)
        generated.result = continuation.Continuation(False, reason=continuation.UNSUPPORTED)
    assert state.generated is not None
    state.generated.count(generated)
    header = (_CONTINUATION_HEADER, generated.result.header().encode("latin-1"))
    if isinstance(result, Response):  # pre-encoded image parts: the header alone
        result.headers[continuation.HEADER] = generated.result.header()
        return result
    result[continuation.BODY_FIELD] = generated.result.to_json()
    return JSONBody(result, [header])


_CONTINUATION_HEADER = continuation.HEADER.lower().encode("latin-1")


@json_endpoint("completion_render")
async def completion_render(state: State, request: Request, body: Any) -> Any:
    body = object_body(body)
    results = render.render_completion(state.context, body, request.headers.get("x-request-id"))
    state.metrics.prompt_tokens.inc(sum(len(r["token_ids"]) for r in results))
    return results


@json_endpoint("messages_render")
async def messages_render(state: State, request: Request, body: Any) -> Any:
    chat = messages.convert(state.context, object_body(body))
    checks: list[prefix.PrefixCheck] = []
    render_one = partial(
        render.render_chat,
        state.context,
        chat,
        request.headers.get("x-request-id"),
        converted=True,
        prefix_checks=checks,
    )
    return _with_prefix_header(await _with_images(state, chat["messages"], render_one, chat), checks)


def _with_prefix_header(result: Any, checks: list[prefix.PrefixCheck]) -> Any:
    """The prefix guard's verdict as a response header: the body stays vLLM's, byte for byte."""
    if not checks:
        return result
    if isinstance(result, Response):
        result.headers[prefix.HEADER] = checks[0].header()
        return result
    header = (_PREFIX_HEADER, checks[0].header().encode("latin-1"))
    if isinstance(result, JSONBody):
        result.headers.append(header)
        return result
    return JSONBody(result, [header])


_PREFIX_HEADER = prefix.HEADER.lower().encode("latin-1")


@json_endpoint("responses_render")
async def responses_render(state: State, request: Request, body: Any) -> Any:
    body = object_body(body)
    context = state.context
    conversation = None
    if context.vision is not None:  # find the image URLs to fetch (a valid request only)
        responses.validate_responses_request(body)
        conversation = responses.input_messages(body)
    return await _with_images(state, conversation, partial(responses.render_responses, context, body), body)


async def _with_images(state: State, conversation: Any, render_one: RenderOne, body: dict[str, Any]) -> Any:
    """Render, after fetching the conversation's http(s) image URLs (off the loop's CPU path).
    `body`: where the render reads `mm_payload` and `mm_processor_kwargs` (the Redis tier's step)."""
    if state.context.vision is None:
        return _finish_render(state, render_one(None))
    tiered_images = state.image_tier is not None
    urls = media.image_urls(conversation, include_data=tiered_images)
    if tiered_images and urls:
        return await _tiered(state, urls, render_one, body)
    if urls:
        fetched = await media.fetch_all(urls, state.context.media_limits)
        return _finish_render(state, render_one(fetched))
    return _finish_render(state, render_one(None))


async def _tiered(state: State, urls: list[str], render_one: RenderOne, body: dict[str, Any]) -> Any:
    """Fetching with the Redis tier: the local cache is filled from Redis before the render
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
        state.settings.trust_request_mm_kwargs,
    )
    response = _finish_render(state, render_one(prepared))
    await tier.store(vision, prepared)
    return response


def _finish_render(state: State, result: dict[str, Any]) -> Any:
    """Count the prompt tokens and image-cache use; image features go out as pre-encoded parts."""
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
