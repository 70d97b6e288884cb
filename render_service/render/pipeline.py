"""Chat and completions render: an OpenAI request -> one or more vLLM `GenerateRequest`s.

Pure functions of (request body, loaded model, settings): the app calls them in a worker and
serializes the result. Each step follows vLLM 0.33's `ServingRender` in the same order, so
the same input fails with the same error first.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from render_service import adapter, parsers
from render_service.adapter import multimodal as adapter_multimodal
from render_service.api import requests, structured
from render_service.api.protocol import (
    DEFAULT_SAMPLING_FLOATS,
    OUTPUT_KIND_DELTA,
    OUTPUT_KIND_FINAL_ONLY,
    bounded_list,
    generate_request,
    handler_error,
    opt_dict,
    sampling_params_wire,
    schema_error,
    stream_options_wire,
    validator_error,
)
from render_service.exceptions import BadRequestError, NotFoundError, RenderServiceError
from render_service.model.loader import Model
from render_service.model.lora import AdapterRegistry
from render_service.multimodal import media
from render_service.multimodal import qwen3_vl as multimodal
from render_service.parsers import harmony as harmony_parser
from render_service.render import (
    content_parts,
    continuation,
    encoded_ids,
    history,
    prefix,
    renderers,
    segments,
    templating,
)
from render_service.render import token_ids as token_id_checks
from render_service.render.renderers.harmony import check_chat_effort
from render_service.settings import Settings

logger = logging.getLogger("render_service.render.pipeline")

# Ours (vLLM has none): far above real conversations and tool lists (OpenAI accepts 128 tools), they
# cap the work of one request before any templating (~7 µs per message, ~16 µs per tool).
MAX_MESSAGES = requests.MAX_MESSAGES
MAX_TOOLS = requests.MAX_TOOLS


def random_uuid() -> str:
    """16 hex digits, as vLLM's `random_uuid` (the low half of a uuid4: 62 random bits under the
    RFC 4122 variant bits): from the OS's random source, as uuid4's, read 4 KiB at a time (one
    syscall per 512 ids, not one per request)."""
    global _random_bytes, _random_at
    at = _random_at
    if at >= len(_random_bytes):
        _random_bytes, at = os.urandom(_RANDOM_BATCH), 0
    _random_at = at + 8
    return f"{int.from_bytes(_random_bytes[at : at + 8], 'big') & _LOW_62 | _VARIANT:016x}"


_RANDOM_BATCH = 4096
_LOW_62 = (1 << 62) - 1
_VARIANT = 1 << 63  # uuid4's variant bits in its low half: 0b10
_random_bytes = b""
_random_at = 0


def _forget_random_bytes() -> None:
    """A forked worker must not hand out the ids its parent's unread bytes would give."""
    global _random_bytes, _random_at
    _random_bytes, _random_at = b"", 0


os.register_at_fork(after_in_child=_forget_random_bytes)


@dataclass(frozen=True)
class RenderContext:
    """What render needs besides the request: the model and the settings, both read-only."""

    model: Model
    settings: Settings
    # Set for a supported vision-language model folder (multimodal.SUPPORTED_MODEL_TYPES).
    vision: multimodal.ImageProcessor | None = None
    media_limits: media.MediaLimits = field(default_factory=media.MediaLimits)
    # Per-model facts worked out on first use (e.g. the Messages defaults); never request data.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The LoRA adapters served by name (None: none); mutable when runtime updating is allowed.
    adapters: AdapterRegistry | None = field(default=None, compare=False)
    # Prompt ids reused piece by piece and turn by turn (None: off, or unsafe for this tokenizer).
    segments: segments.SegmentEncoder | None = field(default=None, compare=False, repr=False)
    # The prefix-stability guard (always on; checks nothing before `make_context` sets it).
    prefix_guard: prefix.PrefixGuard | None = field(default=None, compare=False, repr=False)
    # Incremental templating from the guard's previous prompts (None: off, with the segment cache).
    history: history.HistoryRenderer | None = field(default=None, compare=False, repr=False)
    # Continued prompts kept for the next turn (--preserve-generated-tokens; render/continuation.py).
    prompt_memo: continuation.PromptMemo | None = field(default=None, compare=False, repr=False)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The prompt's ids: the segment cache's when it is on, else the backend's (identical)."""
        if self.segments is not None:
            return self.segments.encode(text, add_special_tokens)
        return self.model.encode(text, add_special_tokens)

    @property
    def has_reasoning_parser(self) -> bool:
        return self.settings.reasoning_parser is not None

    @property
    def has_tool_parser(self) -> bool:
        # vLLM builds a tool parser only with --enable-auto-tool-choice.
        return self.settings.enable_auto_tool_choice and self.settings.tool_call_parser is not None


def check_model(ctx: RenderContext, model: Any) -> None:
    """vLLM's `_check_model`: a served name or a loaded LoRA adapter's name (vLLM's render tier has
    no adapters and refuses these; its engines accept them, and the name travels to the engine as the
    GenerateRequest's `model`), else 404 naming the base models."""
    if not model:
        return
    if model in ctx.settings.served_names:
        return
    if ctx.adapters is not None and isinstance(model, str) and ctx.adapters.get(model) is not None:
        return
    names = ", ".join(ctx.settings.served_names)
    raise NotFoundError(f"The model `{model}` does not exist. Valid aliases: {names}.", param="model")


# -- request validation ---------------------------------------------------------------------
# The tables and vLLM's model validators live in api/requests.py; what stays here is the message
# list check the tables call (vLLM's message union, reduced to its first error).


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """`list[ChatCompletionMessageParam]`: our bound on its length, then each message's shape."""
    messages = bounded_list(messages, MAX_MESSAGES, "messages")
    for index, message in enumerate(messages):
        param = f"body.messages.{index}"
        if not isinstance(message, dict):
            raise schema_error(param, "Input should be a valid dictionary", message)
        role = message.get("role")
        if not isinstance(role, str):
            # pydantic reports the first branch of vLLM's message union.
            raise schema_error(
                f"{param}.ChatCompletionDeveloperMessageParam.role",
                "Field required" if role is None else "Input should be 'developer'",
                role,
            )
        content = message.get("content")
        if content is None and role != "assistant":
            raise schema_error(
                f"{param}.ChatCompletionDeveloperMessageParam.content",
                "Field required" if "content" not in message else "Input should be a valid string",
                content,
            )
        if content is not None and not isinstance(content, (str, list)):
            raise schema_error(f"{param}.content", "Input should be a valid string or list", content)
        if role == "assistant":
            tool_calls = message.get("tool_calls")
            if tool_calls is not None and not isinstance(tool_calls, list):
                raise schema_error(f"{param}.tool_calls", "Input should be a valid list", tool_calls)
            for call_index, call in enumerate(tool_calls or ()):
                # vLLM validates tool_calls lazily (an Iterable), so the loc starts at the call.
                call_param = f"body.{call_index}.ChatCompletionMessageFunctionToolCallParam"
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict):
                    raise schema_error(f"{call_param}.function", "Field required", call)
                if not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str):
                    raise schema_error(f"{call_param}.function", "Input should be a valid string", function)
        if (
            role == "tool"
            and message.get("tool_call_id") is not None
            and not isinstance(message.get("tool_call_id"), str)
        ):
            raise schema_error(f"{param}.tool_call_id", "Input should be a valid string", message["tool_call_id"])
        # vLLM renames the deprecated field before validation.
        reasoning_content = message.pop("reasoning_content", None)
        if reasoning_content is not None and message.get("reasoning") is None:
            message["reasoning"] = reasoning_content
    return messages


# -- shared steps ---------------------------------------------------------------------------


def check_mm_kwargs(ctx: RenderContext, body: dict[str, Any]) -> None:
    """vLLM's `validate_request_mm_kwargs`; trusted, `media_io_kwargs` (not implemented) are refused."""
    for name, what in (("mm_processor_kwargs", "preprocessing"), ("media_io_kwargs", "media loading")):
        opt_dict(body, name)
        if body.get(name) and not ctx.settings.trust_request_mm_kwargs:
            raise handler_error(
                f"Per-request {name} are disabled by default because they can change multimodal {what} "
                "resource usage. Start the server with --trust-request-mm-kwargs only when clients are trusted.",
                name,
            )
    if body.get("media_io_kwargs"):
        raise BadRequestError(
            "Per-request media_io_kwargs are not supported by this render service.", param="media_io_kwargs"
        )


def reused_prompt_ids(ctx: RenderContext, body: dict[str, Any]) -> list[int] | None:
    """Decode-side reuse: prompt ids forwarded in `kv_transfer_params` skip templating (vLLM pops them)."""
    kv = body.get("kv_transfer_params")
    if not isinstance(kv, dict) or kv.get("prompt_token_ids") is None:
        return None
    ids = kv.pop("prompt_token_ids")
    if body.get("echo") or templating.has_non_text_content(body.get("messages")):
        return None
    if not isinstance(ids, list) or not ids or any(type(x) is not int or x < 0 for x in ids):
        raise handler_error(
            "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers.",
            "kv_transfer_params.prompt_token_ids",
        )
    if max(ids) >= ctx.model.vocab_size:
        raise handler_error(f"Token id {max(ids)} is out of vocabulary", "kv_transfer_params.prompt_token_ids")
    return ids


def _request_id(prefix: str, body: dict[str, Any], header_id: str | None) -> str:
    if header_id is not None:
        return f"{prefix}{header_id}"
    request_id = body.get("request_id")
    return f"{prefix}{request_id if request_id is not None else random_uuid()}"


def _check_lengths(
    ctx: RenderContext,
    token_count: int,
    max_output: int | None,
    output_param: str,
    truncate: int | None,
    from_text: bool = False,
) -> None:
    """`TokenizeParams.__post_init__` and `_token_len_check`."""
    max_total = ctx.model.max_model_len
    if max_output is not None and max_output > max_total:
        raise handler_error(
            f"{output_param}={max_output} cannot be greater than max_model_len={max_total}. "
            "Please request fewer output tokens.",
            output_param,
            max_output,
        )
    if truncate is not None and truncate > max_total:
        raise handler_error(
            f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len "
            f"= {max_total}. Please request a smaller truncation size.",
            "truncate_prompt_tokens",
            truncate,
        )
    if token_count > max_total:
        # vLLM's tokenizer truncates text to max_model_len + 1 tokens before this check.
        if from_text and truncate is None:
            token_count = max_total + 1
        qualifier = "at least " if token_count == max_total + 1 else ""
        raise handler_error(
            f"This model's maximum context length is {max_total} tokens. However, your prompt contains "
            f"{qualifier}{token_count} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
            "input_tokens",
            token_count,
        )


def _truncate(ids: list[int], truncate: int | None, side: str | None, max_total: int) -> list[int]:
    if truncate is None:
        return ids
    limit = max(0, max_total - 1) if truncate == -1 else truncate
    if len(ids) <= limit:
        return ids
    return ids[-limit:] if (side or "left") == "left" else ids[:limit]


def get_max_tokens(ctx: RenderContext, requested: int | None, input_length: int, truncate: int | None) -> int:
    """`serve/utils/api_utils.get_max_tokens`."""
    max_model_len = ctx.model.max_model_len
    if truncate is not None:
        input_length = min(input_length, max_model_len if truncate == -1 else truncate)
    if max_model_len < input_length:
        raise BadRequestError(
            f"Input length ({input_length}) exceeds model's maximum context length ({max_model_len})."
        )
    fallback = requested if requested is not None else ctx.model.default_sampling.get("max_tokens")
    candidates = (max_model_len - input_length, fallback, ctx.model.override_max_tokens)
    return min(v for v in candidates if v is not None)


def _sampling_values(
    ctx: RenderContext,
    body: dict[str, Any],
    max_tokens: int,
    *,
    chat: bool,
    skip_special_tokens: bool | None,
    vllm_effects: Any = None,
) -> dict[str, Any]:
    settings = ctx.settings
    if chat and ctx.model.renderer_mode == "harmony":
        body = harmony_parser.adjust_output_format(body)
    if vllm_effects is not None and vllm_effects.structured_outputs_changed:  # set by vLLM's parser
        so = vllm_effects.structured_outputs
        structured_outputs = structured.make_structured_outputs(**so) if so is not None else None
    else:
        structured_outputs = structured.structured_outputs_wire(
            body,
            chat=chat,
            # A parser from vLLM (render_service/adapter) made its own constraint above, if any.
            tool_parser=None if vllm_effects is not None else settings.tool_call_parser,
            enable_auto_tool_choice=settings.enable_auto_tool_choice,
            reasoning_parser=settings.reasoning_parser,
        )
        if chat and settings.enable_auto_tool_choice and settings.tool_call_parser:
            # A parser's own JSON schema for forced calls (Mistral before v11), replacing response_format's.
            own = getattr(parsers.TOOL_PARSERS.get(settings.tool_call_parser), "forced_call_schema", None)
            schema = own(body, ctx.model.hf_tokenizer) if own is not None else None
            if schema is not None:
                structured_outputs = structured.make_structured_outputs(json=schema)
    defaults = ctx.model.default_sampling
    values: dict[str, Any] = {}
    for name, fallback in DEFAULT_SAMPLING_FLOATS.items():
        value = body.get(name)
        values[name] = value if value is not None else defaults.get(name, fallback)
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"):
        values[name] = float(values[name])
    if skip_special_tokens is None:
        skip_special_tokens = defaults.get("skip_special_tokens", True)
    stop_token_ids = body.get("stop_token_ids", [])
    default_stop_ids = defaults.get("stop_token_ids")
    if default_stop_ids:
        stop_token_ids = list(dict.fromkeys([*(stop_token_ids or []), *default_stop_ids]))
    extra_args = dict(body.get("vllm_xargs") or {})
    if body.get("kv_transfer_params"):
        extra_args["kv_transfer_params"] = body["kv_transfer_params"]
    if body.get("ec_transfer_params"):
        extra_args["ec_transfer_params"] = body["ec_transfer_params"]
    if chat:
        logprobs = body.get("top_logprobs", 0) if body.get("logprobs") and not body.get("logprob_token_ids") else None
        prompt_logprobs = body.get("prompt_logprobs")
        if prompt_logprobs is None and body.get("echo"):
            prompt_logprobs = body.get("top_logprobs", 0)
    else:
        logprobs = None if body.get("logprob_token_ids") else body.get("logprobs")
        prompt_logprobs = body.get("prompt_logprobs")
        if prompt_logprobs is None and body.get("echo"):
            prompt_logprobs = body.get("logprobs")
        if body.get("echo") and body.get("max_tokens", 16) == 0:
            max_tokens = 1
    n = body.get("n")
    logit_bias = body.get("logit_bias")
    if logit_bias is not None:
        converted = {}
        invalid = []
        for token, bias in logit_bias.items():
            try:
                converted[int(token)] = min(100.0, max(-100.0, bias))
            except (TypeError, ValueError):
                invalid.append(token)
        if invalid:
            raise handler_error(
                f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
                "logit_bias",
                invalid,
            )
        logit_bias = converted
    values.update(
        n=1 if n is None else n,
        watermarking=body.get("watermarking"),
        seed=body.get("seed"),
        stop=body.get("stop", []),
        stop_token_ids=stop_token_ids,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=body.get("logprob_token_ids") or None,
        ignore_eos=body.get("ignore_eos", False),
        max_tokens=max_tokens,
        min_tokens=body.get("min_tokens", 0),
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=vllm_effects.spaces_between_special_tokens
        if vllm_effects is not None and vllm_effects.spaces_between_special_tokens is not None
        else body.get("spaces_between_special_tokens", True),
        include_stop_str_in_output=body.get("include_stop_str_in_output", False),
        output_kind=OUTPUT_KIND_DELTA if body.get("stream") else OUTPUT_KIND_FINAL_ONLY,
        stream_interval=body.get("stream_interval"),
        structured_outputs=structured_outputs,
        logit_bias=logit_bias,
        bad_words=body.get("bad_words", []),
        thinking_token_budget=body.get("thinking_token_budget"),
        allowed_token_ids=body.get("allowed_token_ids"),
        extra_args=extra_args or None,
        skip_clone=True,
        repetition_detection=body.get("repetition_detection"),
        routed_experts_prompt_start=body.get("routed_experts_prompt_start", 0),
    )
    return values


def _hoist_transfer_params(sampling: dict[str, Any]) -> tuple[Any, Any]:
    extra = sampling.get("extra_args")
    if not extra:
        return None, None
    extra = dict(extra)
    kv = extra.pop("kv_transfer_params", None)
    ec = extra.pop("ec_transfer_params", None)
    if extra:
        sampling["extra_args"] = extra
    else:
        sampling.pop("extra_args", None)
    return kv, ec


# -- chat -----------------------------------------------------------------------------------


def tool_dicts(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """`ChatCompletionToolsParam.model_dump()`: declared fields only, nulls kept except strict."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        function = tool["function"]
        dumped = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        defer = function.get("defer_loading", tool.get("defer_loading"))
        if defer is not None:
            dumped["defer_loading"] = defer
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


def _tool_choice_wire(choice: Any) -> Any:
    if isinstance(choice, dict):
        function = choice.get("function") or {}
        wire_function = {"name": function.get("name")}
        wire_function.update({k: v for k, v in function.items() if k != "name"})
        out = {"function": wire_function, "type": choice.get("type", "function")}
        out.update({k: v for k, v in choice.items() if k not in ("function", "type")})
        return out
    return choice


def effective_template_kwargs(ctx: RenderContext, body: dict[str, Any]) -> dict[str, Any]:
    """`build_chat_params(...).with_defaults(defaults).chat_template_kwargs`."""
    user = body.get("chat_template_kwargs") or {}
    extra: dict[str, Any] = {
        "add_generation_prompt": body.get("add_generation_prompt", True),
        "continue_final_message": body.get("continue_final_message", False),
        "documents": body.get("documents"),
        "reasoning_effort": body.get("reasoning_effort"),
    }
    effort = body.get("reasoning_effort")
    if effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    kwargs = _merge_kwargs(user, extra)
    defaults = ctx.settings.default_template_kwargs
    if defaults:
        kwargs = _merge_kwargs(defaults, kwargs)
    return kwargs


def _merge_kwargs(defaults: dict[str, Any] | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
    return (defaults or {}) | {k: v for k, v in (overrides or {}).items() if v is not None and v != "auto"}


def parser_adjustments(
    ctx: RenderContext, has_tools: bool, tool_choice: Any, skip_special_tokens: bool | None
) -> parsers.RequestAdjustment:
    """The parsers' `adjust_request` effects on the rendered request (structured outputs apart):
    the new `skip_special_tokens`, and `spaces_between_special_tokens` where a parser sets it."""
    settings = ctx.settings
    return parsers.adjust_request(
        settings.reasoning_parser,
        settings.tool_call_parser if ctx.has_tool_parser else None,
        parsers.RequestAdjustment(
            has_tools=has_tools, tool_choice=tool_choice, skip_special_tokens=skip_special_tokens
        ),
    )


def validate_chat_request(body: dict[str, Any]) -> None:
    """The schema and `model_validator`s of vLLM's `ChatCompletionRequest` (api/requests.py)."""
    requests.validate_chat_request(body)


@dataclass
class _Validated:
    unchanged: bool  # the messages came through validation unchanged (a later turn may skip them)
    seen: int = 0  # leading messages that were a validated and rendered request's (not validated again)
    tools_key: bytes | None = None  # SharedTools.key_of(body["tools"]), when taken


def _validate_chat(ctx: RenderContext, body: dict[str, Any], key: prefix.HistoryKey | None) -> _Validated:
    """Validate the request. With the segment cache on, what validated before is not validated
    again: when the messages before the latest reply are a request this worker validated and
    rendered (same digest, same bytes), only the messages from the reply on are validated (message
    validation is per message); when the tools are a list that passed validation unchanged before
    (same bytes), a list of the same names stands in for them (the only validator that reads tools
    beside their own schema, `chat_check_tool_usage`, reads their names and whether there are any).
    Any error validates the whole request again, for vLLM's exact error."""
    messages: Any = body.get("messages")
    if ctx.history is None:
        validate_chat_request(body)
        return _Validated(isinstance(messages, list) and _unchanged(body.get("messages"), messages))
    record = ctx.prefix_guard.lookup(key) if ctx.prefix_guard and key else None
    start = key.reply_index if key is not None and record is not None and record.validated else 0
    if not isinstance(messages, list) or not 0 < start < len(messages) <= MAX_MESSAGES:
        start = 0
    tools: Any = body.get("tools")
    tools_key = templating.SHARED_TOOLS.key_of(tools)
    names = templating.SHARED_TOOLS.validated_names(tools_key) if tools_key is not None else None
    if not start and names is None:
        validate_chat_request(body)
        return _validated(body, messages, 0, tools, tools_key)
    original = dict(body)
    if start:
        body["messages"] = messages[start:]
    if names is not None:
        body["tools"] = [{"type": "function", "function": {"name": name}} for name in names]
    try:
        validate_chat_request(body)
    except RenderServiceError:
        body.clear()
        body.update(original)
        validate_chat_request(body)  # raises the whole request's error
        return _validated(body, messages, 0, tools, tools_key)
    if names is not None:
        body["tools"] = tools  # they would have come through unchanged
    if not start:
        return _validated(body, messages, 0, tools, tools_key)
    suffix = body["messages"]
    for message in messages[:start]:  # what validation renames (chat_normalize_messages)
        reasoning_content = message.pop("reasoning_content", None)
        if reasoning_content is not None and message.get("reasoning") is None:
            message["reasoning"] = reasoning_content
    body["messages"] = [*messages[:start], *suffix]
    return _Validated(_unchanged(suffix, messages[start:]), start, tools_key)


def _validated(body: dict[str, Any], messages: Any, seen: int, tools: Any, tools_key: bytes | None) -> _Validated:
    """The outcome of validating `body` (its messages were `messages`, its tools `tools`); tools
    that came through unchanged are remembered as validated."""
    unchanged = isinstance(messages, list) and _unchanged(body.get("messages"), messages)
    came_through = body.get("tools") is tools
    if tools_key is None or not isinstance(tools, list) or not came_through:
        return _Validated(unchanged, seen)
    templating.SHARED_TOOLS.remember_validated(tools_key, tools)
    return _Validated(unchanged, seen, tools_key)


def _unchanged(validated: Any, raw: list[Any]) -> bool:
    return (
        isinstance(validated, list)
        and len(validated) == len(raw)
        and all(a is b for a, b in zip(validated, raw, strict=True))
    )


def make_context(model: Model, settings: Settings, adapters: AdapterRegistry | None = None) -> RenderContext:
    """The render context, with an image processor when the model folder is a supported VL model.
    `adapters`: the replica's LoRA adapters (default: `settings.lora_modules`, checked and loaded)."""
    if adapters is None and settings.lora_modules:
        adapters = AdapterRegistry.start(settings.served_names, settings.lora_module_paths, shared=False)
    config = multimodal.VisionConfig.load(model.path, settings.model)
    limits = media.MediaLimits(
        fetch_timeout=settings.media_fetch_timeout,
        max_fetch_bytes=settings.media_max_bytes,
        max_data_url_bytes=settings.media_max_bytes,
        allow_redirects=settings.media_allow_redirects,
        allowed_domains=tuple(settings.allowed_media_domains) if settings.allowed_media_domains else None,
        allow_private_addresses=settings.media_allow_private_addresses,
        max_images_per_prompt=_image_limit(settings.limit_mm_per_prompt),
    )
    vision = None
    if config is not None:
        vision = multimodal.ImageProcessor(
            config, settings.mm_cache_bytes, limits.max_image_pixels, settings.mm_processor_kwargs
        )
    else:  # a vision-language model with no native processor: vLLM's (render_service/adapter/multimodal.py)
        tokenizer_path = getattr(model, "tokenizer_path", None) or model.path
        vision = adapter_multimodal.vision(model.path, tokenizer_path, settings, model.renderer_mode)
    cache, segmenter, why_not = segments.build(model.hf_tokenizer, model.encode, settings.segment_cache_bytes)
    if cache is None:
        logger.info("segment cache off: %s", why_not)
    guard = prefix.guard_for(cache, segmenter, model.encode)
    # Incremental templating goes with the segment cache (--segment-cache-bytes 0 turns both off);
    # --full-templating turns it off alone.
    memo = history.HistoryRenderer() if settings.segment_cache_bytes > 0 and not settings.full_templating else None
    return RenderContext(
        model,
        settings,
        vision,
        limits,
        adapters=adapters,
        segments=cache,
        prefix_guard=guard,
        history=memo,
        prompt_memo=continuation.PromptMemo() if settings.preserve_generated_tokens else None,
    )


def _image_limit(limits: dict[str, Any]) -> int:
    value = limits.get("image", 999)
    return int(value.get("count", 999)) if isinstance(value, dict) else int(value)


def _load_images(
    ctx: RenderContext,
    urls: list[str],
    fetched: dict[str, bytes] | None,
    processor_kwargs: dict[str, Any] | None = None,
    tensors: bool = True,
) -> list[multimodal.ProcessedImage]:
    assert ctx.vision is not None
    limit = ctx.media_limits.max_images_per_prompt
    if len(urls) > limit:
        raise BadRequestError(f"At most {limit} image(s) may be provided in one prompt.", param="messages")
    options = ctx.vision.options(processor_kwargs) if processor_kwargs else None
    # The Redis tier's step before the render: images already decoded and hashed (same options only).
    prepared = fetched if isinstance(fetched, media.FetchedImages) else None
    if prepared is not None and prepared.hash_kwargs != (options or ctx.vision.default_options).hash_kwargs:
        prepared = None
    decode_data_url = partial(media.decode_data_url, limits=ctx.media_limits)
    # Looked up in order; the cache misses decoded and processed together, on idle cores.
    with ctx.vision.batch() as batch:
        for url in urls:
            known = prepared.lookup(url) if prepared is not None else None
            if url.startswith("data:"):
                batch.add_data_url(url, decode_data_url, options, tensors, known)
                continue
            if known is not None:
                data, digest = known
            elif fetched is not None and url in fetched:
                data, digest = fetched[url], None
            else:
                media.check_url(url, ctx.media_limits)
                raise BadRequestError(f"Image URL {url!r} was not fetched.", param="messages")
            batch.add(data, options, tensors, digest=digest)
    return batch.results()


def render_chat(
    ctx: RenderContext,
    body: dict[str, Any],
    header_request_id: str | None = None,
    fetched: dict[str, bytes] | None = None,
    *,
    converted: bool = False,
    prefix_checks: list[prefix.PrefixCheck] | None = None,
    generated: continuation.Lookup | None = None,
) -> dict[str, Any]:
    """`fetched`: the bodies of the request's http(s) image URLs (fetched by the caller, async).
    `converted`: the body was built by a converter (Messages), not sent by a client; vLLM assigns
    those fields after the chat request's validators ran, so they are not validated again.
    `prefix_checks`: receives the prefix-stability guard's verdict (for the response header).
    `generated`: the request asked for token-identical continuation and these are its replies'
    generated ids (derender/generated.py); the verdict lands in `generated.result`."""
    key = prefix.history_key(body.get("messages")) if ctx.prefix_guard is not None else None
    validated, seen, tools_key, validated_tools = False, 0, None, None
    if not converted:
        outcome = _validate_chat(ctx, body, key)
        validated, seen, tools_key, validated_tools = (
            outcome.unchanged,
            outcome.seen,
            outcome.tools_key,
            body.get("tools"),
        )
    check_model(ctx, body.get("model"))
    if body.get("use_beam_search"):
        raise BadRequestError("Beam search is not supported by the render endpoint")
    settings = ctx.settings
    # A renderer's own request checks run first (Mistral: `validate_request_params`).
    renderer_checks = getattr(ctx.model.renderer, "check_request", None)
    if renderer_checks is not None:
        renderer_checks(body)
    tool_choice = body.get("tool_choice", "none")
    tools = body.get("tools")
    harmony = ctx.model.renderer_mode == "harmony"
    # vLLM checks tool_choice against the parser flags only for HF templates (`render_chat`):
    # Harmony and Mistral models render tools without a tool parser.
    own_tools = harmony or ctx.model.renderer_mode == "mistral"
    if not own_tools and not ctx.has_tool_parser and tool_choice not in (None, "none"):
        if tool_choice == "auto" and not settings.enable_auto_tool_choice:
            raise BadRequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        if tool_choice != "auto":
            desc = (
                f'function "{tool_choice["function"]["name"]}"' if isinstance(tool_choice, dict) else f'"{tool_choice}"'
            )
            raise BadRequestError(f"tool_choice={desc} requires --tool-call-parser to be set")
    # The template's tools and parse_context's (the template cannot mutate them); with the segment
    # cache on, an HF template's are the dicts of an earlier request with the same tools.
    if ctx.segments is not None and ctx.model.renderer_mode == "hf":
        # (the key validation took of these very tools, if it did)
        dumped_tools = templating.SHARED_TOOLS.get(tools, tool_dicts, tools_key if tools is validated_tools else None)
    else:
        dumped_tools = tool_dicts(tools)
    rendered_tools = None if tool_choice == "none" and settings.exclude_tools_when_tool_choice_none else dumped_tools
    user_kwargs = body.get("chat_template_kwargs") or {}
    if not settings.trust_request_chat_template and (
        body.get("chat_template") is not None or user_kwargs.get("chat_template") is not None
    ):
        raise BadRequestError(
            "Chat template is passed with request, but --trust-request-chat-template is "
            "not set. Refused request with untrusted chat template."
        )
    check_mm_kwargs(ctx, body)

    max_completion = body.get("max_completion_tokens")
    max_output = max_completion if max_completion is not None else body.get("max_tokens")
    output_param = "max_completion_tokens" if max_completion is not None else "max_tokens"
    truncate = body.get("truncate_prompt_tokens")
    validate_length_params(ctx, max_output, output_param, truncate)

    # ChatParams.chat_template (request, else --chat-template) wins over a template in the kwargs,
    # which wins over the tokenizer's own (resolved last, in safe_apply_chat_template).
    chat_template = (
        body.get("chat_template")
        or ctx.model.flag_chat_template
        or user_kwargs.get("chat_template")
        or ctx.model.chat_template
    )
    template_kwargs = effective_template_kwargs(ctx, body)
    features = None
    turn: prefix.Turn | None = None
    reused = reused_prompt_ids(ctx, body)
    if reused is not None:
        offsets = None
        token_ids = _truncate(reused, truncate, body.get("truncation_side"), ctx.model.max_model_len)
        _check_lengths(ctx, len(token_ids), max_output, output_param, truncate)
    else:
        if not converted:
            # The first `seen` messages passed these checks in the request they were rendered in.
            content_parts.check_messages(body["messages"][seen:] if seen else body["messages"])
        if harmony:
            check_chat_effort(body.get("reasoning_effort"))
        turn = _begin_turn(ctx, body, chat_template, rendered_tools, template_kwargs, key)
        if turn is not None:
            turn.validated = validated
        token_ids, offsets, features = render_conversation(
            ctx,
            body,
            chat_template,
            rendered_tools,
            template_kwargs,
            max_output,
            output_param,
            truncate,
            fetched,
            turn=turn,
        )
        if turn is not None and prefix_checks is not None and turn.check is not None:
            prefix_checks.append(turn.check)
        if generated is not None:
            token_ids = _continue(
                ctx, body, generated, token_ids, chat_template, rendered_tools, template_kwargs, features, offsets
            )
            _check_lengths(ctx, len(token_ids), max_output, output_param, truncate)

    skip_special_tokens = body.get("skip_special_tokens")
    # Parsers with no native implementation: vLLM's adjust_request and prompt check (render_service/adapter).
    vllm_parsers = adapter.runtime(ctx)
    vllm_effects = vllm_parsers.parsers.render_effects(body, template_kwargs, token_ids) if vllm_parsers else None
    if vllm_effects is not None:
        skip_special_tokens = vllm_effects.skip_special_tokens
    elif settings.reasoning_parser is not None or tool_choice != "none":  # vLLM runs adjust_request
        adjusted = parser_adjustments(ctx, bool(tools), tool_choice, skip_special_tokens)
        skip_special_tokens = adjusted.skip_special_tokens
        if adjusted.spaces_between_special_tokens is not None:
            body = {**body, "spaces_between_special_tokens": adjusted.spaces_between_special_tokens}
    if not token_ids:
        raise BadRequestError("No token_ids rendered")

    max_tokens = get_max_tokens(ctx, max_output, len(token_ids), truncate)
    values = _sampling_values(
        ctx, body, max_tokens, chat=True, skip_special_tokens=skip_special_tokens, vllm_effects=vllm_effects
    )
    sampling = sampling_params_wire(values)
    kv_params, ec_params = _hoist_transfer_params(sampling)

    reasoning_parser_kwargs = {"chat_template_kwargs": template_kwargs} if ctx.has_reasoning_parser else None
    if vllm_effects is not None:
        reasoning_parser_kwargs = vllm_effects.reasoning_parser_kwargs
    if not body.get("include_reasoning", True):
        reasoning_ended: bool | None = True
    elif vllm_effects is not None:
        reasoning_ended = vllm_effects.reasoning_ended
    elif ctx.has_reasoning_parser:
        assert settings.reasoning_parser is not None
        reasoning_ended = parsers.prompt_ends_reasoning(
            ctx.model.hf_tokenizer, settings.reasoning_parser, token_ids, template_kwargs
        )
    else:
        reasoning_ended = None
    stream = bool(body.get("stream"))
    parse_context = {
        "tools": dumped_tools,
        "tool_choice": _tool_choice_wire(tool_choice),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "include_reasoning": body.get("include_reasoning", True),
        # Harmony output is parsed without template kwargs (vLLM's `_build_parse_context`).
        "chat_template_kwargs": {} if harmony else template_kwargs,
        "history_tool_call_cnt": _history_tool_calls(body["messages"], turn),
    }
    return generate_request(
        request_id=_request_id("chatcmpl-", body, header_request_id),
        token_ids=token_ids,
        sampling_params=sampling,
        model=body.get("model"),
        reasoning_ended=reasoning_ended,
        reasoning_parser_kwargs=reasoning_parser_kwargs,
        return_token_ids=body.get("return_token_ids"),
        parse_context=parse_context,
        stream=stream,
        stream_options=stream_options_wire(body.get("stream_options")) if stream else None,
        cache_salt=body.get("cache_salt"),
        priority=body.get("priority", 0),
        kv_transfer_params=kv_params,
        ec_transfer_params=ec_params,
        token_offsets=offsets,
        features=features,
    )


def validate_length_params(ctx: RenderContext, max_output: int | None, output_param: str, truncate: int | None) -> None:
    """`TokenizeParams` validates the output and truncation sizes before anything is rendered."""
    _check_lengths(ctx, 0, max_output, output_param, truncate)


def render_conversation(
    ctx: RenderContext,
    body: dict[str, Any],
    chat_template: str | None,
    rendered_tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    max_output: int | None,
    output_param: str,
    truncate: int | None,
    fetched: dict[str, bytes] | None = None,
    *,
    turn: prefix.Turn | None = None,
) -> tuple[list[int], list[list[int]] | None, dict[str, Any] | None]:
    """Template `body["messages"]`, tokenize (expanding image placeholders), truncate and check the
    length against max_model_len: (token ids, offsets, multimodal features). `turn`: the prefix
    guard's record of this request (`_begin_turn`); its verdict lands in `turn.check`."""
    token_ids, offsets, features = _render_chat_tokens(
        ctx, body, chat_template, rendered_tools, template_kwargs, fetched, turn
    )
    token_ids = _truncate(token_ids, truncate, body.get("truncation_side"), ctx.model.max_model_len)
    _check_lengths(ctx, len(token_ids), max_output, output_param, truncate, from_text=True)
    return token_ids, offsets, features


def _render_chat_tokens(
    ctx: RenderContext,
    body: dict[str, Any],
    chat_template: str | None,
    rendered_tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    fetched: dict[str, bytes] | None = None,
    turn: prefix.Turn | None = None,
) -> tuple[list[int], list[list[int]] | None, dict[str, Any] | None]:
    """Template the conversation and tokenize it (the part forwarded prompt ids skip); images are
    processed and their placeholders expanded."""
    renderer: renderers.Renderer = ctx.model.renderer
    if chat_template is None and renderer.needs_chat_template:
        raise BadRequestError(
            "As of transformers v4.44, default chat template is no longer allowed, so you "
            "must provide a chat template if the tokenizer does not define one."
        )
    # The Python encoders parse messages in their own content format; HF follows the flag.
    content_format = renderer.content_format or ctx.settings.chat_template_content_format
    if content_format == "auto":
        assert chat_template is not None
        content_format = templating.detect_content_format(chat_template)
    collector = None
    if ctx.vision is not None:
        collector = templating.MediaCollector(ctx.vision.config.placeholder, ctx.settings.served_names[0])
    incremental = _incremental_prompt(ctx, body, chat_template, rendered_tools, template_kwargs, content_format, turn)
    if incremental is not None and turn is not None:
        return _encode_turn(ctx, turn, incremental, body["messages"]), None, None
    # A renderer that reads the request messages (Mistral) says when parsing them could neither
    # fail nor find media; then the conversation it would not read is not built.
    unused = getattr(renderer, "conversation_unused", None)
    if unused is not None and unused(body["messages"]):
        conversation: list[dict[str, Any]] = []
    else:
        conversation = templating.build_conversation(
            body["messages"], content_format, collector, model_name=ctx.settings.served_names[0]
        )
    mm_payload = body.get("mm_payload", "tensors")
    # vLLM's processor (render_service/adapter/multimodal.py) expands the whole prompt itself.
    delegated = ctx.vision if isinstance(ctx.vision, adapter_multimodal.DelegatedVision) else None
    images = (
        _load_images(
            ctx, collector.image_urls, fetched, body.get("mm_processor_kwargs"), tensors=mm_payload == "tensors"
        )
        if collector and collector.image_urls and delegated is None
        else []
    )
    rendered = renderer.render(
        renderers.ChatInput(
            messages=body["messages"],
            conversation=conversation,
            tools=rendered_tools,
            kwargs=template_kwargs,
            chat_template=chat_template,
            tool_choice=body.get("tool_choice") if body.get("tools") else None,
            response_format=body.get("response_format"),
            reasoning_effort=body.get("reasoning_effort"),
        )
    )
    if rendered.token_ids is not None:  # tokenized by the renderer (Kimi K3, Harmony)
        _skip_turn(ctx, turn)
        return rendered.token_ids, None, None
    prompt = rendered.text or ""
    add_special = bool(body.get("add_special_tokens", False))
    if delegated is not None and collector is not None and collector.image_urls:
        _skip_turn(ctx, turn)
        prompt_ids = ctx.encode(prompt, add_special)
        token_ids, features = delegated.render(prompt_ids, collector.image_urls, fetched, body, ctx.media_limits)
        return token_ids, None, features
    if images:
        assert ctx.vision is not None
        _skip_turn(ctx, turn)
        token_ids, placeholders = multimodal.expand_prompt(
            ctx.encode(prompt, add_special), images, ctx.vision.config.image_token_id
        )
        return token_ids, None, multimodal.features(images, placeholders, mm_payload)
    if body.get("return_token_offsets"):
        _skip_turn(ctx, turn)
        ids, offsets = ctx.model.encode_with_offsets(prompt, add_special)
        return ids, offsets, None
    if turn is None or add_special or ctx.prefix_guard is None:
        _skip_turn(ctx, turn)
        return ctx.encode(prompt, add_special), None, None
    return _encode_turn(ctx, turn, prompt, body["messages"]), None, None


# -- the segment cache, incremental templating and the prefix guard -------------------------


def _incremental_prompt(
    ctx: RenderContext,
    body: dict[str, Any],
    chat_template: str | None,
    rendered_tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    content_format: str,
    turn: prefix.Turn | None,
) -> str | None:
    """The prompt text from the previous turn's prompt and the new messages (history.py), or None
    where that does not apply: no previous prompt, another renderer, media, offsets, BOS/EOS, or
    developer messages the template folds into the system message."""
    memo = ctx.history
    if (
        memo is None
        or turn is None
        or turn.previous is None
        or turn.status is not None
        or turn.previous.fingerprint != turn.fingerprint
        or chat_template is None
        or ctx.vision is not None
        or ctx.model.renderer_mode != "hf"
        or body.get("return_token_offsets")
        or body.get("add_special_tokens")
    ):
        return None
    messages = body["messages"]
    facts = _facts(turn, messages)
    if not templating.supports_developer_role(chat_template) and any(kind[0] == "developer" for kind in facts.kinds):
        return None
    tokenizer = ctx.model.hf_tokenizer
    model_name = ctx.settings.served_names[0]
    # What the hf renderer hands to the template (render/renderers/hf.py).
    kwargs = {k: v for k, v in template_kwargs.items() if k not in ("tools", "chat_template", "tokenize")}

    def convert(part: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return templating.build_conversation(part, content_format, None, model_name=model_name)

    def render(conversation: list[dict[str, Any]], generation_prompt: bool) -> str:
        step = {**kwargs, "add_generation_prompt": generation_prompt}
        return templating.render_prompt(tokenizer, chat_template, conversation, rendered_tools, step)

    def render_full() -> str:
        return templating.render_prompt(tokenizer, chat_template, convert(messages), rendered_tools, kwargs)

    return memo.render(
        turn.fingerprint,
        turn.previous.text,
        messages,
        len(turn.history) - 1,
        convert,
        render,
        render_full,
        bool(kwargs.get("add_generation_prompt")),
        turn.previous.facts,
    )


# -- token-identical continuation -----------------------------------------------------------


def _continuation_blocker(
    ctx: RenderContext,
    body: dict[str, Any],
    chat_template: str | None,
    template_kwargs: dict[str, Any],
    features: Any,
    offsets: Any,
) -> bool:
    """Requests the splice does not handle: templates other than HF's, media, offsets, BOS/EOS,
    truncation, or a prompt that continues the last message instead of starting a reply."""
    return (
        chat_template is None
        or ctx.model.renderer_mode != "hf"
        or ctx.vision is not None
        or features is not None
        or offsets is not None
        or bool(body.get("add_special_tokens"))
        or body.get("truncate_prompt_tokens") is not None
        or not template_kwargs.get("add_generation_prompt")
        or bool(template_kwargs.get("continue_final_message"))
    )


def _continue(
    ctx: RenderContext,
    body: dict[str, Any],
    generated: continuation.Lookup,
    token_ids: list[int],
    chat_template: str | None,
    rendered_tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    features: Any,
    offsets: Any,
) -> list[int]:
    """The prompt with the replies' generated ids spliced in (render/continuation.py), or the
    ordinary prompt; the verdict goes to `generated.result`."""
    messages = body["messages"]
    if continuation.last_assistant(messages) >= 0 and _continuation_blocker(
        ctx, body, chat_template, template_kwargs, features, offsets
    ):
        generated.result = continuation.Continuation(False, reason=continuation.UNSUPPORTED)
        return token_ids
    if chat_template is None:  # nothing to splice (the first turn)
        ids, generated.result = continuation.splice(messages, generated, token_ids, _no_render, ctx.encode, {})
        return ids
    template: str = chat_template
    renderer: renderers.Renderer = ctx.model.renderer
    content_format = renderer.content_format or ctx.settings.chat_template_content_format
    if content_format == "auto":
        content_format = templating.detect_content_format(template)
    tokenizer = ctx.model.hf_tokenizer
    model_name = ctx.settings.served_names[0]
    # What the hf renderer hands to the template (render/renderers/hf.py).
    kwargs = {k: v for k, v in template_kwargs.items() if k not in ("tools", "chat_template", "tokenize")}

    def render_text(part: list[dict[str, Any]], generation_prompt: bool) -> str:
        conversation = templating.build_conversation(part, content_format, None, model_name=model_name)
        step = {**kwargs, "add_generation_prompt": generation_prompt}
        return templating.render_prompt(tokenizer, template, conversation, rendered_tools, step)

    ids, generated.result = continuation.splice(
        messages,
        generated,
        token_ids,
        render_text,
        ctx.encode,
        _added_tokens(ctx),
        ctx.prompt_memo,
        _memo_keys(messages, template, rendered_tools, template_kwargs),
    )
    return ids


def _memo_keys(
    messages: list[dict[str, Any]],
    chat_template: str,
    rendered_tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> continuation.MemoKeys | None:
    """Where this request's prompt is kept for the next turn, and where the previous turn's is."""
    key = prefix.history_key(messages)
    if key is None:
        return None
    try:  # what the template saw besides the messages
        inputs = orjson.dumps([chat_template, rendered_tools, template_kwargs], default=repr)
    except (TypeError, orjson.JSONEncodeError):
        return None

    def keyed(digest: bytes) -> bytes:
        return hashlib.blake2b(inputs + digest, digest_size=16).digest()

    return continuation.MemoKeys(keyed(key.previous_key), keyed(key.key))


def _no_render(part: list[dict[str, Any]], generation_prompt: bool) -> str:
    raise AssertionError("a conversation without a chat template has no assistant reply to splice")


def _added_tokens(ctx: RenderContext) -> dict[int, str]:
    """id -> text of the tokenizer's added tokens (per model, worked out once)."""
    known = ctx.memo.get("added_tokens_by_id")
    if known is None:
        vocabulary = ctx.model.hf_tokenizer.get_added_vocab()
        known = ctx.memo["added_tokens_by_id"] = {token_id: text for text, token_id in vocabulary.items()}
    return known


# -- the segment cache and the prefix guard -------------------------------------------------


def _begin_turn(
    ctx: RenderContext,
    body: dict[str, Any],
    chat_template: str | None,
    rendered_tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    key: prefix.HistoryKey | None = None,
) -> prefix.Turn | None:
    """Find the previous turn of this conversation (before templating: a hit lets the encode copy
    that prompt's ids). A prompt that continues the last message is not a new turn."""
    guard = ctx.prefix_guard
    if guard is None:
        return None
    try:  # what the template saw besides the messages: a change breaks the prefix by itself
        tools = templating.SHARED_TOOLS.encoding(rendered_tools)
        fingerprint = hash((chat_template, tools, orjson.dumps(template_kwargs, default=repr)))
    except (TypeError, orjson.JSONEncodeError):
        return None
    new_turn = bool(template_kwargs.get("add_generation_prompt")) and not template_kwargs.get("continue_final_message")
    return guard.begin(body["messages"], fingerprint, checkable=new_turn, key=key)


def _skip_turn(ctx: RenderContext, turn: prefix.Turn | None) -> None:
    if turn is not None and ctx.prefix_guard is not None:
        turn.check = prefix.SKIP
        ctx.prefix_guard.count(prefix.SKIP)


def _encode_turn(ctx: RenderContext, turn: prefix.Turn, prompt: str, messages: list[dict[str, Any]]) -> list[int]:
    """Encode the prompt (copying the previous turn's ids where the text allows), then check and
    record it in the prefix guard (with the facts of its messages, for the next turn)."""
    guard = ctx.prefix_guard
    assert guard is not None
    _facts(turn, messages)
    ids_json, json_head, marks, copied = b"", 0, None, 0
    if ctx.segments is not None:
        encoded = ctx.segments.encode_prompt(prompt, turn.previous, encoded_ids.EncodedIds)
        ids, head_chars, head_ids = encoded.ids, encoded.head_chars, encoded.head_ids
        marks, copied = encoded.marks, encoded.reused_ids
        if ids:  # the response writes the copied ids from the previous turn's JSON
            ids, json_head = encoded_ids.with_json(encoded, turn.previous)
            ids_json = ids.json or b""
    else:
        ids = ctx.model.encode(prompt, False)
        head_chars, head_ids = guard.head_of(prompt, ids)
    turn.check = guard.finish(turn, prompt, ids, head_chars, head_ids, ids_json, json_head, marks, copied)
    return ids


def _facts(turn: prefix.Turn, messages: list[dict[str, Any]]) -> history.HistoryFacts:
    """The facts of the request's (validated) messages: those of its history are the previous
    turn's, whose messages were these byte for byte (`PrefixGuard.lookup`); only the rest are read."""
    if turn.facts is None:
        previous = turn.previous
        known = previous.facts if previous is not None else None
        if known is not None and known.count != len(turn.history) - 1:
            known = None
        turn.facts = history.history_facts(messages, known)
    return turn.facts


def _history_tool_calls(messages: list[dict[str, Any]], turn: prefix.Turn | None = None) -> int:
    if turn is not None and turn.facts is not None:  # read when the prompt was recorded
        return turn.facts.tool_calls
    count = 0
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if calls is None:
            continue
        count += 1 if isinstance(calls, (str, bytes, dict)) else len(calls) if isinstance(calls, list) else 1
    return count


# -- completions ----------------------------------------------------------------------------


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """The validated `prompt` as a list of prompts (text or token ids)."""
    prompt: Any = body.get("prompt")
    if body.get("prompt_embeds") is not None:
        raise BadRequestError("prompt_embeds are not supported by this render tier (no torch).", param="prompt_embeds")
    if prompt == []:
        raise validator_error("You must pass at least one prompt", "prompt")
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt)


def render_completion(
    ctx: RenderContext, body: dict[str, Any], header_request_id: str | None = None
) -> list[dict[str, Any]]:
    requests.validate_completion_request(body)
    prompts = _prompts(body)
    check_model(ctx, body.get("model"))
    if body.get("use_beam_search"):
        raise BadRequestError("Beam search is not supported by the render endpoint")
    if body.get("suffix") is not None:
        if body.get("echo"):
            raise BadRequestError("Echo is unsupported with suffix.", param="suffix")
        if body.get("truncate_prompt_tokens") is not None:
            raise BadRequestError("suffix is not supported with truncate_prompt_tokens", param="suffix")
        if not (isinstance(body.get("prompt"), str) or all(isinstance(p, str) for p in body.get("prompt") or [])):
            raise BadRequestError("suffix requires text prompt input for FIM completion rendering", param="suffix")
        filled = [ctx.model.renderer.completion_suffix(p, body["suffix"]) for p in prompts if isinstance(p, str)]
        if any(p is None for p in filled):
            raise BadRequestError("suffix is only supported for models with FIM completion rendering", param="suffix")
        prompts = [p for p in filled if p is not None]
    check_mm_kwargs(ctx, body)
    max_tokens_requested = body.get("max_tokens", 16)
    truncate = body.get("truncate_prompt_tokens")
    _check_lengths(ctx, 0, max_tokens_requested or 0, "max_tokens", truncate)
    add_special = body.get("add_special_tokens", True)
    base = _request_id("cmpl-", body, header_request_id)
    out = []
    for index, prompt in enumerate(prompts):
        offsets = None
        if isinstance(prompt, str) and body.get("return_token_offsets"):
            token_ids, offsets = ctx.model.encode_with_offsets(prompt, add_special)
        elif isinstance(prompt, str):
            token_ids = ctx.model.encode(prompt, add_special)
        else:
            token_ids = list(prompt)
        token_ids = _truncate(token_ids, truncate, body.get("truncation_side"), ctx.model.max_model_len)
        _check_lengths(
            ctx, len(token_ids), max_tokens_requested or 0, "max_tokens", truncate, from_text=isinstance(prompt, str)
        )
        if not token_ids:
            raise BadRequestError("No token_ids rendered")
        max_tokens = get_max_tokens(ctx, max_tokens_requested, len(token_ids), truncate)
        values = _sampling_values(
            ctx, body, max_tokens, chat=False, skip_special_tokens=body.get("skip_special_tokens")
        )
        sampling = sampling_params_wire(values)
        kv_params, ec_params = _hoist_transfer_params(sampling)
        stream = bool(body.get("stream"))
        out.append(
            generate_request(
                request_id=base if len(prompts) == 1 else f"{base}-{index}",
                token_ids=token_ids,
                sampling_params=sampling,
                model=body.get("model"),
                return_token_ids=body.get("return_token_ids"),
                stream=stream,
                stream_options=stream_options_wire(body.get("stream_options")) if stream else None,
                cache_salt=body.get("cache_salt"),
                priority=body.get("priority", 0),
                kv_transfer_params=kv_params,
                ec_transfer_params=ec_params,
                token_offsets=offsets,
            )
        )
        token_id_checks.check_generate_request(out[-1], ctx.model, client_prompt_ids=not isinstance(prompt, str))
    return out
