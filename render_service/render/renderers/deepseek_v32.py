"""The `deepseek_v32` renderer: DeepSeek V3.2's prompt encoding (no chat template).

Written from the semantics of vLLM 0.33's `tokenizers/deepseek_v32_encoding.py` and the
tokenizer wrapper around it:

- thinking is on when `thinking` or `enable_thinking` is truthy (default off);
- request tools go into a new leading system message, rendered as a "## Tools" section;
- each user turn ends with `<｜Assistant｜>` plus `<think>` (the last user turn, thinking on)
  or `</think>`, so a prompt always ends ready for the assistant: `add_generation_prompt` and
  `continue_final_message` have no effect;
- in thinking mode, when the last message is a user's, reasoning of earlier assistant turns
  is dropped (and developer messages before the last user turn with it); assistant turns
  after the last user turn keep `reasoning</think>`;
- tool results follow their assistant turn inside `<function_results>`.
"""

from __future__ import annotations

from typing import Any

from render_service.render.renderers import dsml
from render_service.render.renderers.base import ChatInput, NoFillInTheMiddle, RenderedPrompt

_TOOLS_SECTION = f"""## Tools
You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<{dsml.DSML}function_calls>" block like the following as part of your reply to the user:
<{dsml.DSML}function_calls>
<{dsml.DSML}invoke name="$FUNCTION_NAME">
<{dsml.DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml.DSML}parameter>
...
</{dsml.DSML}invoke>
<{dsml.DSML}invoke name="$FUNCTION_NAME2">
...
</{dsml.DSML}invoke>
</{dsml.DSML}function_calls>
String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).
If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:
<{dsml.DSML}function_calls>
...
</{dsml.DSML}function_calls>
<function_results>
...
</function_results>
{dsml.THINK_START}...thinking about results{dsml.THINK_END}
Here are the functions available in JSONSchema format:
<functions>
"""


def render_tools_section(tools: list[dict[str, Any]]) -> str:
    schemas = "\n".join(dsml.to_json(function) for function in dsml.tool_functions(tools))
    return f"{_TOOLS_SECTION}{schemas}\n</functions>\n"


# Rendered once per tool list (dsml.ToolBlocks).
tools_section = dsml.ToolBlocks(render_tools_section)


def _drop_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Before the last user turn: assistant reasoning goes, and so do roles other than
    user/system/tool/assistant (developer messages)."""
    last_user = dsml.last_user_index(messages)
    kept = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role in ("user", "system", "tool") or index >= last_user:
            kept.append(message)
        elif role == "assistant":
            kept.append({k: v for k, v in message.items() if k != "reasoning"})
    return kept


def _tool_result(index: int, messages: list[dict[str, Any]], thinking: bool, last_user: int) -> str:
    # The assistant turn these results answer: the nearest non-tool message before them
    # (Python's index -1, the last message, when the results open the conversation).
    owner_index = index - 1
    owner = messages[owner_index]
    while owner_index >= 0 and owner.get("role") == "tool":
        owner_index -= 1
        owner = messages[owner_index]
    if not (index == 0 or (owner_index >= 0 and owner.get("role") == "assistant")):
        raise dsml.EncodingError(f"Invalid messages at {index}:\n{owner}")
    position = index - owner_index
    calls = owner.get("tool_calls")
    if not (calls and len(calls) >= position):
        raise dsml.EncodingError("No tool calls but found tool output")
    text = "\n\n<function_results>" if position == 1 else ""
    text += f"\n<result>{messages[index].get('content')}</result>"
    if position == len(calls):
        text += "\n</function_results>\n\n"
        text += dsml.THINK_START if index >= last_user and thinking else dsml.THINK_END
    return text


def _message(index: int, messages: list[dict[str, Any]], thinking: bool, last_user: int) -> str:
    message = messages[index]
    role = message.get("role")
    content = message.get("content")
    tools = message.get("tools")
    response_format = message.get("response_format")
    if role == "system":
        text = content or ""
        if tools:
            text += "\n\n" + tools_section(tools)
        if response_format:
            text += dsml.response_format_block(response_format)
        return text
    if role in ("user", "developer"):
        if role == "developer":
            if not content:
                raise dsml.EncodingError(f"Invalid message for role `{role}`: {message}")
            body = "\n\n" + tools_section(tools) if tools else ""
            if response_format:
                body += dsml.response_format_block(response_format)
            body += f"\n\n# The user's message is: {content}"
        else:
            body = f"{content}"
        marker = dsml.THINK_START if index == last_user and thinking else dsml.THINK_END
        return f"{dsml.USER}{body}{dsml.ASSISTANT}{marker}"
    if role == "tool":
        return _tool_result(index, messages, thinking, last_user)
    if role == "assistant":
        calls = message.get("tool_calls")
        calls_text = dsml.tool_calls_markup(calls, "function_calls", "invoke", "parameter") if calls else ""
        reasoning = message.get("reasoning")
        thinking_text = ""
        if thinking and index > last_user:
            if not (reasoning or calls):
                raise dsml.EncodingError(
                    f"ThinkingMode: thinking, invalid message without reasoning/tool_calls `{message}` "
                    "after last user message"
                )
            thinking_text = (reasoning or "") + dsml.THINK_END
        if not calls and message.get("prefix", False):
            return content or ""
        return f"{thinking_text}{content or ''}{calls_text}{dsml.EOS}"
    raise dsml.EncodingError(f"Invalid role: {role}")


def encode(messages: list[dict[str, Any]], thinking: bool) -> str:
    """The prompt for `messages` (tools already attached to a system message)."""
    count = len(messages)
    if thinking and messages and messages[-1].get("role") == "user":
        messages = _drop_reasoning(messages)
    last_user = dsml.last_user_index(messages)
    parts = [dsml.BOS]
    # vLLM walks the original count: a dropped developer message makes the walk overrun.
    for index in range(count):
        if index >= len(messages):
            raise dsml.EncodingError(f"Index {index} out of range for messages list of length {len(messages)}")
        parts.append(_message(index, messages, thinking, last_user))
    return "".join(parts)


class DeepseekV32Renderer(NoFillInTheMiddle):
    mode: str = "deepseek_v32"
    content_format: str | None = "string"
    needs_chat_template: bool = False

    def render(self, chat: ChatInput) -> RenderedPrompt:
        thinking = dsml.thinking_requested(chat.kwargs, default=False)
        messages = list(chat.conversation)
        if chat.tools:
            messages.insert(0, {"role": "system", "tools": chat.tools})
        return RenderedPrompt(text=encode(messages, thinking))
