"""Anthropic Messages requests, converted to the OpenAI chat request vLLM renders.

A port of vLLM 0.33's `AnthropicMessagesRequest` schema and of
`AnthropicServingMessages.to_chat_completion_request` (entrypoints/anthropic/): `/v1/messages/render`
converts the request and then runs chat render on the result, so the tokens are the ones
`/v1/messages` would send to the engine.

vLLM builds the chat request with its constructor and then assigns `stream`, `tools`,
`tool_choice`, `reasoning_effort`, ... as attributes, so the chat request's own validators never
see them; `render.render_chat(..., converted=True)` skips the chat schema for the same reason.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from render_service.api import requests
from render_service.api.protocol import MAX_STOP_STRINGS, check_count, validate_cache_salt
from render_service.api.schema import (
    REQUIRED,
    After,
    Bool,
    Check,
    DictOf,
    ErrorList,
    Field,
    Float,
    Int,
    ListOf,
    Literal,
    Loc,
    Model,
    Nullable,
    Str,
    Tagged,
    Union,
)
from render_service.exceptions import BadRequestError
from render_service.render.pipeline import MAX_MESSAGES, MAX_TOOLS, render_chat

BLOCK_TYPES = (
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
)
ROLES = ("user", "assistant", "system")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
_BILLING_HEADER = "x-anthropic-billing-header"


@dataclass(frozen=True)
class MessagesDefaults:
    """Per-model choices vLLM makes once: see `merge_inline_system` and `disabled_thinking_effort`."""

    merge_inline_system: bool
    disabled_thinking_effort: str


def merge_inline_system(chat_template: str | None) -> bool:
    """`_detect_merge_inline_system`: templates that reject a non-leading system message (Qwen's
    `loop.first` guard, or any template error in a bare sandbox) get inline system messages merged
    into the leading system prompt."""
    if not chat_template:
        return True
    try:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.from_string(chat_template).render(
            messages=[
                {"role": "system", "content": "t"},
                {"role": "user", "content": "t"},
                {"role": "system", "content": "t"},
                {"role": "user", "content": "t"},
            ],
            add_generation_prompt=False,
        )
    except jinja2.TemplateError:
        return True
    return False


# -- schema: vLLM's AnthropicMessagesRequest (entrypoints/anthropic/protocol.py) ---------------


def _reject_tool_changes(content: Any) -> None:
    """`_reject_tool_changes` (a ValueError: pydantic reports it as "Value error, ...")."""
    if isinstance(content, list):
        for block in content:
            if block["type"] in ("tool_addition", "tool_removal"):
                raise ValueError(f'{block["type"]} blocks are only allowed in messages with role "system"')


def _default_object_type(schema: dict[str, Any]) -> None:
    """`AnthropicTool.validate_input_schema`: a schema without "type" is an object schema."""
    schema.setdefault("type", "object")


TOOL = Model(
    "AnthropicTool",
    [
        Field("name", Str(), REQUIRED),
        Field("description", Nullable(Str())),
        Field("input_schema", After(DictOf(), _default_object_type), REQUIRED),
        Field("strict", Nullable(Bool())),
        Field("defer_loading", Nullable(Bool())),
    ],
)
TOOL_CHANGE = Nullable(
    Tagged(
        "type",
        {
            "tool_reference": Model(
                "AnthropicToolChangeReference",
                [Field("type", Literal("tool_reference"), REQUIRED), Field("name", Str(), REQUIRED)],
            ),
            "tool_definition": Model(
                "AnthropicToolChangeDefinition",
                [Field("type", Literal("tool_definition"), REQUIRED), Field("definition", TOOL, REQUIRED)],
            ),
        },
    )
)


def _validate_tool_change(block: dict[str, Any], loc: Loc) -> None:
    """`AnthropicContentBlock.validate_tool_change`."""
    if block["type"] not in ("tool_addition", "tool_removal"):
        return
    tool = block.get("tool")
    if tool is None:
        raise ValueError(f"tool is required for {block['type']} blocks")
    if block["type"] == "tool_removal" and tool["type"] != "tool_reference":
        raise ValueError("tool_removal only accepts a tool_reference")


_OPT_STR = Nullable(Str())
BLOCK = Model(
    "AnthropicContentBlock",
    [
        Field("type", Literal(*BLOCK_TYPES), REQUIRED),
        Field("text", _OPT_STR),
        Field("source", Nullable(DictOf())),
        Field("id", _OPT_STR),
        Field("tool_use_id", _OPT_STR),
        Field("name", _OPT_STR),
        Field("input", Nullable(DictOf())),
        Field("content", Nullable(Union(Str(), ListOf(DictOf())))),
        Field("is_error", Nullable(Bool())),
        Field("tool_name", _OPT_STR),
        Field("thinking", _OPT_STR),
        Field("signature", _OPT_STR),
        Field("data", _OPT_STR),
        Field("tool", TOOL_CHANGE),
    ],
    after=(_validate_tool_change,),
)
CONTENT = Union(Str(), ListOf(BLOCK))


def _validate_tool_change_role(message: dict[str, Any], loc: Loc) -> None:
    """`AnthropicMessage.validate_tool_change_role`."""
    if message["role"] != "system":
        _reject_tool_changes(message["content"])


MESSAGE = Model(
    "AnthropicMessage",
    [Field("role", Literal(*ROLES), REQUIRED), Field("content", CONTENT, REQUIRED)],
    after=(_validate_tool_change_role,),
)


def _model_required(value: str) -> None:
    if not value:
        raise ValueError("Model is required")


def _max_tokens_positive(value: int) -> None:
    if value <= 0:
        raise ValueError("max_tokens must be positive")


def _bounded_list(limit: int, noun: str, inner: ListOf) -> Check:
    """Our bound on a list's length (vLLM has none), checked before its items."""

    def check(value: Any, loc: Loc, errors: ErrorList) -> Any:
        if isinstance(value, list):
            check_count(value, limit, noun, noun)
        return inner.check(value, loc, errors)

    return Check(check, inner)


def _validate_thinking_budget(body: dict[str, Any], loc: Loc) -> None:
    """`AnthropicMessagesRequest.validate_thinking_budget` (P/D prefill legs are not checked)."""
    kv = body.get("kv_transfer_params")
    if kv and kv.get("do_remote_decode"):
        return
    thinking = body.get("thinking")
    if thinking is not None and thinking["type"] == "enabled" and thinking["budget_tokens"] >= body["max_tokens"]:
        raise ValueError("thinking.budget_tokens must be less than max_tokens")


def _apply_return_mm_kwargs_alias(body: dict[str, Any], loc: Loc) -> None:
    if body.get("return_mm_kwargs") is False and "mm_payload" not in body:
        body["mm_payload"] = "none"


def _validate_tool_choice_name(choice: dict[str, Any], loc: Loc) -> None:
    """`AnthropicToolChoice.validate_name_required_for_tool`."""
    if choice["type"] == "tool" and not choice.get("name"):
        raise ValueError("tool_choice.name is required when type is 'tool'")


_DISPLAY = Nullable(Literal("summarized", "omitted", "updates"))
MESSAGES_REQUEST = Model(
    "AnthropicMessagesRequest",
    [
        Field("model", After(Str(), _model_required), REQUIRED),
        Field("messages", _bounded_list(MAX_MESSAGES, "messages", ListOf(MESSAGE)), REQUIRED),
        Field("max_tokens", After(Int(), _max_tokens_positive), REQUIRED),
        Field("metadata", Nullable(DictOf())),
        Field(
            "output_config",
            Nullable(
                Model(
                    "AnthropicOutputConfig",
                    [
                        Field("effort", Nullable(Literal(*EFFORTS))),
                        Field(
                            "format",
                            Nullable(
                                Model(
                                    "AnthropicJsonOutputFormat",
                                    [
                                        Field("schema", Nullable(DictOf())),
                                        Field("type", Literal("json_schema"), "json_schema"),
                                    ],
                                )
                            ),
                        ),
                    ],
                )
            ),
        ),
        Field(
            "thinking",
            Nullable(
                Tagged(
                    "type",
                    {
                        "enabled": Model(
                            "AnthropicThinkingConfigEnabled",
                            [
                                Field("type", Literal("enabled"), REQUIRED),
                                Field("budget_tokens", Int(ge=1024), REQUIRED),
                                Field("display", _DISPLAY),
                            ],
                        ),
                        "disabled": Model(
                            "AnthropicThinkingConfigDisabled", [Field("type", Literal("disabled"), REQUIRED)]
                        ),
                        "adaptive": Model(
                            "AnthropicThinkingConfigAdaptive",
                            [Field("type", Literal("adaptive"), REQUIRED), Field("display", _DISPLAY)],
                        ),
                    },
                )
            ),
        ),
        Field("stop_sequences", Nullable(ListOf(Str(), max_length=MAX_STOP_STRINGS))),
        Field("stream", Nullable(Bool()), False),
        Field("system", Nullable(After(CONTENT, _reject_tool_changes))),
        Field("temperature", Nullable(Float())),
        Field(
            "tool_choice",
            Nullable(
                Model(
                    "AnthropicToolChoice",
                    [
                        Field("type", Literal("auto", "any", "tool", "none"), REQUIRED),
                        Field("name", _OPT_STR),
                        Field("disable_parallel_tool_use", Nullable(Bool())),
                    ],
                    after=(_validate_tool_choice_name,),
                )
            ),
        ),
        Field("tools", Nullable(_bounded_list(MAX_TOOLS, "tools", ListOf(TOOL)))),
        Field("top_k", Nullable(Int())),
        Field("top_p", Nullable(Float())),
        Field("mm_payload", Literal("tensors", "none"), "tensors"),
        Field("return_mm_kwargs", Nullable(Bool())),
        Field("cache_salt", Nullable(Str(min_length=1, max_length=1024))),
        Field("watermarking", Nullable(Bool())),
        Field("kv_transfer_params", Nullable(DictOf())),
        Field("ec_transfer_params", Nullable(DictOf())),
        Field("vllm_xargs", requests.VLLM_XARGS),
        Field("chat_template_kwargs", Nullable(DictOf())),
    ],
    before=(_apply_return_mm_kwargs_alias,),
    after=(_validate_thinking_budget,),
)


def validate_messages_request(body: dict[str, Any]) -> None:
    """`AnthropicMessagesRequest.model_validate(body)`, in place; then the cache salt check the
    chat request built from it runs."""
    MESSAGES_REQUEST.validate(body)
    validate_cache_salt(body.get("cache_salt"))


# -- conversion -----------------------------------------------------------------------------


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):  # tool_result items are free-form dicts in vLLM's schema
        source = {}
    if source.get("type") == "url":
        return source.get("url", "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _system_text(content: Any) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    parts = [
        b["text"]
        for b in content
        if b["type"] == "text" and b.get("text") and not b["text"].startswith(_BILLING_HEADER)
    ]
    return "".join(parts) if parts else None


def _user_tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    text = ""
    images: list[str] = []
    references: list[dict[str, Any]] = []
    content = block.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for item in content:
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        for position, item_text in enumerate(texts):
            if not isinstance(item_text, str):  # vLLM's join raises a TypeError, answered with a 400
                raise BadRequestError(
                    f"sequence item {position}: expected str instance, {type(item_text).__name__} found"
                )
        text = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text or ""})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references:
        out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": references})


def _convert_message(message: dict[str, Any], out: list[dict[str, Any]]) -> None:
    role = message["role"]
    converted: dict[str, Any] = {"role": role}
    content = message["content"]
    if isinstance(content, str):
        converted["content"] = content
    else:
        parts: list[dict[str, Any]] = []
        tool_calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for block in content:
            kind = block["type"]
            if kind == "text" and block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image" and block.get("source"):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
            elif kind == "thinking" and block.get("thinking") is not None:
                reasoning.append(block["thinking"])
            elif kind == "tool_use":
                tool_calls.append(
                    {
                        "id": block.get("id") or f"call_{int(time.time())}",
                        "type": "function",
                        # json.dumps, not orjson: the template sees Python's separators and ASCII escapes
                        "function": {
                            "name": block.get("name") or "",
                            "arguments": json.dumps(block.get("input") or {}),
                        },
                    }
                )
            elif kind == "tool_result":
                if role == "user":
                    _user_tool_result(block, out)
                else:
                    result = block.get("content")
                    parts.append({"type": "text", "text": f"Tool result: {str(result) if result else ''}"})
        if reasoning:
            converted["reasoning"] = "".join(reasoning)
        if tool_calls:
            converted["tool_calls"] = tool_calls
        if parts:
            converted["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if not (role == "user" and "content" not in converted):
        out.append(converted)


def _resolve_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """`_resolve_tools`: tool_addition / tool_removal blocks applied to `tools`, in order."""
    changes = [
        block
        for message in body["messages"]
        if not isinstance(message["content"], str)
        for block in message["content"]
        if block["type"] in ("tool_addition", "tool_removal")
    ]
    if not changes:
        return body.get("tools")
    tools = {tool["name"]: tool for tool in body.get("tools") or []}
    removed: set[str] = set()
    for block in changes:
        change = block["tool"]
        if change["type"] == "tool_definition":
            name = change["definition"]["name"]
            tools[name] = change["definition"]
        else:
            name = change["name"]
            if name not in tools:
                raise BadRequestError(f"{block['type']} references tool {name!r}, which is not declared in tools")
            if block["type"] == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in tools.items() if name not in removed]


def to_chat_request(body: dict[str, Any], defaults: MessagesDefaults) -> dict[str, Any]:
    """`AnthropicServingMessages.to_chat_completion_request` on a validated request."""
    merge = defaults.merge_inline_system
    messages: list[dict[str, Any]] = []
    system_parts: list[str] = []
    system = body.get("system")
    if system:
        if isinstance(system, str):
            system_parts.append(system)
        else:
            system_parts += [
                b["text"]
                for b in system
                if b["type"] == "text" and b.get("text") and not b["text"].startswith(_BILLING_HEADER)
            ]
    if merge:
        for message in body["messages"]:
            if message["role"] == "system" and (text := _system_text(message["content"])):
                system_parts.append(text)
    if system_parts:
        messages.append({"role": "system", "content": "".join(system_parts)})
    for message in body["messages"]:
        if message["role"] == "system":
            if not merge and (text := _system_text(message["content"])):
                messages.append({"role": "system", "content": text})
            continue
        _convert_message(message, messages)

    chat: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body["max_tokens"],
        "max_completion_tokens": body["max_tokens"],
    }
    for source, target in (
        ("stop_sequences", "stop"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("watermarking", "watermarking"),
        ("cache_salt", "cache_salt"),
        ("kv_transfer_params", "kv_transfer_params"),
        ("ec_transfer_params", "ec_transfer_params"),
        ("vllm_xargs", "vllm_xargs"),
        ("chat_template_kwargs", "chat_template_kwargs"),
        ("mm_payload", "mm_payload"),
    ):
        if body.get(source) is not None:
            chat[target] = body[source]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    output_config = body.get("output_config") or {}
    fmt = output_config.get("format")
    if fmt and fmt.get("schema"):
        chat["response_format"] = {
            "type": fmt.get("type", "json_schema"),
            "json_schema": {"name": fmt.get("type", "json_schema"), "schema": fmt["schema"]},
        }
    if output_config.get("effort") is not None:
        chat["reasoning_effort"] = output_config["effort"]
    thinking = body.get("thinking")
    if thinking is not None:
        if thinking["type"] == "disabled":
            chat["reasoning_effort"] = defaults.disabled_thinking_effort
        elif thinking["type"] == "enabled":
            chat["thinking_token_budget"] = thinking["budget_tokens"]
    tool_choice = body.get("tool_choice")
    chat["tool_choice"] = None
    if tool_choice is not None:
        chat["parallel_tool_calls"] = not tool_choice.get("disable_parallel_tool_use")
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(tool_choice["type"]) or {
            "type": "function",
            "function": {"name": tool_choice.get("name")},
        }
    tools = _resolve_tools(body)
    if tools is not None:
        converted = []
        for tool in tools:
            schema = tool["input_schema"]
            if "type" not in schema:
                schema["type"] = "object"  # AnthropicTool's validator, which appends the key
            converted.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description"),
                        "parameters": schema,
                        "strict": tool.get("strict"),
                        "defer_loading": tool.get("defer_loading"),
                    },
                }
            )
        if chat["tool_choice"] is None:
            chat["tool_choice"] = "auto"
        chat["tools"] = converted
    return chat


# -- render ---------------------------------------------------------------------------------


def messages_defaults(ctx: Any) -> MessagesDefaults:
    """Worked out once per model, as vLLM does at start-up and on the first disabled-thinking request."""
    defaults = ctx.memo.get("messages_defaults")
    if defaults is None:
        template = ctx.model.flag_chat_template or ctx.model.chat_template
        if ctx.model.renderer_mode != "hf":  # vLLM probes only --chat-template for other renderers
            template = ctx.model.flag_chat_template
        defaults = MessagesDefaults(merge_inline_system(template), _disabled_thinking_effort(ctx))
        ctx.memo["messages_defaults"] = defaults
    return defaults


def _disabled_thinking_effort(ctx: Any) -> str:
    """`DisabledThinkingEffortResolver._probe`: "none" unless the template rejects it or renders it
    like a real effort (then the model cannot turn thinking off, and "low" is the closest)."""

    def prompt(effort: str) -> list[int] | None:
        try:
            return render_chat(ctx, {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort})[
                "token_ids"
            ]
        except Exception:
            return None

    none_prompt = prompt("none")
    if none_prompt is None or any(prompt(effort) == none_prompt for effort in EFFORTS):
        return "low"
    return "none"


def convert(ctx: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Validate an Anthropic Messages request and convert it to the chat request vLLM renders."""
    validate_messages_request(body)
    return to_chat_request(body, messages_defaults(ctx))


def render_messages(
    ctx: Any, body: dict[str, Any], header_request_id: str | None = None, fetched: dict[str, bytes] | None = None
) -> dict[str, Any]:
    """`ServingRender.render_messages_request`: convert, then chat render (`fetched`: the bodies of
    the request's http(s) image URLs)."""
    return render_chat(ctx, convert(ctx, body), header_request_id, fetched, converted=True)
