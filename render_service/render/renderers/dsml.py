"""Pieces shared by the DeepSeek encoders (V3.2, V4, V4.1): special tokens, JSON, DSML tool calls.

DeepSeek writes tool calls in DSML, an XML-like markup whose tags start with the `｜DSML｜`
token, one `parameter` per argument: strings raw (`string="true"`), everything else as JSON.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from render_service.exceptions import BadRequestError
from render_service.render.templating import SharedTools

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"
LATEST_REMINDER = "<｜latest_reminder｜>"
IMAGE_PLACEHOLDER = "<｜deepseek_image｜>"
# Internal classification tasks a message may carry (`task`), and the token each one appends.
TASK_TOKENS = {
    "action": "<｜action｜>",
    "query": "<｜query｜>",
    "authority": "<｜authority｜>",
    "domain": "<｜domain｜>",
    "title": "<｜title｜>",
    "read_url": "<｜read_url｜>",
}
RESPONSE_FORMAT_HEADER = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"


class EncodingError(BadRequestError):
    """A conversation the encoder cannot write (vLLM's encoders raise ValueError: a 400)."""


def to_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(value, ensure_ascii=True)


class ToolBlocks:
    """A renderer's tools section, rendered once per tool list: an agent sends the same tools every
    turn, and each render would write their JSON schemas again.

    Keyed by the tools' orjson encoding (`SharedTools.key_of`), which tells apart every two tool
    lists that `to_json` writes differently, except a NaN or infinity (orjson writes `null`,
    json.dumps `NaN`): a list whose encoding has a null value is rendered every time, never cached;
    so is one orjson cannot encode. Bounded by entries and bytes (LRU)."""

    def __init__(self, render: Callable[[list[dict[str, Any]]], str], max_entries: int = 64) -> None:
        self._render = render
        self.max_entries = max_entries
        self.max_bytes = 8 << 20
        self._blocks: OrderedDict[bytes, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, tools: list[dict[str, Any]]) -> str:
        key = SharedTools.key_of(tools)
        if key is None:
            return self._render(tools)
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
                return block
        block = self._render(tools)
        size = len(key) + sys.getsizeof(block)
        if size > self.max_bytes // 8:
            return block
        with self._lock:
            if key not in self._blocks:
                self._blocks[key] = block
                self._bytes += size
                while len(self._blocks) > self.max_entries or self._bytes > self.max_bytes:
                    old_key, old = self._blocks.popitem(last=False)
                    self._bytes -= len(old_key) + sys.getsizeof(old)
        return block


def response_format_block(response_format: Any) -> str:
    return "\n\n" + RESPONSE_FORMAT_HEADER + to_json(response_format)


def tool_functions(tools: list[dict[str, Any]]) -> list[Any]:
    """The `function` objects of OpenAI-format tools, as the tool schema list shows them."""
    return [tool["function"] for tool in tools]


def parameters_markup(arguments: dict[str, Any], tag: str) -> str:
    """One `<｜DSML｜{tag} name=".." string="..">value</｜DSML｜{tag}>` line per argument."""
    lines = []
    for key, value in arguments.items():
        is_string = isinstance(value, str)
        text = value if is_string else to_json(value)
        lines.append(f'<{DSML}{tag} name="{key}" string="{"true" if is_string else "false"}">{text}</{DSML}{tag}>')
    return "\n".join(lines)


def strict_arguments(arguments: Any) -> Any:
    """V3.2 and V4: a JSON string is decoded (a bad one is an error), anything else used as is."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError as exc:
            raise EncodingError(str(exc)) from None
    return arguments


def tool_calls_markup(
    tool_calls: list[dict[str, Any]],
    block: str,
    invoke: str,
    parameter: str,
    decode: Any = strict_arguments,
) -> str:
    """The assistant's tool-call block, preceded by a blank line."""
    invokes = []
    for call in tool_calls:
        function = call["function"]
        arguments = decode(function["arguments"])
        if not isinstance(arguments, dict):
            raise EncodingError(f"tool call arguments must be a JSON object, got {type(arguments).__name__}")
        body = parameters_markup(arguments, parameter)
        invokes.append(f'<{DSML}{invoke} name="{function.get("name")}">\n{body}\n</{DSML}{invoke}>')
    joined = "\n".join(invokes)
    return f"\n\n<{DSML}{block}>\n{joined}\n</{DSML}{block}>"


def last_user_index(messages: list[dict[str, Any]]) -> int:
    """The index of the last user or developer message (-1 when none)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") in ("user", "developer"):
            return index
    return -1


def thinking_requested(kwargs: dict[str, Any], default: bool) -> bool:
    """`thinking` or `enable_thinking` (either truthy turns it on); `default` when neither is given."""
    if "thinking" not in kwargs and "enable_thinking" not in kwargs:
        return default
    return bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking"))
