"""The gateway endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/messages` and
`/v1/responses`, answered as `vllm serve` answers them, from render (here), generate (an engine)
and derender (here). Messages and Responses run on the chat generation, as in vLLM.

Errors before the answer starts are HTTP errors in vLLM's shape (the render's own 4xx, an engine's
4xx passed through, 503 when no engine could serve); once a stream has started, a failure ends it
with vLLM's `data: {"error": ...}` event and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from render_service import adapter
from render_service.api import messages as api_messages
from render_service.api import responses as api_responses
from render_service.derender import generated as generated_ids
from render_service.derender import pipeline as derender
from render_service.derender.detokenize import decode_params
from render_service.exceptions import BadRequestError, RenderServiceError
from render_service.gateway import Gateway, anthropic, client
from render_service.gateway import responses as gateway_responses
from render_service.gateway.anthropic import MessagesStream
from render_service.gateway.disconnect import ClientDisconnected, DisconnectWatch, SSEResponse, cancel_on_disconnect
from render_service.gateway.metrics import StreamSeries
from render_service.gateway.stops import StopWatch, stop_strings, without_stop_strings
from render_service.gateway.streams import ChatStream, CompletionStream, usage
from render_service.multimodal import media
from render_service.render import continuation
from render_service.render import pipeline as render
from render_service.server.body import object_body
from render_service.server.handlers import render as render_handlers
from render_service.server.middleware import json_endpoint
from render_service.server.state import State

logger = logging.getLogger("render_service.gateway")

CLIENT_CLOSED = 499  # nginx's "client closed request": what the metrics record for a disconnect


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _refuse_unsupported(state: State, body: dict[str, Any]) -> None:
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


def _failure_message(exc: Exception) -> str:
    if isinstance(exc, client.EngineFailure):
        return f"The engine failed after the stream started: {exc.message}"
    return "Internal server error"


def _stream_error(exc: Exception) -> bytes:
    return sse(RenderServiceError(_failure_message(exc)).body())


class Wire:
    """How one API writes a stream: the client bytes for each engine chunk, for the end, and for a
    failure after the start; `trailer` closes the body (`[DONE]` for the OpenAI APIs)."""

    trailer = DONE

    def prepare(self) -> None:
        """Work for the first chunk done ahead of it (`client.open_stream`'s `while_waiting`)."""

    def start(self) -> list[bytes]:
        return []

    def feed(self, engine_chunk: dict[str, Any]) -> list[bytes]:
        raise NotImplementedError

    def finish(self) -> list[bytes]:
        raise NotImplementedError

    def fail(self, exc: Exception) -> list[bytes]:
        return [_stream_error(exc)]


class ChatWire(Wire):
    def __init__(self, chat: ChatStream) -> None:
        self.chat = chat
        self._role = b""  # the role chunks, encoded ahead by `prepare`

    def prepare(self) -> None:
        self.chat.prepare()
        self._role = b"".join([sse(chunk) for chunk in self.chat.start()])

    def feed(self, engine_chunk: dict[str, Any]) -> list[bytes]:
        out = [sse(chunk) for chunk in self.chat.feed(engine_chunk)]
        if self._role:  # they go before the first output's chunk, as vLLM sends them
            out.insert(0, self._role)
            self._role = b""
        return out

    def finish(self) -> list[bytes]:
        return [sse(chunk) for chunk in self.chat.finish()]


class CompletionWire(Wire):
    def __init__(self, completion: CompletionStream) -> None:
        self.completion = completion

    def prepare(self) -> None:
        self.completion.prepare()

    def feed(self, engine_chunk: dict[str, Any]) -> list[bytes]:
        return [sse(chunk) for chunk in self.completion.feed(engine_chunk)]

    def finish(self) -> list[bytes]:
        c = self.completion
        if not c.include_usage:
            return []
        final = usage(len(c.prompt_ids), c.completion_tokens)
        chunk = {"id": c.id, "object": "text_completion", "created": c.created, "model": c.model, "choices": []}
        return [sse({**chunk, "usage": final})]


class MessagesWire(Wire):
    """Chat chunks through `MessagesStream`: Anthropic events, no `[DONE]`."""

    trailer = b""

    def __init__(self, chat: ChatStream) -> None:
        self.chat = chat
        self.messages = MessagesStream()

    def prepare(self) -> None:
        self.chat.prepare()

    def feed(self, engine_chunk: dict[str, Any]) -> list[bytes]:
        return [event for chunk in self.chat.feed(engine_chunk) for event in self.messages.feed(chunk)]

    def finish(self) -> list[bytes]:
        out = [event for chunk in self.chat.finish() for event in self.messages.feed(chunk)]
        return out + self.messages.finish()

    def fail(self, exc: Exception) -> list[bytes]:
        return self.messages.fail(500, _failure_message(exc))


class ResponsesWire(Wire):
    """Chat chunks through `ResponsesStream`: Responses events, no `[DONE]`."""

    trailer = b""

    def __init__(self, chat: ChatStream, stream: gateway_responses.ResponsesStream) -> None:
        self.chat = chat
        self.responses = stream

    def prepare(self) -> None:
        self.chat.prepare()

    def start(self) -> list[bytes]:
        return self.responses.start()

    def feed(self, engine_chunk: dict[str, Any]) -> list[bytes]:
        return [event for chunk in self.chat.feed(engine_chunk) for event in self.responses.feed(chunk)]

    def finish(self) -> list[bytes]:
        out = [event for chunk in self.chat.finish() for event in self.responses.feed(chunk)]
        return out + self.responses.finish()

    def fail(self, exc: Exception) -> list[bytes]:
        return self.responses.fail(_failure_message(exc))


def _observe_first(series: StreamSeries, to_client: float, ttft: float, to_engine: float | None) -> None:
    series.to_client.observe(to_client)
    series.ttft.observe(ttft)
    if to_engine is not None:
        series.to_engine.observe(to_engine)


def _sse_stream(
    gateway: Gateway,
    endpoint: str,
    arrived: float,
    stream: client.EngineStream,
    wire: Wire,
    watch: StopWatch | None = None,
) -> AsyncIterator[bytes]:
    """The client's SSE body from an open engine stream; closes the engine connection however it ends."""

    async def body() -> AsyncIterator[bytes]:
        metrics = gateway.metrics
        series = metrics.stream_series(endpoint)
        first_token_at = last = time.perf_counter()
        inter_token = series.inter_token
        finished = False
        try:
            if started := b"".join(wire.start()):
                yield started
            async for engine_chunk in stream:
                now = time.perf_counter()
                tokens = sum(len(c.get("token_ids") or []) for c in engine_chunk.get("choices") or [])
                first = engine_chunk is stream.first
                if tokens and not first:
                    inter_token.observe((now - last) / tokens)
                last = now
                if watch is not None:
                    engine_chunk = watch.apply(engine_chunk)
                data = b"".join(wire.feed(engine_chunk))  # one write per engine chunk
                if data:
                    yield data
                if first:
                    # Its bytes are with the client's transport now, which writes them to the socket
                    # once this step of the loop ends: the metrics are recorded after that write.
                    to_client = time.perf_counter() - stream.first_received_at
                    to_engine = stream.sent_at - arrived if gateway.disagg is None else None
                    asyncio.get_running_loop().call_soon(
                        _observe_first, series, to_client, first_token_at - arrived, to_engine
                    )
                if watch is not None and watch.done:
                    break  # a stop string finished every choice: closing the stream aborts the engine request
            if ended := b"".join(wire.finish()):
                yield ended
            finished = True
        except (client.EngineFailure, RenderServiceError) as exc:
            logger.warning("%s: stream from %s failed after the first token: %s", endpoint, stream.engine.url, exc)
            for data in wire.fail(exc if isinstance(exc, client.EngineFailure) else Exception()):
                yield data
            finished = True
        except Exception as exc:
            logger.exception("%s: error while streaming", endpoint)
            for data in wire.fail(exc):
                yield data
            finished = True
        finally:
            if not finished:  # cancelled: the client went away
                metrics.disconnects.inc()
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        if wire.trailer:
            yield wire.trailer

    return body()


# -- stop strings (applied here: a --tokens-only engine refuses them) ----------------------------


def _stop_watch(state: State, request_body: dict[str, Any], rendered: dict[str, Any]) -> StopWatch | None:
    """A watch over the engine's tokens when the request has stop strings, decoding as the engine's
    detokenizer would (the rendered sampling parameters)."""
    stops = stop_strings(request_body)
    if not stops:
        return None
    sampling = rendered["sampling_params"]
    skip, spaces = decode_params(
        sampling.get("skip_special_tokens"), sampling.get("spaces_between_special_tokens", True)
    )
    return StopWatch(
        state.derender.render.model.hf_tokenizer,
        rendered["token_ids"],
        stops,
        n=int(sampling.get("n") or 1),
        include_in_output=bool(sampling.get("include_stop_str_in_output")),
        min_tokens=int(sampling.get("min_tokens") or 0),
        skip_special_tokens=skip,
        spaces_between_special_tokens=spaces,
    )


async def _generate_watched(gateway: Gateway, rendered: dict[str, Any], watch: StopWatch) -> dict[str, Any]:
    """A non-streaming generate under stop strings: streamed from the engine so that a match ends
    the engine request, assembled into the `GenerateResponse` a detokenizing engine would send."""
    stream = await gateway.open_stream({**without_stop_strings(rendered), "stream": True, "stream_options": None})
    choices: dict[int, dict[str, Any]] = {}
    try:
        async for engine_chunk in stream:
            for choice in watch.apply(engine_chunk)["choices"]:
                index = int(choice.get("index") or 0)
                into = choices.setdefault(
                    index,
                    {"index": index, "token_ids": [], "finish_reason": None, "stop_reason": None, "logprobs": None},
                )
                into["token_ids"] += choice.get("token_ids") or []
                if choice.get("logprobs") is not None:
                    into["logprobs"] = into["logprobs"] or {"content": []}
                    into["logprobs"]["content"] += choice["logprobs"].get("content") or []
                if choice.get("finish_reason") is not None:
                    into["finish_reason"], into["stop_reason"] = choice["finish_reason"], choice.get("stop_reason")
            if watch.done:
                break
    except client.EngineFailure as exc:
        raise exc.answer or RenderServiceError(f"The engine failed: {exc.message}") from None
    finally:
        await stream.aclose()
    return {
        "request_id": rendered["request_id"],
        "choices": [choices[index] for index in sorted(choices)],
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
        "metrics": None,
    }


async def _generate(gateway: Gateway, rendered: dict[str, Any], watch: StopWatch | None) -> dict[str, Any]:
    if watch is None:
        return await gateway.generate(rendered)
    return await _generate_watched(gateway, rendered, watch)


async def _open_stream(
    gateway: Gateway,
    request: Request,
    rendered: dict[str, Any],
    watch: StopWatch | None,
    make_wire: Callable[[], Wire],
) -> tuple[client.EngineStream, DisconnectWatch, Wire]:
    """The engine stream for `rendered`, the request's disconnect watch (for its `SSEResponse`) and
    the wire that writes the stream. Once the generate request is written, the watch starts and
    `make_wire` builds the wire, which prepares its first chunk, while the engine works: none of it
    delays the engine (a wire that fails to build or prepare abandons the engine request, and its
    error is the answer, as it would be before the request). With P/D the watch starts at once:
    the prefill hop comes before the written request."""
    disconnect = DisconnectWatch(request.receive)
    wires: list[Wire] = []

    def while_waiting() -> None:
        disconnect.start()
        wire = make_wire()
        wires.append(wire)
        wire.prepare()

    if gateway.disagg is not None:
        disconnect.start()
    try:
        with disconnect:
            stream = await gateway.open_stream(
                rendered if watch is None else without_stop_strings(rendered), while_waiting
            )
    except BaseException:
        disconnect.close()
        raise
    return stream, disconnect, wires[0]


# -- /v1/chat/completions (and the chat generation Messages and Responses run on) ----------------


async def _chat_generation(
    state: State,
    request: Request,
    chat: dict[str, Any],
    rendered: dict[str, Any],
    model: str,
    endpoint: str,
    arrived: float,
    make_wire: Callable[[ChatStream], Wire],
) -> Response | tuple[dict[str, Any], dict[str, Any]]:
    """Generate `rendered` for the chat request `chat`: a streaming response through `make_wire`'s
    wire, or (the chat completion, the engine's answer)."""
    gateway = Gateway.of(request)
    prompt_ids: list[int] = rendered["token_ids"]
    request_id: str = rendered["request_id"]
    watch = _stop_watch(state, chat, rendered)
    try:
        if rendered["stream"]:

            def build() -> Wire:
                return make_wire(ChatStream(state.derender, chat, request_id, prompt_ids, model))

            stream, disconnect, wire = await _open_stream(gateway, request, rendered, watch, build)
            return SSEResponse(_sse_stream(gateway, endpoint, arrived, stream, wire, watch), disconnect)
        async with cancel_on_disconnect(request.receive):
            generated = await _generate(gateway, rendered, watch)
    except ClientDisconnected:
        gateway.metrics.disconnects.inc()
        return Response(status_code=CLIENT_CLOSED)
    generated["request_id"] = request_id  # the engine prefixes its own; tool-call ids derive from ours
    if chat.get("return_token_ids"):
        generated["prompt_token_ids"] = prompt_ids
    answer = derender.derender_chat(
        state.derender,
        {
            "generate_response": generated,
            "prompt_token_ids": prompt_ids,
            "chat_request": chat,
            "prompt_tokens": len(prompt_ids),
            "model": model,
        },
    )
    return answer, generated


@json_endpoint("chat_completions")
async def chat_completions(state: State, request: Request, body: Any) -> Any:
    arrived = time.perf_counter()
    body = object_body(body)
    _refuse_unsupported(state, body)
    # --preserve-generated-tokens: the replies' generated ids spliced in, handles on the answer.
    continued = await render_handlers.generated_ids(state, body)
    rendered = render.render_chat(state.context, body, request.headers.get("x-request-id"), generated=continued)
    state.metrics.prompt_tokens.inc(len(rendered["token_ids"]))
    model = _model_name(state, body)
    result = await _chat_generation(state, request, body, rendered, model, "chat_completions", arrived, ChatWire)
    if continued is None:
        return result if isinstance(result, Response) else result[0]
    if isinstance(result, Response):  # streamed: the prompt is spliced, the answer carries no handle
        return render_handlers.with_continuation(state, result, continued)
    answer, engine_answer = result
    assert state.generated is not None
    issued = {"generate_response": engine_answer, "prompt_token_ids": rendered["token_ids"], "chat_request": body}
    await generated_ids.issue_batch(state.generated, issued, answer)
    reported = render_handlers.with_continuation(state, answer, continued)
    reported.content.pop(continuation.BODY_FIELD, None)  # the chat completion stays OpenAI's: a header only
    return reported


# -- /v1/messages ----------------------------------------------------------------------------


@json_endpoint("messages")
async def messages(state: State, request: Request, body: Any) -> Any:
    """Anthropic Messages as vLLM serves them: the request's schema errors in vLLM's own shape (its
    validation handler), everything after in Anthropic's (`translate_error_response`)."""
    arrived = time.perf_counter()
    body = object_body(body)
    api_messages.validate_messages_request(body)
    try:
        chat = api_messages.to_chat_request(body, api_messages.messages_defaults(state.context))
        _refuse_unsupported(state, chat)
        rendered = render.render_chat(state.context, chat, request.headers.get("x-request-id"), converted=True)
        state.metrics.prompt_tokens.inc(len(rendered["token_ids"]))
        model = _model_name(state, body)
        result = await _chat_generation(state, request, chat, rendered, model, "messages", arrived, MessagesWire)
    except RenderServiceError as exc:
        raise anthropic.AnthropicError(exc) from None
    return result if isinstance(result, Response) else anthropic.full_message(result[0])


# -- /v1/responses ---------------------------------------------------------------------------


@json_endpoint("responses")
async def responses(state: State, request: Request, body: Any) -> Any:
    """The Responses API on vLLM's simple path (one generation; no stored responses, as our render)."""
    arrived = time.perf_counter()
    body = object_body(body)
    if body.get("background"):
        raise BadRequestError(
            "background responses need a response store; the gateway is stateless", param="background"
        )
    if body.get("stream") and adapter.runtime(state.context) is not None:
        raise BadRequestError(
            "streaming with parsers that run through vLLM (the adapter) is not supported by the gateway yet",
            param="stream",
        )
    if state.context.vision is not None and media.image_urls(api_responses.input_messages(body), include_data=True):
        raise BadRequestError("image inputs are not supported by the gateway yet; use /v1/responses/render")
    rendered = api_responses.render_responses(state.context, body)  # validates `body` in place
    state.metrics.prompt_tokens.inc(len(rendered["token_ids"]))
    sampling: dict[str, Any] = rendered["sampling_params"]
    model = _model_name(state, body)
    chat = gateway_responses.chat_view(body, sampling)
    with_logprobs = gateway_responses.output_logprobs(body)
    if with_logprobs:  # resolved by the chat derender, as vLLM resolves both alike
        chat.update(logprobs=True, top_logprobs=body.get("top_logprobs") or 0)
    if rendered["stream"]:
        chat["stream_options"] = {"include_usage": True}

    def wire(stream: ChatStream) -> Wire:
        return ResponsesWire(stream, gateway_responses.ResponsesStream(body, sampling, rendered["request_id"], model))

    result = await _chat_generation(state, request, chat, rendered, model, "responses", arrived, wire)
    if isinstance(result, Response):
        return result
    answer, generated = result
    engine_choice = generated["choices"][0]
    finish = engine_choice.get("finish_reason")
    message = answer["choices"][0]["message"]
    logprobs = gateway_responses.text_logprobs(answer["choices"][0].get("logprobs")) if with_logprobs else None
    if state.derender.has_parser:
        if not chat["include_reasoning"]:
            logprobs = None  # vLLM drops them with the reasoning
        output = gateway_responses.output_items(body, message, finish, logprobs)
    else:
        output = gateway_responses.plain_output(message.get("content") or "", finish, logprobs)
    output_tokens = len(engine_choice.get("token_ids") or [])
    return gateway_responses.envelope(
        body,
        sampling,
        request_id=rendered["request_id"],
        model=model,
        created=int(time.time()),
        output=output,
        status="incomplete" if finish == "length" else "completed",
        usage=gateway_responses.usage(len(rendered["token_ids"]), output_tokens),
        kv_transfer_params=generated.get("kv_transfer_params"),
    )


# -- /v1/completions ---------------------------------------------------------------------------


@json_endpoint("completions")
async def completions(state: State, request: Request, body: Any) -> Any:
    arrived = time.perf_counter()
    body = object_body(body)
    gateway = Gateway.of(request)
    echo = bool(body.get("echo"))
    if echo and body.get("logprobs") is not None:
        raise BadRequestError("echo with logprobs (prompt logprobs) is not supported by the gateway yet", param="echo")
    rendered = render.render_completion(state.context, body, request.headers.get("x-request-id"))
    echoed = _echo_texts(body, len(rendered)) if echo else None
    state.metrics.prompt_tokens.inc(sum(len(r["token_ids"]) for r in rendered))
    base_id = rendered[0]["request_id"] if len(rendered) == 1 else rendered[0]["request_id"].rsplit("-", 1)[0]
    model = _model_name(state, body)
    try:
        if body.get("stream"):
            if len(rendered) != 1:
                raise BadRequestError("streaming several prompts is not supported by the gateway yet", param="prompt")
            watch = _stop_watch(state, body, rendered[0])
            prompt_ids = rendered[0]["token_ids"]
            echo_text = None if echoed is None else echoed[0]

            def build() -> Wire:
                return CompletionWire(
                    CompletionStream(state.derender, body, base_id, prompt_ids, model, echo_text=echo_text)
                )

            stream, disconnect, wire = await _open_stream(gateway, request, rendered[0], watch, build)
            return SSEResponse(_sse_stream(gateway, "completions", arrived, stream, wire, watch), disconnect)
        async with cancel_on_disconnect(request.receive):
            generated = await asyncio.gather(
                *(_generate(gateway, one, _stop_watch(state, body, one)) for one in rendered)
            )
    except ClientDisconnected:
        gateway.metrics.disconnects.inc()
        return Response(status_code=CLIENT_CLOSED)
    responses = list(generated)
    for gen, one in zip(responses, rendered, strict=True):
        gen["request_id"] = base_id
        if body.get("return_token_ids"):
            gen["prompt_token_ids"] = one["token_ids"]
    answer = derender.derender_completion(
        state.derender,
        {
            "generate_responses": responses,
            "prompt_token_ids": [one["token_ids"] for one in rendered],
            "prompt_tokens": [len(one["token_ids"]) for one in rendered],
            "completion_request": body,
            "model": model,
        },
    )
    if echoed is not None:  # vLLM's echo: the prompt's text before each choice's (by prompt, n each)
        per_prompt = len(answer["choices"]) // len(rendered)
        for position, choice in enumerate(answer["choices"]):
            choice["text"] = echoed[position // per_prompt] + choice["text"]
    return answer


def _echo_texts(body: dict[str, Any], count: int) -> list[str]:
    """The prompt texts echoed before the output ("" with return_token_ids, as vLLM does)."""
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    if len(prompts) != count or not all(isinstance(p, str) for p in prompts):
        raise BadRequestError("echo of token-id prompts is not supported by the gateway yet", param="echo")
    return ["" if body.get("return_token_ids") else p for p in prompts]


def routes() -> list[Route]:
    """The gateway's endpoints, mounted next to the render tier's (server/routes.py)."""
    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
    ]
