"""The gateway endpoints: `/v1/chat/completions` and `/v1/completions`, answered as `vllm serve`
answers them, from render (here), generate (an engine) and derender (here).

Errors before the answer starts are HTTP errors in vLLM's shape (the render's own 4xx, an engine's
4xx passed through, 503 when no engine could serve); once a stream has started, a failure ends it
with vLLM's `data: {"error": ...}` event and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from render_service import adapter
from render_service.derender import pipeline as derender
from render_service.exceptions import BadRequestError, RenderServiceError
from render_service.gateway import Gateway, client
from render_service.gateway.streams import ChatStream, CompletionStream, usage
from render_service.multimodal import media
from render_service.render import pipeline as render
from render_service.server.body import object_body
from render_service.server.middleware import json_endpoint
from render_service.server.state import State

logger = logging.getLogger("render_service.gateway")

T = TypeVar("T")

STOP_STRINGS_UNSUPPORTED = (
    "stop strings are not supported by the gateway: a --tokens-only engine cannot apply them. "
    "Use stop_token_ids instead."
)
CLIENT_CLOSED = 499  # nginx's "client closed request": what the metrics record for a disconnect


class ClientDisconnected(Exception):
    pass


class SSEResponse(StreamingResponse):
    """A stream that notices the client leaving even while no chunk is due (an engine still in
    prefill or stalled): Starlette only listens for the disconnect under ASGI < 2.4."""

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                with contextlib.suppress(OSError):  # the client left mid-write
                    await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled (and so its engine connection closed) if the client leaves first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected


def _refuse_unsupported(state: State, body: dict[str, Any]) -> None:
    if body.get("stop"):
        raise BadRequestError(STOP_STRINGS_UNSUPPORTED, param="stop")
    if state.context.vision is not None and media.image_urls(body.get("messages"), include_data=True):
        raise BadRequestError("image inputs are not supported by the gateway yet; use /v1/chat/completions/render")
    if body.get("stream") and adapter.runtime(state.context) is not None:
        raise BadRequestError(
            "streaming with parsers that run through vLLM (the adapter) is not supported by the gateway yet; "
            "use stream=false, or /v1/chat/completions/render and /derender",
            param="stream",
        )


def _model_name(state: State, body: dict[str, Any]) -> str:
    """vLLM names the base model by its first served name, and an adapter by its own name."""
    model = body.get("model")
    names = state.settings.served_names
    return model if isinstance(model, str) and model and model not in names else names[0]


def _stream_error(exc: Exception) -> bytes:
    if isinstance(exc, client.EngineFailure):
        message = f"The engine failed after the stream started: {exc.message}"
    else:
        message = "Internal server error"
    error = RenderServiceError(message)
    return sse(error.body())


def _sse_stream(
    gateway: Gateway,
    endpoint: str,
    arrived: float,
    stream: client.EngineStream,
    convert: Callable[[Any], list[Any]],
    finish: Callable[[], list[Any]],
) -> AsyncIterator[bytes]:
    """The client's SSE body from an open engine stream; closes the engine connection however it ends."""

    async def body() -> AsyncIterator[bytes]:
        metrics = gateway.metrics
        metrics.ttft.labels(endpoint).observe(time.perf_counter() - arrived)
        last = time.perf_counter()
        finished = False
        try:
            async for engine_chunk in stream:
                now = time.perf_counter()
                tokens = sum(len(c.get("token_ids") or []) for c in engine_chunk.get("choices") or [])
                if tokens and engine_chunk is not stream.first:
                    metrics.inter_token.labels(endpoint).observe((now - last) / tokens)
                last = now
                for chunk in convert(engine_chunk):
                    yield sse(chunk)
            for chunk in finish():
                yield sse(chunk)
            finished = True
        except (client.EngineFailure, RenderServiceError) as exc:
            logger.warning("%s: stream from %s failed after the first token: %s", endpoint, stream.engine.url, exc)
            yield _stream_error(exc if isinstance(exc, client.EngineFailure) else Exception())
            finished = True
        except Exception as exc:
            logger.exception("%s: error while streaming", endpoint)
            yield _stream_error(exc)
            finished = True
        finally:
            if not finished:  # cancelled: the client went away
                metrics.disconnects.inc()
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        yield DONE

    return body()


# -- /v1/chat/completions ----------------------------------------------------------------------


@json_endpoint("chat_completions")
async def chat_completions(state: State, request: Request, body: Any) -> Any:
    arrived = time.perf_counter()
    body = object_body(body)
    gateway = Gateway.of(request)
    _refuse_unsupported(state, body)
    rendered = render.render_chat(state.context, body, request.headers.get("x-request-id"))
    state.metrics.prompt_tokens.inc(len(rendered["token_ids"]))
    prompt_ids: list[int] = rendered["token_ids"]
    request_id: str = rendered["request_id"]
    model = _model_name(state, body)
    try:
        if rendered["stream"]:
            # Built before the engine stream opens: a converter that fails leaves nothing running.
            converter = ChatStream(state.derender, body, request_id, prompt_ids, model)
            stream = await until_disconnect(request, client.open_stream(gateway.pool, rendered))
            return SSEResponse(
                _sse_stream(gateway, "chat_completions", arrived, stream, converter.feed, converter.finish)
            )
        generated = await until_disconnect(request, client.generate(gateway.pool, rendered))
    except ClientDisconnected:
        gateway.metrics.disconnects.inc()
        return Response(status_code=CLIENT_CLOSED)
    generated["request_id"] = request_id  # the engine prefixes its own; tool-call ids derive from ours
    if body.get("return_token_ids"):
        generated["prompt_token_ids"] = prompt_ids
    return derender.derender_chat(
        state.derender,
        {
            "generate_response": generated,
            "prompt_token_ids": prompt_ids,
            "chat_request": body,
            "prompt_tokens": len(prompt_ids),
            "model": model,
        },
    )


# -- /v1/completions ---------------------------------------------------------------------------


@json_endpoint("completions")
async def completions(state: State, request: Request, body: Any) -> Any:
    arrived = time.perf_counter()
    body = object_body(body)
    gateway = Gateway.of(request)
    if body.get("stop"):
        raise BadRequestError(STOP_STRINGS_UNSUPPORTED, param="stop")
    if body.get("echo"):
        raise BadRequestError("echo is not supported by the gateway yet", param="echo")
    rendered = render.render_completion(state.context, body, request.headers.get("x-request-id"))
    state.metrics.prompt_tokens.inc(sum(len(r["token_ids"]) for r in rendered))
    base_id = rendered[0]["request_id"] if len(rendered) == 1 else rendered[0]["request_id"].rsplit("-", 1)[0]
    model = _model_name(state, body)
    try:
        if body.get("stream"):
            if len(rendered) != 1:
                raise BadRequestError("streaming several prompts is not supported by the gateway yet", param="prompt")
            converter = CompletionStream(state.derender, body, base_id, rendered[0]["token_ids"], model)
            stream = await until_disconnect(request, client.open_stream(gateway.pool, rendered[0]))

            def finish() -> list[Any]:
                if not converter.include_usage:
                    return []
                final = usage(len(converter.prompt_ids), converter.completion_tokens)
                return [
                    {
                        "id": base_id,
                        "object": "text_completion",
                        "created": converter.created,
                        "model": model,
                        "choices": [],
                        "usage": final,
                    }
                ]

            return SSEResponse(_sse_stream(gateway, "completions", arrived, stream, converter.feed, finish))
        generated = await until_disconnect(
            request, asyncio.gather(*(client.generate(gateway.pool, one) for one in rendered))
        )
    except ClientDisconnected:
        gateway.metrics.disconnects.inc()
        return Response(status_code=CLIENT_CLOSED)
    responses = list(generated)
    for gen, one in zip(responses, rendered, strict=True):
        gen["request_id"] = base_id
        if body.get("return_token_ids"):
            gen["prompt_token_ids"] = one["token_ids"]
    return derender.derender_completion(
        state.derender,
        {
            "generate_responses": responses,
            "prompt_token_ids": [one["token_ids"] for one in rendered],
            "prompt_tokens": [len(one["token_ids"]) for one in rendered],
            "completion_request": body,
            "model": model,
        },
    )
