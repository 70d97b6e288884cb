"""OpenAI Responses requests, rendered as vLLM 0.33's stateless `/v1/responses/render` does.

A port of `ServingRender.render_responses_request` with `OnlineRenderer.render_responses` on its
non-Harmony path (`construct_input_messages`, `construct_tool_dicts`, `ResponsesRequest`'s
validators, `build_chat_params` and `to_sampling_params`). The render is stateless: history
comes only from `input`, and `previous_response_id` is refused as vLLM refuses it.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from render_service import adapter
from render_service.api import generated, requests, structured
from render_service.api.protocol import (
    OUTPUT_KIND_DELTA,
    OUTPUT_KIND_FINAL_ONLY,
    check_count,
    generate_request,
    handler_error,
    sampling_params_wire,
    union_error,
)
from render_service.api.schema import (
    INVALID,
    REQUIRED,
    AnyValue,
    Bool,
    Check,
    DictOf,
    ErrorList,
    Field,
    FieldType,
    Float,
    Int,
    ListOf,
    Literal,
    Loc,
    Model,
    Nullable,
    Str,
    Union,
    error,
)
from render_service.exceptions import BadRequestError, RequestValidationError
from render_service.render.pipeline import (
    MAX_MESSAGES,
    MAX_TOOLS,
    RenderContext,
    _check_lengths,
    _hoist_transfer_params,
    _merge_kwargs,
    _truncate,
    check_mm_kwargs,
    check_model,
    get_max_tokens,
    parser_adjustments,
    random_uuid,
    render_conversation,
    reused_prompt_ids,
    tool_dicts,
    validate_length_params,
)

_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
_INCLUDE = (
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
)
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_ROLES = ("user", "assistant", "system", "developer")
# Item types the render path turns into chat messages; anything else fails the input union.
_ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "custom_tool_call",
    "custom_tool_call_output",
)
_CUSTOM_TOOL_INPUT_KEY = "input"


def _input_error(items: Any) -> RequestValidationError:
    """`input` matching no member of `str | list[ResponseInputOutputItem]`."""
    return union_error("body.input", items)


def _validate_item(item: Any) -> None:
    if not isinstance(item, dict):
        raise _input_error([item])
    kind = item.get("type")
    if kind is None or kind == "message":
        if item.get("role") not in _ROLES or "content" not in item:
            raise _input_error([item])
        content = item["content"]
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(p, dict) for p in content)
        ):
            raise _input_error([item])
        if item["role"] == "assistant" and kind == "message" and isinstance(content, list) and not content:
            raise _input_error([item])
        return
    if kind not in _ITEM_TYPES:
        raise _input_error([item])
    if kind in ("function_call", "custom_tool_call"):
        fields = ("call_id", "name", "arguments" if kind == "function_call" else "input")
        if not all(isinstance(item.get(f), str) for f in fields):
            raise _input_error([item])
    elif kind in ("function_call_output", "custom_tool_call_output"):
        if not isinstance(item.get("call_id"), str) or "output" not in item:
            raise _input_error([item])
    elif kind == "reasoning":
        summary, content = item.get("summary"), item.get("content")
        if not isinstance(summary, list) or not all(isinstance(part, dict) for part in summary):
            raise _input_error([item])
        if content is not None and not (isinstance(content, list) and all(isinstance(p, dict) for p in content)):
            raise _input_error([item])


def _check_input(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`str | list[ResponseInputOutputItem]` as vLLM's schema validates it (every error of every
    member of openai's item union: api/generated.py), after our bound on the item count and vLLM's
    `input_item_parsing`; then the shapes this service renders (an item the schema admits but
    nothing here renders is refused)."""
    if isinstance(value, dict):  # input_item_parsing lists any other iterable (a dict: its keys)
        value = list(value)
    if not isinstance(value, list):
        return generated.field_type("responses.input").check(value, loc, errors)
    check_count(value, MAX_MESSAGES, "input items", "input")
    item_type = _input_item_type()
    found: ErrorList = []
    for index, item in enumerate(value):
        if not _preparsed(item):
            item_type.check(_with_reasoning_id(item), (*loc, index), found)
    if found:  # the `str` member's error, then the list member's
        errors.append(error("string_type", loc, "Input should be a valid string", value))
        errors.extend(found)
        return INVALID
    return value


@cache
def _input_item_type() -> FieldType:
    """`ResponseInputOutputItem` (with vLLM's before validator), the list member of `input`."""
    root = generated.field_type("responses.input")
    assert isinstance(root, Union) and isinstance(root.members[1], ListOf)
    return root.members[1].item


# vLLM's `input_item_parsing` builds these items as the output-item models before the union sees
# them (with an id, a status and empty annotations where missing); one that builds is accepted.
_PREPARSED = {
    "function_call": "ResponseFunctionToolCall",
    "reasoning": "ResponseReasoningItem",
    "message": "ResponseOutputMessage",  # an assistant message with a content list
}


def _with_reasoning_id(item: Any) -> Any:
    """A reasoning item as `input_item_parsing` leaves it: with an id (kept even when the item
    then fails to build)."""
    if isinstance(item, dict) and item.get("type") == "reasoning" and "id" not in item:
        return {**item, "id": "rs_"}
    return item


def _preparsed(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    candidate = _with_reasoning_id(item)
    if kind == "message":
        if item.get("role") != "assistant" or not isinstance(item.get("content"), list):
            return False
        candidate = {"id": "msg_", "status": "completed", **item}
        candidate["content"] = [
            {**part, "annotations": []}
            if isinstance(part, dict) and part.get("type") == "output_text" and "annotations" not in part
            else part
            for part in item["content"]
        ]
    model = _PREPARSED.get(kind) if isinstance(kind, str) else None
    if model is None:
        return False
    return generated.model_named("responses.input", model).check(candidate, (), []) is not INVALID


def _check_tools(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`list[Tool]` (openai's tool union, every member's errors), after our bound on its length."""
    if isinstance(value, list):
        check_count(value, MAX_TOOLS, "tools", "tools")
    return generated.field_type("responses.tools").check(value, loc, errors)


def _check_tool_choice(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`ToolChoice` (openai's union)."""
    return generated.field_type("responses.tool_choice").check(value, loc, errors)


def _check_text(value: Any, loc: Loc, errors: ErrorList) -> Any:
    """`ResponseTextConfig | None`."""
    return generated.field_type("responses.text").check(value, loc, errors)


REASONING = Model(
    "Reasoning",
    [
        Field("effort", Nullable(Literal(*_EFFORTS))),
        Field("generate_summary", AnyValue()),
        Field("summary", AnyValue()),
    ],
)


def _background(data: dict[str, Any], loc: Loc) -> None:
    """`validate_background`."""
    if data.get("background") and not data.get("store", True):
        raise handler_error("background can only be used when `store` is true", "background")


def _prompt(data: dict[str, Any], loc: Loc) -> None:
    """`validate_prompt`: prompt templates are not supported."""
    if data.get("prompt") is not None:
        raise handler_error("prompt template is not supported", "prompt")


def _custom_tool_format(data: dict[str, Any], loc: Loc) -> None:
    """`check_custom_tool_format`."""
    tools = data.get("tools")
    if not isinstance(tools, list):
        return
    for tool in tools:
        fmt = tool.get("format") if isinstance(tool, dict) else None
        if (
            isinstance(tool, dict)
            and tool.get("type") == "custom"
            and isinstance(fmt, dict)
            and fmt.get("type") == "grammar"
        ):
            raise handler_error(
                "Custom tools with a grammar format are not supported; only free-form text custom tools are accepted.",
                "tools",
            )


def _tool_usage(data: dict[str, Any], loc: Loc) -> None:
    """`check_tool_usage`: without tools, "auto" becomes "none"; "required" or a named tool is refused."""
    tools = data.get("tools")
    choice = data.get("tool_choice", "auto")
    has_tools = isinstance(tools, list) and len(tools) > 0
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if not has_tools:
        if choice in ("auto", "none"):
            data["tool_choice"] = "none"
        elif choice == "required":
            raise handler_error("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")
        elif named:
            raise handler_error("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
    elif named and not choice.get("name"):
        raise handler_error("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")


_OPT_STR = Nullable(Str())
_OPT_BOOL = Nullable(Bool())
RESPONSES_REQUEST = Model(
    "ResponsesRequest",
    [
        Field("background", _OPT_BOOL, False),
        Field("include", Nullable(ListOf(Literal(*_INCLUDE)))),
        Field(
            "input",
            Check(_check_input, {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}),
            REQUIRED,
        ),
        Field("instructions", _OPT_STR),
        Field("max_output_tokens", Nullable(Int())),
        Field("max_tool_calls", Nullable(Int())),
        Field("metadata", Nullable(DictOf(Str()))),
        Field("model", _OPT_STR),
        Field("logit_bias", Nullable(DictOf(Float()))),
        Field("parallel_tool_calls", _OPT_BOOL, True),
        Field("previous_response_id", _OPT_STR),
        Field("prompt", AnyValue({"type": "object"})),
        Field("reasoning", Nullable(REASONING)),
        Field("include_reasoning", Bool(), True),
        Field("service_tier", Literal("auto", "default", "flex", "scale", "priority"), "auto"),
        Field("store", _OPT_BOOL, True),
        Field("stream", _OPT_BOOL, False),
        Field("temperature", Nullable(Float())),
        Field("text", Check(_check_text, {"type": "object"})),
        Field(
            "tool_choice",
            Check(_check_tool_choice, {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]}),
            "auto",
        ),
        Field("tools", Check(_check_tools, {"type": "array", "items": {"type": "object"}}), []),
        Field("top_logprobs", Check(requests.top_logprobs, Int()), 0),
        Field("top_p", Nullable(Float())),
        Field("top_k", Nullable(Int())),
        Field("min_p", Nullable(Float())),
        Field("truncation", Nullable(Literal("auto", "disabled")), "disabled"),
        Field("user", _OPT_STR),
        Field("skip_special_tokens", _OPT_BOOL),
        Field("spaces_between_special_tokens", Bool(), True),
        Field("include_stop_str_in_output", Bool(), False),
        Field("presence_penalty", Nullable(Float(ge=-2.0, le=2.0))),
        Field("frequency_penalty", Nullable(Float(ge=-2.0, le=2.0))),
        Field("prompt_cache_key", _OPT_STR),
        Field("prompt_cache_options", AnyValue({"type": "object"})),
        Field("prompt_cache_retention", AnyValue({"enum": ["in_memory", "24h"]})),
        Field("safety_identifier", _OPT_STR),
        Field("watermarking", _OPT_BOOL),
        Field("request_id", Str()),
        Field("session_id", _OPT_STR),
        Field("media_io_kwargs", Nullable(DictOf(DictOf()))),
        Field("mm_processor_kwargs", Nullable(DictOf())),
        Field("priority", requests.INT64, 0),
        Field("mm_payload", Literal("tensors", "none"), "tensors"),
        Field("return_mm_kwargs", _OPT_BOOL),
        Field("cache_salt", Nullable(Str(min_length=1, max_length=1024))),
        Field("enable_response_messages", Bool(), False),
        Field("previous_input_messages", Nullable(ListOf(AnyValue({"type": "object"})))),
        Field("structured_outputs", Nullable(requests.STRUCTURED_OUTPUTS)),
        Field("repetition_penalty", Nullable(Float())),
        Field("seed", Nullable(requests.INT64)),
        Field("stop", requests.STOP, []),
        Field("stop_token_ids", Nullable(ListOf(Int())), []),
        Field("ignore_eos", Bool(), False),
        Field("vllm_xargs", requests.VLLM_XARGS),
        Field("kv_transfer_params", Nullable(DictOf())),
        Field("ec_transfer_params", Nullable(DictOf())),
        Field("chat_template_kwargs", Nullable(DictOf())),
    ],
    before=(
        _tool_usage,
        _custom_tool_format,
        _prompt,
        _background,
        requests.check_cache_salt_support,
        requests.apply_return_mm_kwargs_alias,
    ),
)


def validate_responses_request(body: dict[str, Any]) -> None:
    """`ResponsesRequest.model_validate(body)`, in place (its "before" validators, then the table)."""
    RESPONSES_REQUEST.validate(body)


# -- input items -> chat messages (responses/utils.py) -----------------------------------------


def _tool_call(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "custom_tool_call":
        arguments = json.dumps({_CUSTOM_TOOL_INPUT_KEY: item.get("input") or ""}, ensure_ascii=False)
        return {"id": item["call_id"], "function": {"name": item["name"], "arguments": arguments}, "type": "function"}
    name = item["name"]
    if item.get("namespace"):
        name = f"{item['namespace']}__{name}"
    return {"id": item["call_id"], "function": {"name": name, "arguments": item["arguments"]}, "type": "function"}


def _message_from_item(item: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """`_construct_message_from_response_item`: a new message, or None after merging into the
    previous assistant message. vLLM reads the items `input_item_parsing` built as output-item
    models (`_preparsed`) differently from those left as dicts."""
    assistant = previous if previous and previous.get("role") == "assistant" else None
    kind = item.get("type")
    built = _preparsed(item)
    if (kind == "function_call" and built) or kind == "custom_tool_call":
        call = _tool_call(item)
        if assistant:
            if assistant.get("tool_calls") is None:
                assistant["tool_calls"] = [call]
                return None
            assistant["tool_calls"].append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning" and built:
        if item.get("encrypted_content"):
            raise handler_error("Encrypted content is not supported.", "input")
        reasoning = ""
        if item.get("content"):
            reasoning = item["content"][0].get("text", "")
        elif item["summary"]:
            reasoning = item["summary"][0].get("text", "")
        if assistant and assistant.get("reasoning") is None:
            assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind == "message" and built:
        if not item["content"]:  # vLLM: an IndexError (a 500)
            raise handler_error("An assistant message item needs at least one content part.", "input")
        text = item["content"][0].get("text")
        if assistant and assistant.get("content") is None:
            assistant["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant":
        content = item.get("content")
        text = content if isinstance(content, str) else (content[0].get("text") if content else None)
        if text is not None:
            if assistant and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if "role" in item:
        return item
    raise handler_error(f"Unsupported input item type: {kind}", "input")


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`construct_input_messages` without history (the render endpoint is stateless)."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    converted: list[dict[str, Any]] = []
    for item in items:
        message = _message_from_item(dict(item), converted[-1] if converted else None)
        if message is not None:
            converted.append(message)
    return messages + converted


def _continue_final(items: Any) -> bool:
    """`should_continue_final_message`: a trailing in-progress assistant message or reasoning item."""
    if isinstance(items, str) or not items:
        return False
    last = items[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def _chat_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) in the chat shape; other tool types are not rendered."""
    tools = body.get("tools") or []
    out = []
    for tool in tools:
        if tool.get("type") == "function":
            out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
        elif tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if inner.get("type") == "function":
                    function = {k: v for k, v in inner.items() if k != "type"}
                    function["name"] = f"{tool['name']}__{inner['name']}"
                    out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def template_kwargs(ctx: RenderContext, body: dict[str, Any]) -> dict[str, Any]:
    """`build_chat_params(...).chat_template_kwargs` merged over the server defaults."""
    continue_final = _continue_final(body["input"])
    effort = (body.get("reasoning") or {}).get("effort")
    extra: dict[str, Any] = {
        "add_generation_prompt": not continue_final,
        "continue_final_message": continue_final,
        "reasoning_effort": effort,
    }
    user = body.get("chat_template_kwargs") or {}
    if effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    kwargs = _merge_kwargs(user, extra)
    defaults = ctx.settings.default_template_kwargs
    return _merge_kwargs(defaults, kwargs) if defaults else kwargs


def _structured_outputs(
    ctx: RenderContext, body: dict[str, Any], tools: list[dict[str, Any]] | None, tool_choice: Any
) -> dict[str, Any] | None:
    """`extract_structured_outputs()` after the tool parser's `adjust_request`."""
    own = body.get("structured_outputs")
    fmt = (body.get("text") or {}).get("format")
    chat_view: dict[str, Any] = {"parallel_tool_calls": body.get("parallel_tool_calls", True)}
    if fmt is not None and fmt.get("type") != "text":
        if own is not None:
            raise handler_error("Cannot specify both structured_outputs and text.format", "structured_outputs")
        if fmt["type"] == "json_object":
            chat_view["structured_outputs"] = {"json_object": True}
        elif fmt.get("schema") is not None:
            chat_view["structured_outputs"] = {"json": fmt["schema"]}
    elif own is not None:
        chat_view["structured_outputs"] = own
    if tools:
        chat_view["tools"] = tools
        chat_view["tool_choice"] = tool_choice
    settings = ctx.settings
    return structured.structured_outputs_wire(
        chat_view,
        chat=True,
        tool_parser=settings.tool_call_parser,
        enable_auto_tool_choice=settings.enable_auto_tool_choice,
        reasoning_parser=settings.reasoning_parser,
    )


def _sampling_values(
    ctx: RenderContext,
    body: dict[str, Any],
    max_tokens: int,
    structured_outputs: dict[str, Any] | None,
    skip_special_tokens: bool,
) -> dict[str, Any]:
    """`ResponsesRequest.to_sampling_params`."""
    defaults = ctx.model.default_sampling
    values: dict[str, Any] = {}
    for name, fallback in _DEFAULTS.items():
        value = body.get(name)
        values[name] = value if value is not None else defaults.get(name, fallback)
    for name, fallback in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        value = body.get(name)
        values[name] = value if value is not None else defaults.get(name, fallback)
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        values[name] = float(values[name])
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    extra_args = dict(body.get("vllm_xargs") or {})
    if body.get("kv_transfer_params"):
        extra_args["kv_transfer_params"] = body["kv_transfer_params"]
    if body.get("ec_transfer_params"):
        extra_args["ec_transfer_params"] = body["ec_transfer_params"]
    include = body.get("include") or []
    logit_bias = body.get("logit_bias")
    if logit_bias is not None:
        try:
            logit_bias = {int(k): min(100.0, max(-100.0, v)) for k, v in logit_bias.items()}
        except (TypeError, ValueError):
            invalid = [k for k in logit_bias if not str(k).lstrip("-").isdigit()]
            raise handler_error(
                f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
                "logit_bias",
                invalid,
            ) from None
    values.update(
        n=1,
        watermarking=body.get("watermarking"),
        seed=body.get("seed"),
        stop=stop,
        stop_token_ids=body.get("stop_token_ids", []),
        logprobs=body.get("top_logprobs", 0) if "message.output_text.logprobs" in include else None,
        prompt_logprobs=None,
        logprob_token_ids=None,
        ignore_eos=body.get("ignore_eos", False),
        max_tokens=max_tokens,
        min_tokens=0,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=body.get("spaces_between_special_tokens", True),
        include_stop_str_in_output=body.get("include_stop_str_in_output", False),
        output_kind=OUTPUT_KIND_DELTA if body.get("stream") else OUTPUT_KIND_FINAL_ONLY,
        stream_interval=None,
        structured_outputs=structured_outputs,
        logit_bias=logit_bias,
        bad_words=[],
        thinking_token_budget=None,
        allowed_token_ids=None,
        # from_optional keeps an empty dict, which the wire then carries as {}
        extra_args=extra_args,
        skip_clone=True,
        repetition_detection=None,
        routed_experts_prompt_start=0,
    )
    return values


def render_responses(
    ctx: RenderContext, body: dict[str, Any], fetched: dict[str, bytes] | None = None
) -> dict[str, Any]:
    """`fetched`: the bodies of the request's http(s) image URLs (fetched by the caller, async)."""
    validate_responses_request(body)
    check_model(ctx, body.get("model"))
    if body.get("previous_response_id") is not None:
        raise BadRequestError(
            "previous_response_id is not supported by the stateless render endpoint.",
            param="previous_response_id",
            error_type="invalid_request_error",
        )
    settings = ctx.settings
    if adapter.uses_adapter(settings):
        raise BadRequestError(
            "the Responses API cannot render yet with a parser that comes from vLLM "
            f"({', '.join(f'{flag} {name}' for flag, name in adapter.non_native(settings).items())}); "
            "use /v1/chat/completions/render."
        )
    if (
        not settings.trust_request_chat_template
        and (body.get("chat_template_kwargs") or {}).get("chat_template") is not None
    ):
        raise BadRequestError(
            "Chat template is passed with request, but --trust-request-chat-template is "
            "not set. Refused request with untrusted chat template."
        )
    tool_choice = body.get("tool_choice", "auto")
    tools = _chat_tools(body)
    rendered_tools = None
    if tools and not (tool_choice == "none" and settings.exclude_tools_when_tool_choice_none):
        rendered_tools = tool_dicts(tools)
    max_output = body.get("max_output_tokens")
    truncate = -1 if body.get("truncation", "disabled") != "disabled" else None
    validate_length_params(ctx, max_output, "max_output_tokens", truncate)
    kwargs = template_kwargs(ctx, body)
    messages = input_messages(body)
    check_mm_kwargs(ctx, body)  # vLLM's preprocess_chat checks them before templating
    chat_template = ctx.model.flag_chat_template or ctx.model.chat_template
    conversation = {
        "messages": messages,
        "mm_payload": body.get("mm_payload", "tensors"),
        "mm_processor_kwargs": body.get("mm_processor_kwargs"),
        # What vLLM's ChatParams carries for renderers that show it to the model (Kimi K3).
        "tools": tools,
        "tool_choice": tool_choice,
        "reasoning_effort": (body.get("reasoning") or {}).get("effort"),  # Harmony's system message
    }
    # Decode-side reuse, as for chat: forwarded prompt ids skip templating (vLLM's preprocess_chat).
    reused = reused_prompt_ids(ctx, {"kv_transfer_params": body.get("kv_transfer_params"), "messages": messages})
    if reused is not None:
        token_ids, offsets, features = _truncate(reused, truncate, None, ctx.model.max_model_len), None, None
        _check_lengths(ctx, len(token_ids), max_output, "max_output_tokens", truncate)
    else:
        token_ids, offsets, features = render_conversation(
            ctx, conversation, chat_template, rendered_tools, kwargs, max_output, "max_output_tokens", truncate, fetched
        )
    if not token_ids:
        raise BadRequestError("No token_ids rendered")

    chat_choice = _chat_tool_choice(tool_choice) if tools else None
    skip_special_tokens = body.get("skip_special_tokens")
    if skip_special_tokens is None:
        skip_special_tokens = ctx.model.default_sampling.get("skip_special_tokens", True)
    adjusted = parser_adjustments(ctx, bool(tools), chat_choice, skip_special_tokens)
    skip_special_tokens = bool(adjusted.skip_special_tokens)
    if adjusted.spaces_between_special_tokens is not None:
        body = {**body, "spaces_between_special_tokens": adjusted.spaces_between_special_tokens}
    structured_outputs = _structured_outputs(ctx, body, tools, chat_choice)
    max_tokens = get_max_tokens(ctx, None, len(token_ids), truncate)
    if max_output is not None:
        max_tokens = min(max_output, max_tokens)
    sampling = sampling_params_wire(_sampling_values(ctx, body, max_tokens, structured_outputs, skip_special_tokens))
    kv_params, ec_params = _hoist_transfer_params(sampling)
    return generate_request(
        request_id=body["request_id"] if body.get("request_id") is not None else f"resp_{random_uuid()}",
        token_ids=token_ids,
        features=features,
        sampling_params=sampling,
        model=body.get("model"),
        reasoning_parser_kwargs={"chat_template_kwargs": kwargs} if ctx.has_reasoning_parser else None,
        stream=bool(body.get("stream")),
        cache_salt=body.get("cache_salt"),
        priority=body.get("priority", 0),
        kv_transfer_params=kv_params,
        ec_transfer_params=ec_params,
        token_offsets=offsets,
    )
