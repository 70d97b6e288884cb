"""The `deepseek_v4` renderer: DeepSeek V4's prompt encoding (no chat template).

Written from the semantics of vLLM 0.33's `tokenizers/deepseek_v4_encoding.py` and the
tokenizer wrapper around it:

- thinking is on unless `thinking`/`enable_thinking` are given and both falsy, or
  `reasoning_effort` is "none"; the effort maps to a preamble (`max`; low/minimal/medium ->
  `low`, which has none; anything else -> `high`) written before the first message;
- request tools attach to the first system message (one is created when there is none) and
  then reasoning history is kept in full;
- tool results become `<tool_result>` blocks of a user turn, ordered as the assistant called
  them; consecutive user turns merge (blocks joined by a blank line);
- a user (or developer) turn that is last or followed by a non-assistant turn opens the
  assistant turn: `<｜Assistant｜>` then `<think>` or `</think>`. `add_generation_prompt` and
  `continue_final_message` have no effect.
- completions with a `suffix` render fill-in-the-middle.
"""

from __future__ import annotations

from typing import Any

from render_service.render.renderers import dsml
from render_service.render.renderers.base import ChatInput, RenderedPrompt

FIM_BEGIN = "<｜fim▁begin｜>"
FIM_HOLE = "<｜fim▁hole｜>"
FIM_END = "<｜fim▁end｜>"

EFFORT_PREAMBLES = {
    "low": "",
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
        "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
        "scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
        "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
    ),
    "max": (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
        "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
        "resolve the underlying cause rather than any surface symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
        "certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
    ),
}

_TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml.DSML}tool_calls>" block like the following:

<{dsml.DSML}tool_calls>
<{dsml.DSML}invoke name="$TOOL_NAME">
<{dsml.DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml.DSML}parameter>
...
</{dsml.DSML}invoke>
<{dsml.DSML}invoke name="$TOOL_NAME2">
...
</{dsml.DSML}invoke>
</{dsml.DSML}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {dsml.THINK_START}), you MUST output your complete reasoning inside {dsml.THINK_START}...{dsml.THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {dsml.THINK_END} with tool calls or final response.

### Available Tool Schemas

"""
_TOOLS_FOOTER = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

# Roles an earlier turn keeps when reasoning history is dropped.
_KEPT_ROLES = frozenset({"user", "system", "tool", "latest_reminder", "direct_search_results"})


def render_tools_section(tools: list[dict[str, Any]]) -> str:
    schemas = "\n".join(dsml.to_json(function) for function in dsml.tool_functions(tools))
    return f"{_TOOLS_SECTION}{schemas}{_TOOLS_FOOTER}"


# Rendered once per tool list (dsml.ToolBlocks).
tools_section = dsml.ToolBlocks(render_tools_section)


def flatten_content(content: Any) -> Any:
    """OpenAI content parts -> text joined by blank lines (images as their placeholder)."""
    if not isinstance(content, list):
        return content
    parts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            parts.append(str(part))
        elif part.get("type") in ("image", "image_url"):
            parts.append(dsml.IMAGE_PLACEHOLDER)
        elif part.get("type") == "text":
            parts.append(part.get("text", ""))
        else:
            raise dsml.EncodingError(f"Unsupported content block type: {part.get('type')!r}")
    return "\n\n".join(parts)


def merge_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool messages become `tool_result` blocks of a user turn; consecutive user turns merge."""
    merged: list[dict[str, Any]] = []
    for original in messages:
        message = dict(original)  # never mutated below: merged turns are new dicts
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
            text = flatten_content(message.get("content", ""))
            block = {"type": "text", "text": text}
            if open_user and previous.get("task") is None:  # type: ignore[union-attr]
                previous["content_blocks"].append(block)  # type: ignore[index]
            else:
                entry = {"role": "user", "content": text, "content_blocks": [block]}
                entry.update({k: message[k] for k in ("task", "wo_eos", "mask") if k in message})
                merged.append(entry)
        else:
            merged.append(message)
    return merged


def order_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Within a user turn, tool results follow the order of the preceding assistant's calls."""
    call_order: dict[str, int] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            call_order = {}
            for position, call in enumerate(message["tool_calls"]):
                call_id = call.get("id") or call.get("function", {}).get("id", "")
                if call_id:
                    call_order[call_id] = position
        elif role == "user" and message.get("content_blocks"):
            blocks = message["content_blocks"]
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if len(results) > 1 and call_order:
                ordered = iter(sorted(results, key=lambda b: call_order.get(b.get("tool_use_id", ""), 0)))
                message["content_blocks"] = [next(ordered) if b.get("type") == "tool_result" else b for b in blocks]
    return messages


def drop_reasoning(messages: list[dict[str, Any]], reasoning_key: str, last_user: int) -> list[dict[str, Any]]:
    """Before the last user turn: assistant reasoning goes, and so do developer (and other) turns."""
    kept = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role in _KEPT_ROLES or index >= last_user:
            kept.append(message)
        elif role == "assistant":
            kept.append({k: v for k, v in message.items() if k != reasoning_key})
    return kept


def user_blocks_text(blocks: list[dict[str, Any]], with_images: bool) -> str:
    parts = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif with_images and kind in ("image", "image_url"):
            parts.append(dsml.IMAGE_PLACEHOLDER)
        elif kind == "tool_result":
            result = block.get("content", "")
            if isinstance(result, list):
                result = "\n\n".join(
                    b.get("text", "") if b.get("type") == "text" else f"[Unsupported {b.get('type')}]" for b in result
                )
            parts.append(f"<tool_result>{result}</tool_result>")
        else:
            parts.append(f"[Unsupported {kind}]")
    return "\n\n".join(parts)


def task_suffix(task: Any, thinking: bool) -> str:
    if task not in dsml.TASK_TOKENS:
        raise dsml.EncodingError(f"Invalid task: '{task}'. Valid tasks are: {list(dsml.TASK_TOKENS)}")
    token = dsml.TASK_TOKENS[task]
    if task != "action":
        return token
    return dsml.ASSISTANT + (dsml.THINK_START if thinking else dsml.THINK_END) + token


class _Encoder:
    def __init__(self, messages: list[dict[str, Any]], thinking: bool, drop: bool, effort: str) -> None:
        self.messages = messages
        self.thinking = thinking
        self.drop = drop
        self.effort = effort
        self.last_user = dsml.last_user_index(messages)

    def encode(self) -> str:
        return dsml.BOS + "".join(self.message(i) for i in range(len(self.messages)))

    def message(self, index: int) -> str:
        messages = self.messages
        message = messages[index]
        role = message.get("role")
        content = flatten_content(message.get("content"))
        tools = message.get("tools")
        response_format = message.get("response_format")
        text = EFFORT_PREAMBLES[self.effort] if index == 0 and self.thinking else ""
        if role == "system":
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
            text += dsml.USER + (user_blocks_text(blocks, with_images=True) if blocks else content or "")
        elif role == "latest_reminder":
            text += f"{dsml.LATEST_REMINDER}{content}"
        elif role == "assistant":
            text += self.assistant(index, message, content)
        else:
            raise dsml.EncodingError(f"Invalid role: {role}")
        return text + self.transition(index)

    def assistant(self, index: int, message: dict[str, Any], content: Any) -> str:
        calls = message.get("tool_calls")
        calls_text = dsml.tool_calls_markup(calls, "tool_calls", "invoke", "parameter") if calls else ""
        thinking_text = ""
        after_task = index > 0 and self.messages[index - 1].get("task") is not None
        if self.thinking and not after_task and (not self.drop or index > self.last_user):
            thinking_text = (message.get("reasoning") or "") + dsml.THINK_END
        end = "" if message.get("wo_eos", False) else dsml.EOS
        return f"{thinking_text}{content or ''}{calls_text}{end}"

    def transition(self, index: int) -> str:
        """What follows a message that ends a turn: a task token, or the assistant's opening."""
        messages = self.messages
        following = messages[index + 1].get("role") if index + 1 < len(messages) else None
        if following is not None and following not in ("assistant", "latest_reminder"):
            return ""
        message = messages[index]
        if message.get("task") is not None:
            return task_suffix(message["task"], self.thinking)
        role = message.get("role")
        if role in ("user", "developer") or (role == "system" and following in (None, "assistant")):
            return dsml.ASSISTANT + self.think_marker(index)
        return ""

    def think_marker(self, index: int) -> str:
        if self.thinking and (not self.drop or index >= self.last_user):
            return dsml.THINK_START
        return dsml.THINK_END


def encode(messages: list[dict[str, Any]], thinking: bool, drop_thinking: bool, effort: str | None) -> str:
    """The prompt for `messages` (tools already attached to a system message)."""
    messages = order_tool_results(merge_tool_results(messages))
    drop = drop_thinking and not any(m.get("tools") for m in messages)
    if thinking and drop:
        messages = drop_reasoning(messages, "reasoning", dsml.last_user_index(messages))
    return _Encoder(messages, thinking, drop, effort or "low").encode()


def attach_tools(conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Request tools go on the first system message (a new one leads when there is none)."""
    messages = list(conversation)
    if not tools:
        return messages
    for index, message in enumerate(messages):
        if message.get("role") == "system":
            messages[index] = dict(message, tools=tools)
            return messages
    return [{"role": "system", "tools": tools}, *messages]


class DeepseekV4Renderer:
    mode: str = "deepseek_v4"
    content_format: str | None = "openai"
    needs_chat_template: bool = False

    def render(self, chat: ChatInput) -> RenderedPrompt:
        thinking = dsml.thinking_requested(chat.kwargs, default=True)
        effort = chat.kwargs.get("reasoning_effort")
        level: str | None
        if not isinstance(effort, str):
            level = "high" if thinking else None
        elif effort == "none":
            thinking, level = False, None
        elif effort == "max":
            level = "max"
        elif effort in ("low", "minimal", "medium"):
            level = "low"
        else:
            level = "high"
        messages = attach_tools(chat.conversation, chat.tools)
        prompt = encode(messages, thinking, bool(chat.kwargs.get("drop_thinking", True)), level)
        return RenderedPrompt(text=prompt)

    def completion_suffix(self, prompt: str, suffix: str) -> str | None:
        return f"{FIM_BEGIN}{prompt}{FIM_HOLE}{suffix}{FIM_END}"
