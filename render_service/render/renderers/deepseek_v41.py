"""The `deepseek_v41` renderer: DeepSeek V4.1's prompt encoding (no chat template).

Written from the semantics of vLLM 0.33's `tokenizers/deepseek_v41.py` and
`deepseek_v41_encoding.py`. Unlike V4 it reads the request messages themselves (text parts
joined by a blank line), and:

- thinking defaults on; `reasoning_effort` is low/high/xhigh/max or an integer 1-100
  (default high; "none" turns thinking off; anything else is a 400) and becomes a numeric
  "Reasoning Effort" preamble; the conversation then opens with `<｜System｜>`;
- a system message after the first is a new turn (`<｜System｜>...`) and counts as a user turn;
  a user turn holding only tool results does not;
- tool calls use `<｜DSML｜ calls>`, `<｜DSML｜ invoke ...>`, `<｜DSML｜ parameter ...>`, and
  arguments that are not a JSON object are wrapped as `{"arguments": ...}`.
"""

from __future__ import annotations

import json
from typing import Any

from render_service.render.renderers import deepseek_v4 as v4
from render_service.render.renderers import dsml
from render_service.render.renderers.base import ChatInput, RenderedPrompt

SYSTEM = "<｜System｜>"
EFFORT_LEVELS = {"low": 50, "high": 75, "xhigh": 75, "max": 100}
_ROLES = ("system", "developer", "user", "assistant", "tool")
_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image_url", "input_image", "image_pil")

_TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml.DSML} calls>" block like the following:

<{dsml.DSML} calls>
<{dsml.DSML} invoke name="$TOOL_NAME">
<{dsml.DSML} parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml.DSML} parameter>
...
</{dsml.DSML} invoke>
<{dsml.DSML} invoke name="$TOOL_NAME2">
...
</{dsml.DSML} invoke>
</{dsml.DSML} calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {dsml.THINK_START}), you MUST output your complete reasoning inside {dsml.THINK_START}...{dsml.THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {dsml.THINK_END} with tool calls or final response.

### Available Tool Schemas

"""


def render_tools_section(tools: list[dict[str, Any]]) -> str:
    schemas = "\n".join(dsml.to_json(function) for function in dsml.tool_functions(tools))
    return f"{_TOOLS_SECTION}{schemas}{v4._TOOLS_FOOTER}"


# Rendered once per tool list (dsml.ToolBlocks).
tools_section = dsml.ToolBlocks(render_tools_section)


def tolerant_arguments(arguments: Any) -> dict[str, Any]:
    """An object as is; a JSON string (even one encoded twice) decoded; anything else wrapped."""
    value = arguments
    for _ in range(2):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            break
    return value if isinstance(value, dict) else {"arguments": arguments}


def _reject_placeholder(text: Any) -> None:
    if isinstance(text, str) and dsml.IMAGE_PLACEHOLDER in text:
        raise dsml.EncodingError(
            f"Message text contains image special token {dsml.IMAGE_PLACEHOLDER!r}; "
            "provide images as image content parts."
        )


def normalize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request messages -> encoder messages: roles checked, `reasoning` copied to
    `reasoning_content`, content parts flattened (text joined by a blank line)."""
    result = []
    for original in messages:
        message = dict(original)
        role = message.get("role")
        if role not in _ROLES:
            raise dsml.EncodingError(f"Invalid role: {role}")
        if "reasoning" in message:
            message["reasoning_content"] = message["reasoning"]
        _reject_placeholder(message.get("reasoning_content"))
        content = message.get("content")
        if isinstance(content, str):
            _reject_placeholder(content)
        elif isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type")
                if kind in _TEXT_PARTS:
                    _reject_placeholder(part.get("text"))
                    parts.append(part.get("text", ""))
                elif kind in _IMAGE_PARTS:
                    parts.append(dsml.IMAGE_PLACEHOLDER)
                else:
                    raise dsml.EncodingError(f"DeepSeek V4.1 supports text and image content only; got {kind!r}")
            message["content"] = "\n\n".join(parts)
        result.append(message)
    return result


def merge_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As V4, but a user turn keeps all its fields and its own blocks when it has them."""
    merged: list[dict[str, Any]] = []
    for original in messages:
        message = dict(original)
        role = message.get("role")
        previous = merged[-1] if merged else None
        open_user = previous is not None and previous.get("role") == "user" and "content_blocks" in previous
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id", ""),
                "content": message.get("content", ""),
            }
            if open_user:
                previous["content_blocks"].append(block)  # type: ignore[index]
            else:
                merged.append({"role": "user", "content_blocks": [block]})
        elif role == "user":
            blocks = message.get("content_blocks")
            if blocks is None:
                blocks = [{"type": "text", "text": message.get("content", "")}]
            if open_user and previous.get("task") is None:  # type: ignore[union-attr]
                previous["content_blocks"].extend(blocks)  # type: ignore[index]
            else:
                message["content_blocks"] = list(blocks)
                merged.append(message)
        else:
            merged.append(message)
    return merged


def last_user_index(messages: list[dict[str, Any]]) -> int:
    """The last user/developer turn, or a system message after the first; a user turn with
    only tool results does not count."""
    for index in range(len(messages) - 1, -1, -1):
        role = messages[index].get("role")
        if role in ("user", "developer") or (role == "system" and index > 0):
            blocks = messages[index].get("content_blocks")
            if blocks and not any(b.get("type") in ("text", "image", "image_url") for b in blocks):
                continue
            return index
    return -1


class _Encoder(v4._Encoder):
    def __init__(self, messages: list[dict[str, Any]], thinking: bool, drop: bool, effort: str | int) -> None:
        self.messages = messages
        self.thinking = thinking
        self.drop = drop
        budget = EFFORT_LEVELS[effort] if isinstance(effort, str) else effort
        self.preamble = (
            f"Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
            if thinking
            else ""
        )
        self.last_user = last_user_index(messages)

    def message(self, index: int) -> str:
        message = self.messages[index]
        role = message.get("role")
        content = message.get("content")
        tools = message.get("tools")
        response_format = message.get("response_format")
        preamble = self.preamble if index == 0 else ""
        text = SYSTEM if index == 0 and (preamble or role == "system") else ""
        text += preamble
        if role == "system":
            if index > 0:
                text += SYSTEM
            text += content or ""
            if tools:
                text += "\n\n" + tools_section(tools)
            if response_format:
                text += dsml.response_format_block(response_format)
        elif role == "developer":
            if not content:
                raise dsml.EncodingError(f"Invalid message for role `{role}`: {message}")
            text += dsml.USER + content
            if tools:
                text += "\n\n" + tools_section(tools)
            if response_format:
                text += dsml.response_format_block(response_format)
        elif role == "user":
            blocks = message.get("content_blocks")
            text += dsml.USER + (v4.user_blocks_text(blocks, with_images=False) if blocks else content or "")
        elif role == "latest_reminder":
            text += f"{dsml.LATEST_REMINDER}{content}"
        elif role == "assistant":
            text += self.assistant(index, message, content)
        else:
            raise dsml.EncodingError(f"Unknown role: {role}")
        return text + self.transition(index)

    def assistant(self, index: int, message: dict[str, Any], content: Any) -> str:
        calls = message.get("tool_calls")
        calls_text = (
            dsml.tool_calls_markup(calls, " calls", " invoke", " parameter", decode=tolerant_arguments) if calls else ""
        )
        thinking_text = ""
        after_task = index > 0 and self.messages[index - 1].get("task") is not None
        if self.thinking and not after_task and (not self.drop or index > self.last_user):
            thinking_text = (message.get("reasoning_content") or "") + dsml.THINK_END
        end = "" if message.get("wo_eos", False) else dsml.EOS
        return f"{thinking_text}{content or ''}{calls_text}{end}"

    def transition(self, index: int) -> str:
        messages = self.messages
        following = messages[index + 1].get("role") if index + 1 < len(messages) else None
        if following is not None and following not in ("assistant", "latest_reminder"):
            return ""
        message = messages[index]
        if message.get("task") is not None:
            return v4.task_suffix(message["task"], self.thinking)
        role = message.get("role")
        if role in ("user", "developer") or (role == "system" and index > 0):
            return dsml.ASSISTANT + self.think_marker(index)
        return ""


def encode(messages: list[dict[str, Any]], thinking: bool, drop_thinking: bool, effort: str | int) -> str:
    messages = v4.order_tool_results(merge_tool_results(messages))
    drop = drop_thinking and not any(m.get("tools") for m in messages)
    if thinking and drop:
        messages = v4.drop_reasoning(messages, "reasoning_content", last_user_index(messages))
    return _Encoder(messages, thinking, drop, effort).encode()


def _with_parsed_arguments(messages: list[dict[str, Any]], conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request messages with each tool call's arguments as the conversation has them (an
    object; `{}` for anything but a JSON object): vLLM parses them in place, in call dicts the
    request messages share, before this encoder reads the messages."""
    if len(messages) != len(conversation):
        return messages
    merged = []
    for message, parsed in zip(messages, conversation, strict=True):
        if message.get("role") == "assistant" and parsed.get("tool_calls") and message.get("tool_calls"):
            message = dict(message, tool_calls=parsed["tool_calls"])
        merged.append(message)
    return merged


class DeepseekV41Renderer(v4.DeepseekV4Renderer):
    mode: str = "deepseek_v41"

    def render(self, chat: ChatInput) -> RenderedPrompt:
        conversation = normalize(_with_parsed_arguments(chat.messages, chat.conversation))
        if chat.tools:
            system = next((m for m in conversation if m["role"] == "system"), None)
            if system is None:
                system = {"role": "system", "content": ""}
                conversation.insert(0, system)
            system["tools"] = chat.tools
        thinking = dsml.thinking_requested(chat.kwargs, default=True)
        effort = chat.kwargs.get("reasoning_effort")
        if effort == "none":
            thinking, effort = False, None
        if effort is None:
            effort = "high"
        if not ((type(effort) is int and 1 <= effort <= 100) or (isinstance(effort, str) and effort in EFFORT_LEVELS)):
            raise dsml.EncodingError(
                "DeepSeek V4.1 reasoning_effort must be low, high, xhigh, max, "
                "or an integer within [1, 100] in chat_template_kwargs"
            )
        prompt = encode(conversation, thinking, bool(chat.kwargs.get("drop_thinking", True)), effort)
        return RenderedPrompt(text=prompt)
