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

from render_service.api.protocol import (
    MAX_STOP_STRINGS,
    bounded_list,
    check_type,
    opt_bool,
    opt_dict,
    opt_float,
    opt_int,
    schema_error,
    str_list,
    union_error,
    validate_cache_salt,
    validate_mm_payload,
)
from render_service.exceptions import BadRequestError, RequestValidationError
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


# -- schema ---------------------------------------------------------------------------------


def _literal(value: Any, allowed: tuple[str, ...], param: str) -> None:
    if value not in allowed:
        quoted = [f"'{a}'" for a in allowed]
        expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise schema_error(param, f"Input should be {expected}", value)


def _validate_tool(tool: Any, param: str) -> None:
    if not isinstance(tool, dict):
        raise schema_error(param, "Input should be a valid dictionary or instance of AnthropicTool", tool)
    if not isinstance(tool.get("name"), str):
        raise schema_error(
            f"{param}.name",
            "Field required" if "name" not in tool else "Input should be a valid string",
            tool.get("name"),
        )
    if "input_schema" not in tool:
        raise schema_error(f"{param}.input_schema", "Field required", tool)
    if not isinstance(tool["input_schema"], dict):
        raise schema_error(f"{param}.input_schema", "Input should be a valid dictionary", tool["input_schema"])
    check_type(tool, "description", (str,), prefix=param)
    opt_bool(tool, "strict", prefix=param)
    opt_bool(tool, "defer_loading", prefix=param)


def _validate_block(block: Any, param: str) -> None:
    if not isinstance(block, dict):
        raise schema_error(param, "Input should be a valid dictionary or instance of AnthropicContentBlock", block)
    _literal(block.get("type"), BLOCK_TYPES, f"{param}.type")
    for name in ("text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"):
        check_type(block, name, (str,), prefix=param)
    for name in ("source", "input"):
        opt_dict(block, name, prefix=param)
    opt_bool(block, "is_error", prefix=param)
    content = block.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list) or not all(isinstance(item, dict) for item in content):
            raise schema_error(f"{param}.content", "Input should be a valid string", content)
    if block["type"] in ("tool_addition", "tool_removal"):
        tool = block.get("tool")
        if tool is None:
            raise validator_value_error(param, f"tool is required for {block['type']} blocks", block)
        if not isinstance(tool, dict) or tool.get("type") not in ("tool_reference", "tool_definition"):
            raise schema_error(
                f"{param}.tool",
                "Input tag does not match any of the expected tags: 'tool_reference', 'tool_definition'",
                tool,
            )
        if tool["type"] == "tool_reference":
            if not isinstance(tool.get("name"), str):
                raise schema_error(f"{param}.tool.tool_reference.name", "Field required", tool)
        else:
            if "definition" not in tool:
                raise schema_error(f"{param}.tool.tool_definition.definition", "Field required", tool)
            _validate_tool(tool["definition"], f"{param}.tool.tool_definition.definition")
        if block["type"] == "tool_removal" and tool["type"] != "tool_reference":
            raise validator_value_error(param, "tool_removal only accepts a tool_reference", block)


def validator_value_error(param: str, message: str, value: Any) -> Any:
    """A ValueError raised in a pydantic validator: reported as "Value error, <message>"."""
    return schema_error(param, f"Value error, {message}", value)


def _validate_content(content: Any, param: str) -> None:
    """`str | list[AnthropicContentBlock]`: pydantic reports a failing union at the field itself
    first ("Input should be a valid string"), then each member's errors."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise union_error(param, content)
    for index, block in enumerate(content):
        try:
            _validate_block(block, f"{param}.{index}")
        except RequestValidationError:
            raise union_error(param, content) from None


def _reject_tool_changes(content: Any, param: str) -> None:
    if isinstance(content, list):
        for block in content:
            if block["type"] in ("tool_addition", "tool_removal"):
                raise validator_value_error(
                    param, f'{block["type"]} blocks are only allowed in messages with role "system"', content
                )


def validate_messages_request(body: dict[str, Any]) -> None:
    """The schema and validators of vLLM's `AnthropicMessagesRequest`, in pydantic's field order."""
    if "model" not in body:
        raise schema_error("body.model", "Field required", body)
    check_type(body, "model", (str,), nullable=False)
    if "messages" not in body:
        raise schema_error("body.messages", "Field required", body)
    messages = bounded_list(body["messages"], MAX_MESSAGES, "messages")
    for index, message in enumerate(messages):
        param = f"body.messages.{index}"
        if not isinstance(message, dict):
            raise schema_error(param, "Input should be a valid dictionary or instance of AnthropicMessage", message)
        _literal(message.get("role"), ROLES, f"{param}.role")
        if "content" not in message:
            raise schema_error(f"{param}.content", "Field required", message)
        _validate_content(message["content"], f"{param}.content")
        if message["role"] != "system":
            _reject_tool_changes(message["content"], param)
    if "max_tokens" not in body:
        raise schema_error("body.max_tokens", "Field required", body)
    opt_int(body, "max_tokens")
    opt_dict(body, "metadata")
    output_config = opt_dict(body, "output_config")
    if output_config:
        if output_config.get("effort") is not None:
            _literal(output_config["effort"], EFFORTS, "body.output_config.effort")
        fmt = output_config.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict):
                raise schema_error("body.output_config.format", "Input should be a valid dictionary", fmt)
            if fmt.get("type", "json_schema") != "json_schema":
                _literal(fmt.get("type"), ("json_schema",), "body.output_config.format.type")
            opt_dict(fmt, "schema", prefix="body.output_config.format")
    thinking = opt_dict(body, "thinking")
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive"):
            raise schema_error(
                "body.thinking",
                "Unable to extract tag using discriminator 'type'"
                if kind is None
                else f"Input tag '{kind}' found using 'type' does not match any of the expected "
                "tags: 'enabled', 'disabled', 'adaptive'",
                thinking,
            )
        if kind == "enabled":
            if "budget_tokens" not in thinking:
                raise schema_error("body.thinking.enabled.budget_tokens", "Field required", thinking)
            budget = opt_int(thinking, "budget_tokens", prefix="body.thinking.enabled")
            if budget is not None and budget < 1024:
                raise schema_error(
                    "body.thinking.enabled.budget_tokens", "Input should be greater than or equal to 1024", budget
                )
    stops = body.get("stop_sequences")
    if stops is not None:
        str_list(stops, "body.stop_sequences")
        if len(stops) > MAX_STOP_STRINGS:
            raise schema_error(
                "body.stop_sequences",
                f"List should have at most {MAX_STOP_STRINGS} items after validation, not {len(stops)}",
                stops,
            )
    opt_bool(body, "stream")
    system = body.get("system")
    if system is not None:
        _validate_content(system, "body.system")
    opt_float(body, "temperature")
    tool_choice = opt_dict(body, "tool_choice")
    if tool_choice is not None:
        _literal(tool_choice.get("type"), ("auto", "any", "tool", "none"), "body.tool_choice.type")
        check_type(tool_choice, "name", (str,), prefix="body.tool_choice")
        opt_bool(tool_choice, "disable_parallel_tool_use", prefix="body.tool_choice")
        if tool_choice["type"] == "tool" and not tool_choice.get("name"):
            raise validator_value_error(
                "body.tool_choice", "tool_choice.name is required when type is 'tool'", tool_choice
            )
    tools = body.get("tools")
    if tools is not None:
        bounded_list(tools, MAX_TOOLS, "tools")
        for index, tool in enumerate(tools):
            _validate_tool(tool, f"body.tools.{index}")
    opt_int(body, "top_k")
    opt_float(body, "top_p")
    validate_mm_payload(body)
    validate_cache_salt(body.get("cache_salt"))
    opt_bool(body, "watermarking")
    for name in ("kv_transfer_params", "ec_transfer_params", "vllm_xargs", "chat_template_kwargs"):
        opt_dict(body, name)
    # field validators, then model validators
    if not body["model"]:
        raise validator_value_error("body.model", "Model is required", body["model"])
    if body["max_tokens"] <= 0:
        raise validator_value_error("body.max_tokens", "max_tokens must be positive", body["max_tokens"])
    _reject_tool_changes(system, "body.system")
    kv = body.get("kv_transfer_params")
    if (
        not (kv and kv.get("do_remote_decode"))
        and thinking is not None
        and thinking.get("type") == "enabled"
        and thinking["budget_tokens"] >= body["max_tokens"]
    ):
        raise validator_value_error("body", "thinking.budget_tokens must be less than max_tokens", body)


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
