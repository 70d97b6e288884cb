"""Batch and streaming derender: engine token ids -> OpenAI chat / completions responses.

Batch derender follows vLLM 0.33's `OnlineDerenderer` step by step. Streaming differs where it
matters: vLLM rebuilds its parsers and replays the whole output on every chunk (O(n) work and
O(n) parse_delta calls per chunk); here each chunk resumes from a parser snapshot and costs
O(new tokens). The client-carried `stream_state` stays the truth: in `full` mode it is vLLM's
state plus our `rs_*` keys, so a vLLM replica can continue the stream and we can continue one
of vLLM's, replaying once when no snapshot matches. In `compact` mode the state is only a
handle and the snapshot is required (409 when it is gone).
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
from blake3 import blake3

from render_service import adapter, parsers
from render_service.adapter import derender as adapter_derender
from render_service.api.derender import Vouched, stream_state
from render_service.derender import logprobs as lp
from render_service.derender.detokenize import (
    DetokState,
    StopParams,
    decode_output,
    decode_params,
    detokenize_delta,
    drop_stop_token,
    seed_state,
)
from render_service.derender.echo import EchoDigest, EchoedArray, KeptRequest, RawEcho, Sent, SentCache, seal
from render_service.derender.snapshots import SnapshotStore, snapshot_key
from render_service.exceptions import BadRequestError, ConflictError
from render_service.parsers import harmony
from render_service.render.pipeline import RenderContext, check_model, effective_template_kwargs
from render_service.server.metrics import Metrics

MAX_N_SEQUENCES = 16384  # VLLM_MAX_N_SEQUENCES
MAX_TOOL_CALL_ID_CHARS = 512  # ours (vLLM: none); its own ids are 46 characters
# 2: the echo digest is blake3 over the JSON of the ids and chunk lengths (`echo.EchoDigest`); 3: held
# text in segments beside the snapshot (`held` refs, `derender/segments.py`); 4: `req` is the
# request's msgpack as bytes (`_StreamRequest.packed`)
STATE_VERSION = 4
STREAM_STOP_ERROR = (
    "stop strings are not supported by streaming derender because text already sent cannot be cut. "
    "Use non-streaming derender or output_mode=text on /inference/v1/generate which holds stop strings back."
)
MISSING_CHAT_REQUEST = (
    "chat_request is required when a tool or reasoning parser is configured because plain detokenization "
    "would leak raw parser markup into content."
)
MISSING_PROMPT_IDS = (
    "prompt_token_ids is required when a tool or reasoning parser is configured. Without it parse_delta "
    "cannot tell whether the prompt left reasoning open (e.g. a chat template that pre-opens <think>) and "
    "would misclassify reasoning content as plain content."
)


@dataclass(frozen=True)
class DerenderContext:
    render: RenderContext
    decoder: lp.Decoder
    model_eos_ids: frozenset[int]
    fingerprint: str
    store: SnapshotStore | None
    compact: bool
    metrics: Metrics
    # Whether a chat stream chunk's echo is read as bytes first (`vouch_raw`); set by `make_context`.
    reads_raw_echo: bool = False
    # What this process last sent per stream (`echo.SentCache`), when it reads echoes as bytes.
    sent: SentCache | None = None
    # Whether every configured parser is native (no vLLM adapter): the settings are fixed per
    # process, so it is decided once (`make_context`), not on every chunk.
    native: bool = True
    # The configured parser per `thinking` value (`_configured_parser`), built once: the lookup
    # checks the registries and the tokenizer cache on every call.
    parsers: dict[Any, parsers.ChatParser | None] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def has_parser(self) -> bool:
        s = self.render.settings
        return s.reasoning_parser is not None or (s.enable_auto_tool_choice and s.tool_call_parser is not None)


def make_context(
    render_ctx: RenderContext, fingerprint: str, store: SnapshotStore | None, metrics: Metrics
) -> DerenderContext:
    model = render_ctx.model
    eos = set(_generation_eos(model))
    if model.eos_token_id is not None:
        eos.add(model.eos_token_id)
    context = DerenderContext(
        render_ctx,
        lp.Decoder(model.hf_tokenizer),
        frozenset(eos),
        fingerprint,
        store,
        render_ctx.settings.stream_state_mode == "compact",
        metrics,
    )
    # Full mode with a snapshot store and native parsers (vLLM's, in the adapter, keep no snapshots).
    native = not adapter.uses_adapter(render_ctx.settings)
    raw = _vouches(context) and native
    return dataclasses.replace(context, reads_raw_echo=raw, sent=SentCache() if raw else None, native=native)


def _generation_eos(model: Any) -> list[int]:
    import json

    path = model.path / "generation_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if isinstance(value, int):
        return [value]
    return [v for v in value or [] if isinstance(v, int)]


# -- request parsing -------------------------------------------------------------------------
# The body was validated against vLLM's request union (api/derender.py) before it gets here; what
# is left is reading it with the defaults pydantic would have filled in.


def _with_finish_defaults(choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch choice's `finish_reason` defaults to "stop" (`GenerateChoiceBase`)."""
    for choice in choices:
        choice.setdefault("finish_reason", "stop")
    return choices


def _bounds(ctx: DerenderContext, responses: list[dict[str, Any]]) -> None:
    """`_validate_derender_bounds`: every size checked before any decode."""
    max_len = ctx.render.model.max_model_len
    max_logprobs = ctx.render.settings.max_logprobs
    if len(responses) > MAX_N_SEQUENCES:
        raise BadRequestError(
            f"generate_responses count ({len(responses)}) exceeds server maximum "
            f"({MAX_N_SEQUENCES}). Set VLLM_MAX_N_SEQUENCES to increase this limit."
        )
    for gen in responses:
        if len(gen["choices"]) > MAX_N_SEQUENCES:
            raise BadRequestError(
                f"choices count ({len(gen['choices'])}) in response '{gen.get('request_id')}' "
                f"exceeds server maximum ({MAX_N_SEQUENCES})."
            )
        for choice in gen["choices"]:
            ids = choice.get("token_ids")
            if ids and len(ids) > max_len:
                raise BadRequestError(
                    f"token_ids length ({len(ids)}) in choice {choice['index']} exceeds max_model_len ({max_len})."
                )
            content = (choice.get("logprobs") or {}).get("content")
            if content:
                if len(content) > max_len:
                    raise BadRequestError(
                        f"logprobs.content length ({len(content)}) in choice {choice['index']} "
                        f"exceeds max_model_len ({max_len})."
                    )
                for entry in content:
                    tops = entry.get("top_logprobs")
                    if max_logprobs >= 0 and tops and len(tops) > max_logprobs:
                        raise BadRequestError(
                            f"top_logprobs count ({len(tops)}) in choice {choice['index']} "
                            f"exceeds max_logprobs ({max_logprobs})."
                        )
        prompt_logprobs = gen.get("prompt_logprobs")
        if prompt_logprobs and len(prompt_logprobs) > max_len:
            raise BadRequestError(
                f"prompt_logprobs length ({len(prompt_logprobs)}) in response "
                f"'{gen.get('request_id')}' exceeds max_model_len ({max_len})."
            )


def _check_vocab(ctx: DerenderContext, ids: list[int], param: str = "token_ids") -> None:
    """Every id a decode may touch must be in the vocabulary (max/min run at C speed)."""
    if not ids:
        return
    vocab = ctx.decoder.vocab_size
    high, low = max(ids), min(ids)
    if high >= vocab or low < 0:
        bad = high if high >= vocab else low
        raise BadRequestError(f"token id {bad} is out of the vocabulary (size {vocab}).", param=param)


def _check_choices_vocab(ctx: DerenderContext, choices: list[dict[str, Any]]) -> None:
    """Output ids and the ids inside their logprobs (decoded too: a bad one used to raise a 500)."""
    for choice in choices:
        _check_vocab(ctx, choice.get("token_ids") or [])
        content = (choice.get("logprobs") or {}).get("content")
        if content:
            ids = [entry["token_id"] for entry in content]
            ids.extend(top["token_id"] for entry in content for top in entry.get("top_logprobs") or ())
            _check_vocab(ctx, ids, "logprobs")


def _prompt_ids_bound(ctx: DerenderContext, ids: list[int] | None) -> None:
    max_len = ctx.render.model.max_model_len
    if ids is not None and len(ids) > max_len:
        raise BadRequestError(f"prompt_token_ids length ({len(ids)}) exceeds max_model_len ({max_len}).")
    if ids is not None:
        _check_vocab(ctx, ids, "prompt_token_ids")


def _state_bounds(ctx: DerenderContext, state: dict[str, Any] | None, echo_vouched: bool = False) -> None:
    """What a replay would decode from the client-carried state: in the vocabulary, and bounded.
    `echo_vouched`: the output ids are an echo this service checked before (`Vouch`)."""
    if state is None:
        return
    if not echo_vouched:
        _check_vocab(ctx, state["output_token_ids"], "stream_state.output_token_ids")
    _check_vocab(ctx, state["logprob_context_token_ids"], "stream_state.logprob_context_token_ids")
    ids = state["last_tool_call_ids"]
    max_len = ctx.render.model.max_model_len
    if len(ids) > max_len or any(len(i) > MAX_TOOL_CALL_ID_CHARS for i in ids):
        raise BadRequestError(
            f"stream_state.last_tool_call_ids must hold at most max_model_len ({max_len}) ids "
            f"of at most {MAX_TOOL_CALL_ID_CHARS} characters.",
            param="stream_state.last_tool_call_ids",
        )


def _stop_params(request: dict[str, Any] | None) -> StopParams:
    if request is None:
        return StopParams()
    return StopParams(
        stop=StopParams.stop_strings(request.get("stop")),
        stop_token_ids=tuple(request.get("stop_token_ids") or ()),
        ignore_eos=bool(request.get("ignore_eos", False)),
        include_stop_str_in_output=bool(request.get("include_stop_str_in_output", False)),
        min_tokens=int(request.get("min_tokens", 0) or 0),
    )


def _prompt_token_count(value: int | None) -> int:
    """`prompt_tokens: int | None`, 0 when absent."""
    return value or 0


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _model_name(ctx: DerenderContext, body: dict[str, Any]) -> str:
    return body.get("model") or ctx.render.settings.served_names[0]


def parser_for(ctx: DerenderContext, request: dict[str, Any]) -> tuple[parsers.ChatParser | None, dict[str, Any]]:
    """The native parser for one chat request (Harmony's for gpt-oss), and the template kwargs it read."""
    settings = ctx.render.settings
    if ctx.render.model.renderer_mode == "harmony":  # Harmony output is parsed without template kwargs
        return _configured_parser(ctx, True), {}
    kwargs = effective_template_kwargs(ctx.render, request)
    thinking = parsers.thinking_enabled(settings.reasoning_parser, kwargs, settings.tool_call_parser)
    return _configured_parser(ctx, thinking), kwargs


def _configured_parser(ctx: DerenderContext, thinking: bool) -> parsers.ChatParser | None:
    """The server's parser; for gpt-oss, vLLM's HarmonyParser replaces the composition."""
    try:
        return ctx.parsers[thinking]
    except KeyError:
        pass
    parser = _build_parser(ctx, thinking)
    ctx.parsers[thinking] = parser
    return parser


def _build_parser(ctx: DerenderContext, thinking: bool) -> parsers.ChatParser | None:
    settings = ctx.render.settings
    get = harmony.get_parser if ctx.render.model.renderer_mode == "harmony" else parsers.get_parser
    return get(
        ctx.render.model.hf_tokenizer,
        settings.reasoning_parser,
        settings.tool_call_parser,
        enable_auto_tools=settings.enable_auto_tool_choice,
        thinking_enabled=thinking,
    )


def _tool_call_wire(call_id: str, call: parsers.FunctionCall) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _message(
    content: str | None, reasoning: str | None = None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = reasoning
    return message


# -- batch ----------------------------------------------------------------------------------


def derender_chat(ctx: DerenderContext, body: dict[str, Any]) -> dict[str, Any]:
    gen = body["generate_response"]
    _with_finish_defaults(gen["choices"])
    prompt_ids = body.get("prompt_token_ids")
    chat_request = body.get("chat_request")
    check_model(ctx.render, body.get("model"))
    _bounds(ctx, [gen])
    _prompt_ids_bound(ctx, prompt_ids)
    if ctx.has_parser and chat_request is None:
        raise BadRequestError(MISSING_CHAT_REQUEST)
    _check_choices_vocab(ctx, gen["choices"])
    _prompt_ids_bound(ctx, gen.get("prompt_token_ids"))

    model = ctx.render.model
    tokenizer = model.hf_tokenizer
    # Parsers with no native implementation run through vLLM's (render_service/adapter).
    vllm_parsers = adapter.runtime(ctx.render) if ctx.has_parser and chat_request is not None else None
    parser, _ = (
        parser_for(ctx, chat_request)
        if (ctx.has_parser and chat_request is not None and vllm_parsers is None)
        else (None, {})
    )
    opts = parsers.RequestOptions.from_request(chat_request)
    skip_special, spaces = decode_params(
        None if chat_request is None else chat_request.get("skip_special_tokens"),
        True if chat_request is None else chat_request.get("spaces_between_special_tokens", True),
        preserve_special=parser is not None or vllm_parsers is not None,
    )
    seed_ids = prompt_ids if prompt_ids is not None else gen.get("prompt_token_ids")
    seed = seed_state(tokenizer, seed_ids, skip_special_tokens=skip_special)
    hide_metadata = (parser is not None or vllm_parsers is not None) and not opts.include_reasoning
    return_token_ids = bool(chat_request and chat_request.get("return_token_ids")) and not hide_metadata
    top_limit = lp.chat_top_limit(chat_request)
    stop = _stop_params(chat_request)
    request_id = gen.get("request_id") or ""
    choices = []
    for choice in gen["choices"]:
        token_ids = choice.get("token_ids")
        if not token_ids:
            raise BadRequestError(f"choice {choice['index']} has empty or null token_ids")
        resolved = (
            lp.resolve(choice["logprobs"], ctx.decoder, top_limit=top_limit)
            if choice.get("logprobs") is not None and not hide_metadata
            else None
        )
        text, stop_reason = decode_output(
            tokenizer,
            token_ids,
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            seed,
            eos_token_id=model.eos_token_id,
            model_eos_token_ids=ctx.model_eos_ids,
            params=stop,
            skip_special_tokens=skip_special,
            spaces_between_special_tokens=spaces,
        )
        if vllm_parsers is not None and chat_request is not None:
            fields, finish_reason = adapter_derender.batch_message(
                vllm_parsers,
                chat_request,
                effective_template_kwargs(ctx.render, chat_request),
                text,
                token_ids,
                gen.get("prompt_token_ids"),
                choice.get("finish_reason"),
            )
            message = _message(fields["content"], fields["reasoning"], fields["tool_calls"])
        elif parser is not None:
            reasoning, content, calls = parser.parse_batch(text, opts, gen.get("prompt_token_ids"), token_ids, seed_ids)
            reasoning, content, id_calls = parser.assemble(
                reasoning, content, calls, opts, parsers.tool_ids(request_id, choice["index"])
            )
            wire_calls = [_tool_call_wire(i, c) for i, c in id_calls]
            message = _message(content, reasoning, wire_calls)
            made = bool(wire_calls)
        else:
            message = _message(text)
            made = False
        choices.append(
            {
                "index": choice["index"],
                "message": message,
                "logprobs": resolved,
                "finish_reason": finish_reason
                if vllm_parsers is not None
                else parsers.resolve_finish_reason(choice.get("finish_reason"), opts, made),
                "stop_reason": stop_reason,
                "token_ids": token_ids if return_token_ids else None,
                "routed_experts": None,
                "weight_versions": None,
            }
        )
    prompt_tokens = _prompt_token_count(body.get("prompt_tokens"))
    completion_tokens = sum(len(c.get("token_ids") or []) for c in gen["choices"])
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": _model_name(ctx, body),
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(prompt_tokens, completion_tokens),
        "prompt_logprobs": gen.get("prompt_logprobs"),
        "prompt_token_ids": gen.get("prompt_token_ids")
        if chat_request and chat_request.get("return_token_ids")
        else None,
        "prompt_text": None,
        "kv_transfer_params": gen.get("kv_transfer_params"),
        "ec_transfer_params": None,
        "metrics": gen.get("metrics"),
    }


def derender_completion(ctx: DerenderContext, body: dict[str, Any]) -> dict[str, Any]:
    responses = body["generate_responses"]
    for gen in responses:
        _with_finish_defaults(gen["choices"])
    prompt_tokens = body.get("prompt_tokens")
    prompt_ids = body.get("prompt_token_ids")
    request = body.get("completion_request")
    check_model(ctx.render, body.get("model"))
    if not responses:
        raise BadRequestError("generate_responses must not be empty")
    _bounds(ctx, responses)
    for ids in prompt_ids or ():
        _prompt_ids_bound(ctx, ids)
    for gen in responses:
        _check_choices_vocab(ctx, gen["choices"])
        _prompt_ids_bound(ctx, gen.get("prompt_token_ids"))

    model = ctx.render.model
    tokenizer = model.hf_tokenizer
    skip_special, spaces = decode_params(
        None if request is None else request.get("skip_special_tokens"),
        True if request is None else request.get("spaces_between_special_tokens", True),
    )
    top_limit = lp.completion_top_limit(request)
    return_token_ids = bool(request and request.get("return_token_ids"))
    stop = _stop_params(request)
    choices = []
    total_prompt = total_completion = 0
    index = 0
    for n, gen in enumerate(responses):
        seed_ids = (
            prompt_ids[n] if prompt_ids is not None and prompt_ids[n] is not None else gen.get("prompt_token_ids")
        )
        seed = seed_state(tokenizer, seed_ids, skip_special_tokens=skip_special)
        for choice in gen["choices"]:
            token_ids = choice.get("token_ids")
            if not token_ids:
                raise BadRequestError(
                    f"choice {choice['index']} in response {gen.get('request_id')} has empty or null token_ids"
                )
            text, stop_reason = decode_output(
                tokenizer,
                token_ids,
                choice.get("finish_reason"),
                choice.get("stop_reason"),
                seed,
                eos_token_id=model.eos_token_id,
                model_eos_token_ids=ctx.model_eos_ids,
                params=stop,
                skip_special_tokens=skip_special,
                spaces_between_special_tokens=spaces,
            )
            completion_logprobs = None
            if choice.get("logprobs") is not None:
                resolved = lp.resolve(choice["logprobs"], ctx.decoder, top_limit=top_limit)
                completion_logprobs = lp.to_completion(resolved, choice["logprobs"])
            choices.append(
                {
                    "index": index,
                    "text": text,
                    "logprobs": completion_logprobs,
                    "finish_reason": choice.get("finish_reason"),
                    "stop_reason": stop_reason,
                    "token_ids": token_ids if return_token_ids else None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": gen.get("prompt_token_ids") if return_token_ids else None,
                    "routed_experts": None,
                    "weight_versions": None,
                }
            )
            total_completion += len(token_ids)
            index += 1
        total_prompt += prompt_tokens[n] if prompt_tokens is not None else 0
    first = responses[0]
    kv = first.get("kv_transfer_params")
    if any(r.get("kv_transfer_params") != kv for r in responses[1:]):
        kv = None
    return {
        "id": first.get("request_id"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": _model_name(ctx, body),
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(total_prompt, total_completion),
        "kv_transfer_params": kv,
        "ec_transfer_params": None,
        "metrics": first.get("metrics") if len(responses) == 1 else None,
    }


# -- streaming ------------------------------------------------------------------------------

_VLLM_STATE_KEYS = (
    "prev_tokens",
    "prefix_offset",
    "read_offset",
    "role_sent",
    "logprob_context_token_ids",
    "logprob_text_offset",
    "output_token_ids",
    "output_chunk_lens",
    "tools_streamed",
    "last_tool_call_ids",
)


def _stream_state(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """The validated `stream_state` with every field, keeping our `rs_*` keys."""
    return stream_state(value)


def _chunk_usage(chunk: dict[str, Any], prompt_tokens: int | None) -> dict[str, Any] | None:
    usage = chunk.get("usage")
    if usage is None:
        return None
    pt = prompt_tokens if prompt_tokens is not None else (usage.get("prompt_tokens") or 0)
    return _usage(pt, usage.get("completion_tokens") or 0)


def _chat_chunk(
    ctx: DerenderContext,
    body: dict[str, Any],
    chunk: dict[str, Any],
    choices: list[dict[str, Any]],
    prompt_token_ids: list[int] | None,
) -> dict[str, Any]:
    return {
        "id": chunk.get("request_id"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": _model_name(ctx, body),
        "choices": choices,
        "usage": _chunk_usage(chunk, body.get("prompt_tokens")),
        "system_fingerprint": None,
        "prompt_token_ids": prompt_token_ids,
        "prompt_text": None,
        "metrics": chunk.get("metrics"),
        "kv_transfer_params": None,
    }


def _request_digest(chat_request: Any, prompt_ids: Any) -> bytes | None:
    """A chunk's chat request and prompt ids as JSON (None for what JSON cannot hold)."""
    try:
        return blake3(orjson.dumps([chat_request, prompt_ids])).digest(16)
    except (orjson.JSONEncodeError, TypeError):
        return None


@dataclass
class Vouch:
    """A `full`-mode chunk's snapshot, looked up before the body is validated, and what of the
    body it vouches for (`api.derender.Vouched`)."""

    snapshot: dict[str, Any] | None = None  # what the store holds for the echoed stream and position
    echo: EchoDigest | None = None  # the digest of the echo as received
    request_digest: bytes | None = None  # of the chat request and prompt ids as received
    vouched: Vouched = Vouched.NOTHING
    # The stream id and position the store was asked for (found or not): asked once per chunk, so
    # a miss or a rejected snapshot is one Redis round trip and counted once.
    looked_up: tuple[str, int] | None = None
    from_bytes: bool = False  # the echo is in the body as `EchoedArray`s (`vouch_raw`)
    # The request bytes this process keeps for the stream (`echo.KeptRequest`), carried into the
    # next `Sent`.
    kept: KeptRequest | None = None


async def vouch(ctx: DerenderContext, body: Any, prior: Vouch | None = None) -> Vouch:
    """Full mode: the snapshot the echoed state names, and whether it vouches for the echo (and
    the request). Runs on the body as received, before validation: it only reads, never raises,
    and a snapshot that vouches for nothing changes nothing (the body is validated in full, and
    the snapshot compared again after lax-int coercion). `prior`: what `vouch_raw` found for this
    body, so the store is not asked twice for the same snapshot.

    The request digest is of the chat request and prompt ids as received (validation fills in
    defaults, e.g. `tool_choice`): a snapshot stores it once they passed every check, so a chunk
    that resends them unchanged skips the checks. A resumed stream reads the request only for
    its presence and `stop`, and the prompt ids for their count (the rest is in the snapshot)."""
    if not _vouches(ctx) or not isinstance(body, dict) or body.get("stream") is not True:
        return Vouch()
    request_digest = _request_digest(body.get("chat_request"), body.get("prompt_token_ids"))
    value = body.get("stream_state")
    if not isinstance(value, dict):
        return Vouch(request_digest=request_digest)
    sid = value.get("rs_sid")
    ids = value.get("output_token_ids", [])
    if not (isinstance(sid, str) and len(sid) <= 64 and isinstance(ids, list)):
        return Vouch(request_digest=request_digest)
    looked_up = (sid, len(ids))
    if prior is not None and prior.looked_up == looked_up:
        snapshot = prior.snapshot
    else:
        snapshot = await ctx.store.get(snapshot_key(ctx.fingerprint, sid, len(ids)))  # type: ignore[union-attr]
    echo = EchoDigest.of(ids, value.get("output_chunk_lens", [])) if snapshot is not None else None
    if snapshot is None or not _snapshot_matches(ctx, snapshot, sid, len(ids), echo):
        return Vouch(snapshot, request_digest=request_digest, looked_up=looked_up)
    return Vouch(snapshot, echo, request_digest, _vouched(snapshot, request_digest), looked_up)


async def vouch_raw(ctx: DerenderContext, raw: RawEcho) -> Vouch:
    """`vouch` for a body read with its echoed arrays left as bytes (`echo.split_body`): the
    snapshot named by `rs_sid` and `rs_pos` vouches for them when their bytes digest to its
    digest, i.e. they are byte for byte the arrays this service sent, `rs_pos` ids long. Then
    they go into the body as `EchoedArray`s, never decoded. Otherwise (no snapshot, other
    bytes) nothing is vouched for and the caller parses the body whole and asks `vouch`,
    passing this lookup on."""
    body = raw.body
    if not _vouches(ctx) or body.get("stream") is not True:
        return Vouch()
    value = body["stream_state"]
    sid, position = value.get("rs_sid"), value.get("rs_pos")
    if not (isinstance(sid, str) and len(sid) <= 64 and type(position) is int and position >= 0):
        return Vouch()
    snapshot = await ctx.store.get(snapshot_key(ctx.fingerprint, sid, position))  # type: ignore[union-attr]
    kept = raw.request
    if snapshot is None:  # (the caller parses the body whole: the kept values stay untouched)
        return Vouch(looked_up=(sid, position))
    sent = raw.sent
    if sent is not None and sent.sid == sid and sent.position == position:
        # The echo is byte for byte (length + memcmp, `echo.split_body`) what this process sent
        # for this stream at this position: its digest is the one kept with it, no hashing.
        echo = sent.digest.copy()
        matches = _snapshot_matches(ctx, snapshot, sid, position, echo, digest=sent.digest_bytes)
    else:
        echo = EchoDigest(raw.ids, raw.lens)
        matches = _snapshot_matches(ctx, snapshot, sid, position, echo)
    if not matches:
        return Vouch(snapshot, looked_up=(sid, position))
    value["output_token_ids"] = EchoedArray(raw.ids, position)
    value["output_chunk_lens"] = EchoedArray(raw.lens)
    if kept is not None:
        request_digest: bytes | None = kept.digest  # the digest of exactly these values
    else:
        request_digest = _request_digest(body.get("chat_request"), body.get("prompt_token_ids"))
    vouched = _vouched(snapshot, request_digest)
    if Vouched.REQUEST not in vouched:
        _unshare(body, kept)  # validated in full, which may fill defaults in: not the kept values
    if kept is None and sent is not None:
        kept = sent.request
    return Vouch(snapshot, echo, request_digest, vouched, (sid, position), True, kept=kept)


def forget_kept(ctx: DerenderContext, vouch: Vouch) -> None:
    """After a failed validation of a body read as bytes: the whole body was validated, which may
    have filled defaults into the kept request values it held; the stream's kept bytes go (its
    next chunk is read as before, and keeps fresh ones)."""
    if ctx.sent is not None and vouch.looked_up is not None:
        ctx.sent.forget(vouch.looked_up[0])


def _unshare(body: dict[str, Any], kept: KeptRequest | None) -> None:
    """A body holding the kept request values gets its own copies before anything may change them."""
    if kept is not None and body.get("chat_request") is kept.chat_value:
        body["prompt_token_ids"], body["chat_request"] = kept.fresh()


def _vouches(ctx: DerenderContext) -> bool:
    return not ctx.compact and ctx.store is not None and ctx.has_parser


def _vouched(snapshot: dict[str, Any], request_digest: bytes | None) -> Vouched:
    """A matching snapshot vouches for the echo, and for the request if it is resent unchanged."""
    if request_digest is not None and snapshot.get("rq") == request_digest:
        return Vouched.ECHO | Vouched.REQUEST
    return Vouched.ECHO


def _vllm_state(state: dict[str, Any]) -> dict[str, Any]:
    return {key: state[key] for key in _VLLM_STATE_KEYS}


@dataclass(frozen=True)
class _StreamRequest:
    """What the parser path needs from the request, kept in the snapshot for compact mode."""

    opts: parsers.RequestOptions
    thinking: bool
    stop: StopParams
    return_token_ids: bool
    top_limit: int | None
    spaces: bool
    request_id: str
    # `to_obj()` as msgpack, once made or as read: the snapshot holds these bytes, so the request
    # (with its tools, most of a snapshot) is neither encoded nor decoded again on each chunk.
    _packed: list[bytes] = dataclasses.field(default_factory=list, compare=False, repr=False)

    def to_obj(self) -> list[Any]:
        o = self.opts
        return [
            o.tool_choice,
            o.tool_name,
            o.has_tools,
            o.parallel_tool_calls,
            o.include_reasoning,
            self.thinking,
            list(self.stop.stop_token_ids),
            self.stop.ignore_eos,
            self.stop.include_stop_str_in_output,
            self.return_token_ids,
            self.top_limit,
            self.spaces,
            self.request_id,
            o.tools,  # parsers that coerce arguments to the tool schema read them
        ]

    @classmethod
    def from_obj(cls, obj: list[Any]) -> _StreamRequest:
        opts = parsers.RequestOptions(
            tool_choice=obj[0],
            tool_name=obj[1],
            has_tools=obj[2],
            parallel_tool_calls=obj[3],
            include_reasoning=obj[4],
            tools=obj[13] if len(obj) > 13 else None,
        )
        stop = StopParams(stop_token_ids=tuple(obj[6]), ignore_eos=obj[7], include_stop_str_in_output=obj[8])
        return cls(opts, obj[5], stop, obj[9], obj[10], obj[11], obj[12])

    def packed(self) -> bytes:
        """`to_obj()` as msgpack (what a snapshot's `req` holds)."""
        if not self._packed:
            self._packed.append(_REQUEST_ENCODER.encode(self.to_obj()))
        return self._packed[0]

    @classmethod
    def from_packed(cls, data: bytes) -> _StreamRequest:
        """The request a snapshot's `req` bytes hold (signed with the snapshot: decoded once per
        process and kept by those exact bytes, so every later chunk of the stream reuses it)."""
        global _packed_bytes
        found = _PACKED_REQUESTS.get(data)
        if found is None:
            found = cls.from_obj(_REQUEST_DECODER.decode(data))
            found._packed.append(data)
            _PACKED_REQUESTS[data] = found
            _packed_bytes += len(data)
            while len(_PACKED_REQUESTS) > _PACKED_REQUESTS_LIMIT or _packed_bytes > _PACKED_BYTES_LIMIT:
                oldest = next(iter(_PACKED_REQUESTS))  # the oldest kept (maybe this one, if huge)
                del _PACKED_REQUESTS[oldest]
                _packed_bytes -= len(oldest)
        return found


_REQUEST_ENCODER = msgspec.msgpack.Encoder()
_REQUEST_DECODER = msgspec.msgpack.Decoder(list)
# Requests by their packed bytes (a few KB each with tools), bounded by count and by bytes (a
# request's tools can be large): one per live stream is enough, a miss only decodes again.
_PACKED_REQUESTS: dict[bytes, _StreamRequest] = {}
_PACKED_REQUESTS_LIMIT = 4096
_PACKED_BYTES_LIMIT = 32 << 20
_packed_bytes = 0


def _stream_request(ctx: DerenderContext, chat_request: dict[str, Any], request_id: str) -> _StreamRequest:
    kwargs = effective_template_kwargs(ctx.render, chat_request)
    return _StreamRequest(
        opts=parsers.RequestOptions.from_request(chat_request),
        thinking=parsers.thinking_enabled(
            ctx.render.settings.reasoning_parser, kwargs, ctx.render.settings.tool_call_parser
        ),
        stop=_stop_params(chat_request),
        return_token_ids=bool(chat_request.get("return_token_ids")),
        top_limit=lp.chat_top_limit(chat_request),
        spaces=bool(chat_request.get("spaces_between_special_tokens", True)),
        request_id=request_id,
    )


async def derender_chat_stream(
    ctx: DerenderContext, body: dict[str, Any], vouch: Vouch | None = None
) -> dict[str, Any]:
    """One chunk; `vouch`: what `vouch` found before the body was validated (by the table it names)."""
    vouch = vouch or Vouch()
    chunk = body["generate_chunk"]
    state = _stream_state(body.get("stream_state"))
    prompt_ids = body.get("prompt_token_ids")
    chat_request = body.get("chat_request")
    check_model(ctx.render, body.get("model"))
    if chat_request is not None and chat_request.get("stop"):
        raise BadRequestError(STREAM_STOP_ERROR)
    compact_continuation = ctx.compact and state is not None and "rs_sid" in state and "rs_pos" in state
    if ctx.has_parser and chat_request is None and not compact_continuation:
        raise BadRequestError(MISSING_CHAT_REQUEST)
    if ctx.has_parser and prompt_ids is None and not compact_continuation:
        raise BadRequestError(MISSING_PROMPT_IDS)
    choices = chunk["choices"]
    if len(choices) > 1:
        raise BadRequestError(f"derender_chat_stream expects at most one choice per chunk (got {len(choices)}).")
    prompt_len = len(prompt_ids) if prompt_ids is not None else 0
    prior = state["rs_pos"] if compact_continuation and state else (len(state["output_token_ids"]) if state else 0)
    delta_len = sum(len(c.get("token_ids") or []) for c in choices)
    max_len = ctx.render.model.max_model_len
    if not isinstance(prior, int) or prompt_len + prior + delta_len > max_len:
        raise BadRequestError(
            f"prompt_token_ids length ({prompt_len}) plus output_token_ids length ({prior}) "
            f"plus delta ({delta_len}) exceeds max_model_len ({max_len})."
        )
    # vLLM bounds logprobs only in batch derender; a chunk is bounded the same way here.
    _bounds(ctx, [chunk])
    _check_choices_vocab(ctx, choices)
    if Vouched.REQUEST not in vouch.vouched:
        _check_vocab(ctx, prompt_ids or [], "prompt_token_ids")
    _prompt_ids_bound(ctx, chunk.get("prompt_token_ids"))
    _state_bounds(ctx, state, Vouched.ECHO in vouch.vouched)
    if ctx.has_parser:
        answer = await _parsed_stream(ctx, body, chunk, state, chat_request, prompt_ids, vouch)
        seal(answer["stream_state"])  # an echo read as bytes goes back as bytes
        return answer
    return _plain_chat_stream(ctx, body, chunk, state, chat_request, prompt_ids)


def _plain_stream_start(
    ctx: DerenderContext,
    request: dict[str, Any] | None,
    state: dict[str, Any] | None,
    prompt_ids: list[int] | None,
    chunk: dict[str, Any],
) -> tuple[bool, bool, dict[str, Any]]:
    """Decode flags, and on the first chunk a state seeded from the prompt tail (`_seed_stream_state`)."""
    skip_special, spaces = decode_params(
        None if request is None else request.get("skip_special_tokens"),
        True if request is None else request.get("spaces_between_special_tokens", True),
    )
    if state is None:
        seed = seed_state(
            ctx.render.model.hf_tokenizer,
            prompt_ids if prompt_ids is not None else chunk.get("prompt_token_ids"),
            skip_special_tokens=skip_special,
        )
        state = _stream_state({}) or {}
        state.update(prev_tokens=seed.prev_tokens, prefix_offset=seed.prefix_offset, read_offset=seed.read_offset)
    return skip_special, spaces, state


def _plain_chat_stream(
    ctx: DerenderContext,
    body: dict[str, Any],
    chunk: dict[str, Any],
    state: dict[str, Any] | None,
    chat_request: dict[str, Any] | None,
    prompt_ids: list[int] | None,
) -> dict[str, Any]:
    """vLLM's plain path: O(delta) work, O(window) state."""
    model = ctx.render.model
    tokenizer = model.hf_tokenizer
    skip_special, spaces, state = _plain_stream_start(ctx, chat_request, state, prompt_ids, chunk)
    return_token_ids = bool(chat_request and chat_request.get("return_token_ids"))
    top_limit = lp.chat_top_limit(chat_request)
    stop = _stop_params(chat_request)
    out_choices = []
    detok = DetokState(list(state["prev_tokens"]), state["prefix_offset"], state["read_offset"])
    context = state["logprob_context_token_ids"]
    for choice in chunk["choices"]:
        delta_ids = choice.get("token_ids") or []
        text_ids, stop_reason = drop_stop_token(
            delta_ids,
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            eos_token_id=model.eos_token_id,
            model_eos_token_ids=ctx.model_eos_ids,
            params=stop,
        )
        text, detok = detokenize_delta(
            tokenizer, text_ids, detok, skip_special_tokens=skip_special, spaces_between_special_tokens=spaces
        )
        resolved = (
            lp.resolve(choice["logprobs"], ctx.decoder, context, top_limit)
            if choice.get("logprobs") is not None
            else None
        )
        include_role = not state["role_sent"]
        state["role_sent"] = True
        state["logprob_context_token_ids"] = lp.context_tail(context, delta_ids)
        out_choices.append(
            {
                "index": choice["index"],
                "delta": {"role": "assistant" if include_role else None, "content": text or None, "reasoning": None},
                "logprobs": resolved,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": stop_reason,
                "token_ids": choice.get("token_ids") if return_token_ids else None,
                "weight_versions": None,
            }
        )
    state.update(prev_tokens=detok.prev_tokens, prefix_offset=detok.prefix_offset, read_offset=detok.read_offset)
    prompt_out = chunk.get("prompt_token_ids") if return_token_ids else None
    return {"chunk": _chat_chunk(ctx, body, chunk, out_choices, prompt_out), "stream_state": state}


async def _parsed_stream(
    ctx: DerenderContext,
    body: dict[str, Any],
    chunk: dict[str, Any],
    state: dict[str, Any] | None,
    chat_request: dict[str, Any] | None,
    prompt_ids: list[int] | None,
    vouch: Vouch,
) -> dict[str, Any]:
    """The parser path: resume from a snapshot (O(delta)) or replay once from the carried state."""
    state = state if state is not None else (_stream_state({}) or {})
    vllm_parsers = None if ctx.native else adapter.runtime(ctx.render)
    if vllm_parsers is not None:  # live vLLM parsers in this worker (render_service/adapter)
        if ctx.compact:
            raise adapter_derender.compact_refused(vllm_parsers)
        assert chat_request is not None
        out_choices, adapter_state = adapter_derender.stream_chunk(
            ctx,
            vllm_parsers,
            chunk,
            state,
            chat_request,
            effective_template_kwargs(ctx.render, chat_request),
            prompt_ids,
        )
        prompt_out = chunk.get("prompt_token_ids") if chat_request.get("return_token_ids") else None
        return {"chunk": _chat_chunk(ctx, body, chunk, out_choices, prompt_out), "stream_state": adapter_state}
    metrics = ctx.metrics
    request_id = chunk.get("request_id") or ""
    sid = state.get("rs_sid")
    if not chunk["choices"]:
        # A usage-only chunk needs no parser state (vLLM still replays everything here).
        echoed = {k: v for k, v in state.items() if not (ctx.compact and k in _VLLM_STATE_KEYS)}
        return {"chunk": _chat_chunk(ctx, body, chunk, [], None), "stream_state": echoed}
    compact_continuation = ctx.compact and sid is not None and "rs_pos" in state
    position = state["rs_pos"] if compact_continuation else len(state["output_token_ids"])
    echo_vouched = Vouched.ECHO in vouch.vouched
    # Full mode: the echo's digest checks a snapshot against the echoed history and, extended by
    # the delta, goes into the next snapshot. A vouched echo's was taken as received; any other
    # is taken again after validation (which may have coerced lax ints).
    echo = None
    if echo_vouched:
        echo = vouch.echo
    elif not ctx.compact:
        echo = EchoDigest.of(state["output_token_ids"], state["output_chunk_lens"])
    snapshot = None
    if vouch.snapshot is not None or (vouch.looked_up is not None and vouch.looked_up == (sid, position)):
        snapshot = vouch.snapshot
    elif sid is not None and ctx.store is not None and isinstance(sid, str) and len(sid) <= 64:
        snapshot = await ctx.store.get(snapshot_key(ctx.fingerprint, sid, position), required=compact_continuation)
    if snapshot is not None and not echo_vouched:
        assert isinstance(sid, str)  # a snapshot was found under it
        if not _snapshot_matches(ctx, snapshot, sid, position, echo, compact_continuation):
            metrics.snapshot_rejected.labels("mismatch").inc()
            snapshot = None

    if snapshot is not None:
        req = _StreamRequest.from_packed(snapshot["req"])
        parser = _configured_parser(ctx, req.thinking)
        assert parser is not None  # the parser path runs only with a configured parser
        parsed = parsers.load_parsed_stream(parser, snapshot["ps"], snapshot.get("held") or ())
        carried = snapshot["carry"]
        role_sent, tools_streamed, last_ids, context = carried
        prev_key = snapshot.get("prev")
    else:
        if compact_continuation:
            raise ConflictError(
                "stream_state handle has no snapshot on this server (expired, evicted or from "
                "another deployment); restart the stream or resend the full stream_state.",
                code="stream_state_expired",
                param="stream_state",
            )
        assert chat_request is not None
        req = _stream_request(ctx, chat_request, request_id)
        parser, _ = parser_for(ctx, chat_request)
        assert parser is not None
        parsed = parsers.new_parsed_stream(parser, prompt_ids)
        tool_id = parsers.tool_ids(request_id, 0)
        start = 0
        for length in state["output_chunk_lens"]:
            ids = state["output_token_ids"][start : start + length]
            start += length
            parsers.advance(parser, parsed, ids, ids, None, req.opts, tool_id, spaces_between_special_tokens=req.spaces)
        if state["output_chunk_lens"]:
            metrics.replays.inc()
            metrics.replayed_tokens.inc(len(state["output_token_ids"]))
        role_sent = state["role_sent"]
        tools_streamed = state["tools_streamed"]
        last_ids = list(state["last_tool_call_ids"])
        context = list(state["logprob_context_token_ids"])
        prev_key = None
        sid = secrets.token_hex(16)
    parsed.parser.tools_streamed = tools_streamed

    model = ctx.render.model
    out_choices = []
    delta_ids: list[int] = []
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
            params=req.stop,
        )

        def tool_id(index: int) -> str:
            return last_ids[index] if index < len(last_ids) else parsers.id_for(req.request_id, 0, index)

        delta = None
        finish_reason = None
        if delta_ids or finish is not None:
            delta, finish_reason = parsers.advance(
                parser, parsed, text_ids, delta_ids, finish, req.opts, tool_id, spaces_between_special_tokens=req.spaces
            )
        hide = not req.opts.include_reasoning
        resolved = (
            lp.resolve(choice["logprobs"], ctx.decoder, context, req.top_limit)
            if choice.get("logprobs") is not None and not hide
            else None
        )
        context = lp.context_tail(context, delta_ids)
        if delta is None:
            delta = parsers.Delta()
        for call in delta.tool_calls:
            if call.id is not None and call.index >= len(last_ids):
                last_ids.append(call.id)
        wire = delta.to_wire("assistant" if not role_sent else None)
        role_sent = True
        out_choices.append(
            {
                "index": choice["index"],
                "delta": wire,
                "logprobs": resolved,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "token_ids": choice.get("token_ids") if req.return_token_ids and not hide else None,
                "weight_versions": None,
            }
        )
    tools_streamed = parsed.parser.tools_streamed
    new_position = position + len(delta_ids)

    if compact_continuation or (ctx.compact and state.get("rs_sid") is None):
        new_state: dict[str, Any] = {"rs_sid": sid, "rs_pos": new_position, "rs_fp": ctx.fingerprint[:16]}
    else:
        new_state = _vllm_state(state)
        if delta_ids:
            # The echoed lists were decoded for this request alone (or are `EchoedArray`s, an echo
            # read as bytes): extended in place, O(delta).
            new_state["output_token_ids"].extend(delta_ids)
            new_state["output_chunk_lens"].append(len(delta_ids))
        new_state.update(
            role_sent=role_sent,
            tools_streamed=tools_streamed,
            last_tool_call_ids=last_ids,
            logprob_context_token_ids=context,
        )
        new_state.update(rs_sid=sid, rs_pos=new_position, rs_fp=ctx.fingerprint[:16])
    if ctx.store is not None and (delta_ids or snapshot is None):
        assert isinstance(sid, str)  # a resumed stream's id was checked; a replayed one was just made
        digest = None
        if echo is not None:
            echo.extend(delta_ids)
            digest = echo.digest()
        held = ctx.store.segment_writer(ctx.fingerprint, sid, new_position)
        await ctx.store.put(
            snapshot_key(ctx.fingerprint, sid, new_position),
            {
                "v": STATE_VERSION,
                "sid": sid,
                "pos": new_position,
                "fp": ctx.fingerprint,
                "digest": digest,
                "rq": vouch.request_digest,  # the request as received, now checked
                "prev": snapshot_key(ctx.fingerprint, sid, position) if delta_ids else prev_key,
                "req": req.packed(),
                "ps": parsed.to_obj(held),
                "carry": [role_sent, tools_streamed, last_ids, context],
            },
            stale_key=prev_key if delta_ids else None,
            held=held,
        )
        if ctx.sent is not None and echo is not None and digest is not None and "output_token_ids" in new_state:
            _keep_sent(ctx.sent, new_state, sid, new_position, echo, digest, vouch, chat_request, prompt_ids)
    prompt_out = chunk.get("prompt_token_ids") if req.return_token_ids else None
    return {"chunk": _chat_chunk(ctx, body, chunk, out_choices, prompt_out), "stream_state": new_state}


def _keep_sent(
    cache: SentCache,
    new_state: dict[str, Any],
    sid: str,
    position: int,
    echo: EchoDigest,
    digest: bytes,
    vouch: Vouch,
    chat_request: Any,
    prompt_ids: Any,
) -> None:
    """Keep what this answer's echo carries (`echo.SentCache`), so that the next chunk's echo is
    checked by memcmp. The echo is encoded here, once: the answer sends these very bytes."""
    ids = _echo_bytes(new_state, "output_token_ids")
    lens = _echo_bytes(new_state, "output_chunk_lens")
    if ids is None or lens is None:
        return
    kept = vouch.kept
    if kept is None and Vouched.REQUEST in vouch.vouched:
        # The request fields as received, checked (a snapshot vouched for them): kept as compact
        # JSON with the values those bytes decode to, once per stream.
        try:
            prompt, chat = orjson.dumps(prompt_ids), orjson.dumps(chat_request)
        except (orjson.JSONEncodeError, TypeError):
            prompt = chat = b""
        if prompt and chat:
            prompt_value, chat_value = orjson.loads(prompt), orjson.loads(chat)
            request_digest = _request_digest(chat_value, prompt_value)
            if request_digest is not None:
                kept = KeptRequest(prompt, chat, prompt_value, chat_value, request_digest)
    cache.put(Sent(sid, position, ids, lens, echo, digest, kept))


def _echo_bytes(state: dict[str, Any], key: str) -> bytes | None:
    """The JSON of an echoed array as the answer sends it; a list is replaced by those bytes."""
    value = state[key]
    if isinstance(value, EchoedArray):
        return value.wire_bytes()
    if not isinstance(value, list):
        return None
    try:
        encoded = orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return None
    state[key] = orjson.Fragment(encoded)
    return encoded


def _snapshot_matches(
    ctx: DerenderContext,
    snapshot: dict[str, Any],
    sid: str,
    position: int,
    echo: EchoDigest | None,
    compact: bool = False,
    digest: bytes | None = None,
) -> bool:
    """`digest`: `echo.digest()`, when it is already known."""
    if snapshot.get("v") != STATE_VERSION or snapshot.get("sid") != sid or snapshot.get("pos") != position:
        return False
    if snapshot.get("fp") != ctx.fingerprint:
        return False
    if compact:
        return True
    # Full mode: the client-carried output is the truth; the snapshot must be of exactly it.
    if digest is None:
        digest = echo.digest() if echo is not None else None
    return digest is not None and snapshot.get("digest") == digest


async def derender_completion_stream(ctx: DerenderContext, body: dict[str, Any]) -> dict[str, Any]:
    chunk = body["generate_chunk"]
    state = _stream_state(body.get("stream_state"))
    prompt_ids = body.get("prompt_token_ids")
    request = body.get("completion_request")
    check_model(ctx.render, body.get("model"))
    if request is not None and request.get("stop"):
        raise BadRequestError(STREAM_STOP_ERROR)
    _prompt_ids_bound(ctx, prompt_ids)
    if len(chunk["choices"]) > 1:
        raise BadRequestError("derender_completion_stream expects at most one choice per chunk")
    _bounds(ctx, [chunk])
    _check_choices_vocab(ctx, chunk["choices"])
    _prompt_ids_bound(ctx, chunk.get("prompt_token_ids"))
    _state_bounds(ctx, state)
    model = ctx.render.model
    tokenizer = model.hf_tokenizer
    skip_special, spaces, state = _plain_stream_start(ctx, request, state, prompt_ids, chunk)
    top_limit = lp.completion_top_limit(request)
    return_token_ids = bool(request and request.get("return_token_ids"))
    stop = _stop_params(request)
    detok = DetokState(list(state["prev_tokens"]), state["prefix_offset"], state["read_offset"])
    context = list(state["logprob_context_token_ids"])
    text_offset = state["logprob_text_offset"]
    out_choices = []
    for choice in chunk["choices"]:
        delta_ids = choice.get("token_ids") or []
        text_ids, stop_reason = drop_stop_token(
            delta_ids,
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            eos_token_id=model.eos_token_id,
            model_eos_token_ids=ctx.model_eos_ids,
            params=stop,
        )
        text, detok = detokenize_delta(
            tokenizer, text_ids, detok, skip_special_tokens=skip_special, spaces_between_special_tokens=spaces
        )
        completion_logprobs = None
        if choice.get("logprobs") is not None:
            resolved = lp.resolve(choice["logprobs"], ctx.decoder, context, top_limit)
            completion_logprobs = lp.to_completion(resolved, choice["logprobs"], text_offset)
        next_offset = text_offset + len(text)
        if completion_logprobs is not None and completion_logprobs["tokens"]:
            next_offset = completion_logprobs["text_offset"][-1] + len(completion_logprobs["tokens"][-1])
        context = lp.context_tail(context, delta_ids)
        text_offset = next_offset
        out_choices.append(
            {
                "index": choice["index"],
                "text": text,
                "logprobs": completion_logprobs,
                "finish_reason": choice.get("finish_reason"),
                "stop_reason": stop_reason,
                "prompt_token_ids": chunk.get("prompt_token_ids") if return_token_ids else None,
                "token_ids": choice.get("token_ids") if return_token_ids else None,
                "weight_versions": None,
            }
        )
    state.update(
        prev_tokens=detok.prev_tokens,
        prefix_offset=detok.prefix_offset,
        read_offset=detok.read_offset,
        logprob_context_token_ids=context,
        logprob_text_offset=text_offset,
    )
    out_chunk = {
        "id": chunk.get("request_id"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": _model_name(ctx, body),
        "choices": out_choices,
        "usage": _chunk_usage(chunk, body.get("prompt_tokens")),
        "system_fingerprint": None,
        "metrics": chunk.get("metrics"),
        "kv_transfer_params": None,
    }
    return {"chunk": out_chunk, "stream_state": state}
