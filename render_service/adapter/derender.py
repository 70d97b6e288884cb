"""Batch and streaming chat derender through the adapter's vLLM parsers.

The derender pipeline calls these when `adapter.runtime(...)` is set; everything around the
parser (validation, bounds, detokenization, stop tokens, logprobs, the response envelope) is
the pipeline's own. Streaming follows `OnlineDerenderer._derender_chat_stream_parsed` step by
step, except that the parser is not rebuilt and replayed on every chunk: the live
`ChatStreamProcessor` of the stream waits in the worker's `LiveStreamCache`, keyed by the
stream id the service adds to the state (`rs_sid`) and checked against the client-carried
output (the same token ids). On a miss (first chunk after a restart, another worker, an
eviction, a stream started by a vLLM replica) the carried output is replayed once, exactly as
vLLM replays it, and the miss is counted in /metrics.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any

from render_service.adapter.streams import LiveStream, estimate_bytes
from render_service.derender import logprobs as lp
from render_service.derender.detokenize import (
    DetokState,
    TokenizerInfo,
    decode_params,
    detokenize_delta,
    drop_stop_token,
    seed_state,
)
from render_service.exceptions import BadRequestError

if TYPE_CHECKING:
    from render_service.adapter import AdapterRuntime
    from render_service.derender.pipeline import DerenderContext

logger = logging.getLogger(__name__)

# vLLM answers any failure of a replayed parser with this 400 (ServingDerender).
STREAM_FAILED = "invalid stream_state: derender failed"


def compact_refused(runtime: AdapterRuntime) -> BadRequestError:
    flags = ", ".join(f"{flag} {name}" for flag, name in runtime.flags.items())
    return BadRequestError(
        f"compact stream_state is not available for {flags}: this parser comes from vLLM and its live "
        "state cannot move between replicas. Run the server with --stream-state-mode full (the "
        "default) to stream with it.",
        param="stream_state",
    )


# -- batch --------------------------------------------------------------------------------------------


def batch_message(
    runtime: AdapterRuntime,
    chat_request: dict[str, Any],
    template_kwargs: dict[str, Any],
    text: str,
    token_ids: list[int],
    prompt_token_ids: list[int] | None,
    finish_reason: str | None,
) -> tuple[dict[str, Any], str | None]:
    """(content, reasoning, tool_calls) wire fields of one choice and its chat finish reason."""
    parsers = runtime.parsers
    try:
        request = parsers.request(chat_request)
        return parsers.parse_choice(request, template_kwargs, text, token_ids, prompt_token_ids, finish_reason)
    except ValueError as exc:  # what vLLM's derender_chat answers with a 400
        raise BadRequestError(str(exc)) from None


# -- streaming ----------------------------------------------------------------------------------------


def _replay(
    runtime: AdapterRuntime,
    info: TokenizerInfo,
    request: Any,
    template_kwargs: dict[str, Any],
    state: dict[str, Any],
    prompt_ids: list[int] | None,
    spaces: bool,
) -> tuple[Any, DetokState, int]:
    """vLLM's `_replay`: a fresh processor fed every carried chunk (never finished)."""
    processor = runtime.parsers.new_stream(request, template_kwargs)
    detok = seed_state(info, prompt_ids, skip_special_tokens=False)
    ids, start, chars = state["output_token_ids"], 0, 0
    for length in state["output_chunk_lens"]:
        chunk = ids[start : start + length]
        start += length
        text, detok = detokenize_delta(
            info, chunk, detok, skip_special_tokens=False, spaces_between_special_tokens=spaces
        )
        chars += len(text)
        processor.step(text, chunk, None, prompt_ids)
    return processor, detok, chars


def stream_chunk(
    ctx: DerenderContext,
    runtime: AdapterRuntime,
    chunk: dict[str, Any],
    state: dict[str, Any],
    chat_request: dict[str, Any],
    template_kwargs: dict[str, Any],
    prompt_ids: list[int] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One chunk of a parsed chat stream: (the chunk's choices, the new client state)."""
    if ctx.compact:
        raise compact_refused(runtime)
    from render_service.derender.pipeline import _VLLM_STATE_KEYS

    if not chunk["choices"]:  # a usage-only chunk: nothing to parse, the state goes back as it came
        return [], state
    metrics = ctx.metrics
    info = TokenizerInfo.of(ctx.render.model.hf_tokenizer)
    cache = runtime.streams
    _, spaces = decode_params(None, chat_request.get("spaces_between_special_tokens", True), preserve_special=True)
    output_ids: list[int] = state["output_token_ids"]
    position = len(output_ids)
    sid = state.get("rs_sid")
    live = None
    if isinstance(sid, str) and len(sid) <= 64:
        live = cache.take(sid, output_ids)
        # The request travels with every chunk: a changed one is parsed as vLLM would parse it.
        if live is not None and live.chat_request != chat_request:
            live = None
    else:
        sid = None
    try:
        if live is not None:
            metrics.adapter_stream_hits.inc()
            processor, detok, prior_chars = live.processor, live.detok, live.chars
        else:
            metrics.adapter_stream_misses.inc()
            request = runtime.parsers.request(chat_request)
            processor, detok, prior_chars = _replay(runtime, info, request, template_kwargs, state, prompt_ids, spaces)
            if state["output_chunk_lens"]:
                metrics.replays.inc()
                metrics.replayed_tokens.inc(position)
        if sid is None:
            sid = secrets.token_hex(16)
        # vLLM: "Replay rebuilds the same flag. The carried one stays authoritative."
        processor.tools_streamed = state["tools_streamed"]
        choices, new_state, chars = _step(ctx, info, processor, detok, chunk, state, chat_request, prompt_ids, spaces)
    except BadRequestError:
        raise
    except Exception as exc:  # vLLM: any failure of the parser on client-carried state is this 400
        logger.debug("adapter stream failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        cache.discard(sid or "")
        raise BadRequestError(STREAM_FAILED) from None
    detok = new_state.pop("_detok")
    total_chars = chars + prior_chars
    finished = any(choice["finish_reason"] is not None for choice in choices)
    new_position = len(new_state["output_token_ids"])
    if not finished:
        cache.put(
            sid,
            LiveStream(
                new_state["output_token_ids"],  # the list the response carries (never mutated)
                processor,
                detok,
                chat_request,
                total_chars,
                estimate_bytes(new_position, total_chars),
            ),
        )
    out = {key: new_state[key] for key in _VLLM_STATE_KEYS}
    out.update(rs_sid=sid, rs_pos=new_position, rs_fp=ctx.fingerprint[:16])
    metrics.adapter_stream_cache_bytes.set(cache.nbytes)
    return choices, out


def _step(
    ctx: DerenderContext,
    info: TokenizerInfo,
    processor: Any,
    detok: DetokState,
    chunk: dict[str, Any],
    state: dict[str, Any],
    chat_request: dict[str, Any],
    prompt_ids: list[int] | None,
    spaces: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """The current chunk, as `_derender_chat_stream_parsed` processes it after the replay."""
    from render_service.adapter import vllm_parsers
    from render_service.derender.pipeline import _stop_params

    model = ctx.render.model
    output_ids = list(state["output_token_ids"])
    chunk_lens = list(state["output_chunk_lens"])
    role_sent = state["role_sent"]
    last_ids = list(state["last_tool_call_ids"])
    context = list(state["logprob_context_token_ids"])
    hide = processor.hide_metadata
    return_token_ids = bool(chat_request.get("return_token_ids")) and not hide
    chars = 0
    choices = []
    if chunk["choices"]:
        choice = chunk["choices"][0]
        delta_ids = choice.get("token_ids") or []
        finish = choice.get("finish_reason")
        text_ids, stop_reason = drop_stop_token(
            delta_ids,
            finish,
            choice.get("stop_reason"),
            eos_token_id=model.eos_token_id,
            model_eos_token_ids=ctx.model_eos_ids,
            params=_stop_params(chat_request),
        )
        message = None
        finish_reason = None
        if delta_ids or finish is not None:
            text = ""
            if delta_ids:
                text, detok = detokenize_delta(
                    info, text_ids, detok, skip_special_tokens=False, spaces_between_special_tokens=spaces
                )
                chars = len(text)
            message, finish_reason = vllm_parsers.step(processor, text, delta_ids, finish, prompt_ids)
        if delta_ids:
            output_ids.extend(delta_ids)
            chunk_lens.append(len(delta_ids))
        resolved = (
            lp.resolve(choice["logprobs"], ctx.decoder, context, lp.chat_top_limit(chat_request))
            if choice.get("logprobs") is not None and not hide
            else None
        )
        context = lp.context_tail(context, delta_ids)
        if message is None:
            message = vllm_parsers.empty_delta()
        for call in message.tool_calls:
            if call.id is None:
                continue
            if call.index < len(last_ids):  # pin the id already sent for this index
                call.id = last_ids[call.index]
            else:
                last_ids.append(call.id)
        if not role_sent:
            message.role = "assistant"
            role_sent = True
        choices.append(
            {
                "index": choice["index"],
                "delta": message.model_dump(mode="json"),
                "logprobs": resolved,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "token_ids": choice.get("token_ids") if return_token_ids else None,
                "weight_versions": None,
            }
        )
    new_state = dict(state)
    new_state.update(
        output_token_ids=output_ids,
        output_chunk_lens=chunk_lens,
        role_sent=role_sent,
        tools_streamed=processor.tools_streamed,
        last_tool_call_ids=last_ids,
        logprob_context_token_ids=context,
        _detok=detok,
    )
    return choices, new_state, chars
