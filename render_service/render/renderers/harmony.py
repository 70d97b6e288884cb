"""The `harmony` renderer: gpt-oss chat prompts as vLLM 0.33 renders them, through Harmony.

vLLM renders a model whose `config.json` has `model_type: gpt_oss` without its chat template:
`OnlineRenderer._make_request_with_harmony` turns the request into Harmony messages
(`entrypoints/openai/parser/harmony_utils.py`) and `oss-harmony` (the `openai_harmony` module)
renders them to token ids. This module builds the same messages and renders them with the same
library, so the ids are Harmony's own:

- a system message (model identity, `reasoning_effort` high/medium/low, the conversation start
  date: `VLLM_SYSTEM_START_DATE` or today), then a developer message with the leading
  system/developer message's text as instructions and the request's function tools (when there
  are instructions or tools); `VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1` moves instructions
  into the system message, as in vLLM;
- assistant turns: `reasoning` -> an `analysis` message, content -> `final` (or `commentary`
  next to tool calls), each tool call -> `commentary to=functions.NAME` with content type
  `json`; tool results -> a `functions.NAME` tool message (the name found from `tool_call_id`);
  later system/developer messages -> developer instructions;
- `analysis` messages before the last `final` assistant message are dropped, and prior tool-call
  headers are rewritten to the legacy `assistant to=NAME<|channel|>commentary json` form vLLM
  writes back (`_use_legacy_tool_call_headers`).

`openai_harmony` is the optional `harmony` extra (a Rust wheel, no torch). It loads the
`o200k_base` vocabulary from `$TIKTOKEN_ENCODINGS_BASE` (or downloads it), as vLLM does.
"""

from __future__ import annotations

import datetime
import os
from functools import cache
from typing import TYPE_CHECKING, Any

from render_service.api.protocol import handler_error
from render_service.render.renderers.base import ChatInput, NoFillInTheMiddle, RenderedPrompt

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding, Message

REASONING_EFFORTS = ("high", "medium", "low")
# Built-in tool namespaces are never function recipients (vLLM's BUILTIN_TOOL_TO_MCP_SERVER_LABEL).
BUILTIN_TOOLS = ("python", "browser", "container")


class HarmonyUnavailableError(RuntimeError):
    """The `openai_harmony` module (the `harmony` extra) is not installed."""


@cache
def encoding() -> HarmonyEncoding:
    """The gpt-oss Harmony encoding (loaded once; it reads the o200k_base vocabulary)."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError as exc:
        raise HarmonyUnavailableError(
            "gpt-oss models render through Harmony: install render-service[harmony] (oss-harmony)"
        ) from exc
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # HarmonyError: the vocabulary is missing, unreadable or fails its hash
        raise HarmonyUnavailableError(
            f"cannot load Harmony's gpt-oss encoding ({exc}); put o200k_base.tiktoken in the folder "
            "$TIKTOKEN_ENCODINGS_BASE names (scripts/fetch_o200k.py builds it)"
        ) from exc


def _library_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("oss-harmony")
    except PackageNotFoundError:
        return None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true")


def flatten_text(content: Any) -> str | None:
    """vLLM's `flatten_input_text_content`: a string, or the text parts joined; None if none."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        item if isinstance(item, str) else item["text"]
        for item in content
        if isinstance(item, str) or (isinstance(item, dict) and item.get("text") is not None)
    ]
    return "".join(texts) if texts else None


def check_chat_effort(effort: str | None) -> None:
    """The chat path's own check (`_make_request_with_harmony`), before the system message's."""
    if effort == "none":
        raise handler_error(f"Harmony does not support reasoning_effort={effort!r}", "reasoning_effort")


class HarmonyRenderer(NoFillInTheMiddle):
    mode = "harmony"
    content_format: str | None = "openai"
    needs_chat_template = False

    def __init__(self) -> None:
        self.encoding = encoding()  # fail at start, not on the first request
        self.system_instructions = _env_flag("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS")
        self.start_date = os.environ.get("VLLM_SYSTEM_START_DATE") or None
        special = self.encoding.special_tokens_set
        ids = {token: self.encoding.encode(token, allowed_special=special)[0] for token in special}
        self.start_id = ids["<|start|>"]
        self.channel_id = ids["<|channel|>"]
        self.constrain_id = ids["<|constrain|>"]
        self.message_id = ids["<|message|>"]
        # For the config fingerprint: what the prompts depend on besides the request.
        self.fingerprint = {
            "oss_harmony": _library_version(),
            "system_instructions": self.system_instructions,
            "start_date": self.start_date,
        }

    def render(self, chat: ChatInput) -> RenderedPrompt:
        effort = chat.reasoning_effort
        messages = list(chat.messages)
        instructions = None
        if messages and messages[0].get("role") in ("system", "developer"):
            instructions = flatten_text(messages[0].get("content"))
            messages = messages[1:]
        harmony_messages = self.preamble(instructions, chat.tools, effort)
        harmony_messages.extend(self.conversation(messages))
        return RenderedPrompt(token_ids=self.render_for_completion(harmony_messages))

    # -- messages ------------------------------------------------------------------------------

    def system_message(self, effort: str | None, instructions: str | None = None) -> Message:
        from openai_harmony import Message, ReasoningEffort, Role, SystemContent

        content = SystemContent.new()
        if instructions is not None and self.system_instructions:
            identity = content.model_identity
            content = content.with_model_identity(f"{identity}\n{instructions}" if identity else instructions)
        if effort is not None:
            if effort not in REASONING_EFFORTS:
                raise handler_error(
                    f"reasoning_effort={effort!r} is not supported by Harmony. "
                    f"Supported values are: {', '.join(REASONING_EFFORTS)}.",
                    "reasoning_effort",
                )
            content = content.with_reasoning_effort(ReasoningEffort(effort.capitalize()))
        # vLLM: "This brings non-determinism"; VLLM_SYSTEM_START_DATE pins it.
        date = self.start_date or datetime.datetime.now().strftime("%Y-%m-%d")
        return Message.from_role_and_content(Role.SYSTEM, content.with_conversation_start_date(date))

    def developer_message(self, instructions: str | None, tools: list[dict[str, Any]] | None) -> Message:
        from openai_harmony import DeveloperContent, Message, Role, ToolDescription

        content = DeveloperContent.new()
        if instructions is not None and not self.system_instructions:
            content = content.with_instructions(instructions)
        if tools is not None:
            functions = []
            for tool in tools:
                if tool.get("type") != "function":
                    raise handler_error(f"tool type {tool.get('type')!r} is not supported.", "tools")
                function = tool.get("function") or {}
                functions.append(
                    ToolDescription.new(
                        name=function.get("name"),
                        description=function.get("description") or "",
                        parameters=function.get("parameters"),
                    )
                )
            if functions:
                content = content.with_function_tools(functions)
        return Message.from_role_and_content(Role.DEVELOPER, content)

    def preamble(
        self, instructions: str | None, tools: list[dict[str, Any]] | None, effort: str | None
    ) -> list[Message]:
        """vLLM's `build_harmony_preamble`: the system message, then the developer message."""
        system_instructions = instructions if self.system_instructions else None
        developer_instructions = None if self.system_instructions else instructions
        out = [self.system_message(effort, system_instructions)]
        if developer_instructions or tools:
            out.append(self.developer_message(developer_instructions, tools))
        return out

    def conversation(self, messages: list[dict[str, Any]]) -> list[Message]:
        """vLLM's `parse_chat_inputs_to_harmony_messages`."""
        names: dict[Any, Any] = {}
        for message in messages:
            for call in message.get("tool_calls") or []:
                names[call.get("id")] = (call.get("function") or {}).get("name")
        out: list[Message] = []
        for message in messages:
            out.extend(self.message(message, names))
        return out

    def message(self, message: dict[str, Any], names: dict[Any, Any]) -> list[Message]:
        from openai_harmony import Author, Message, Role, TextContent

        role = message.get("role")
        out: list[Message] = []
        calls = message.get("tool_calls") or []
        if role == "assistant" and calls:
            text = flatten_text(message.get("content"))
            if text:
                out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
            reasoning = message.get("reasoning")
            if reasoning:
                out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
            for call in calls:
                function = call.get("function") or {}
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, function.get("arguments", "") or "")
                    .with_channel("commentary")
                    .with_recipient(f"functions.{function.get('name', '')}")
                    .with_content_type("json")
                )
            return out
        if role == "tool":
            name = names.get(message.get("tool_call_id", ""), "")
            text = flatten_text(message.get("content")) or ""
            author = Author.new(Role.TOOL, f"functions.{name}")
            return [
                Message.from_author_and_content(author, text).with_channel("commentary").with_recipient("assistant")
            ]
        reasoning = message.get("reasoning")
        if role == "assistant" and reasoning:
            out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
        content = message.get("content") or ""
        if isinstance(content, str):
            contents = [TextContent(text=content)]
        else:
            contents = [TextContent(text=part.get("text", "")) for part in content]
        if role == "assistant":
            if contents and contents[0].text:
                out.append(Message.from_role_and_contents(Role.ASSISTANT, contents).with_channel("final"))
        elif role in ("system", "developer"):
            instructions = flatten_text(message.get("content"))
            if instructions is not None:
                if role == "system" and self.system_instructions:
                    out.append(self.system_message(None, instructions))
                else:
                    out.append(self.developer_message(instructions, None))
        else:
            out.append(Message.from_role_and_contents(Role(role), contents))
        return out

    # -- tokens --------------------------------------------------------------------------------

    def render_for_completion(self, messages: list[Message]) -> list[int]:
        """vLLM's `render_for_completion`: drop stale analysis, render, legacy tool headers."""
        from openai_harmony import Conversation, RenderConversationConfig, Role

        last_final = -1
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].author.role == Role.ASSISTANT and messages[index].channel == "final":
                last_final = index
                break
        kept = [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]
        ids = self.encoding.render_conversation_for_completion(
            Conversation.from_messages(kept), Role.ASSISTANT, config=RenderConversationConfig(auto_drop_analysis=False)
        )
        return self.legacy_tool_call_headers(ids)

    def legacy_tool_call_headers(self, ids: list[int]) -> list[int]:
        """`assistant<|channel|>commentary to=X <|constrain|>T<|message|>` becomes
        `assistant to=X<|channel|>commentary T<|message|>` (what gpt-oss was trained on)."""
        if self.constrain_id not in ids:  # only headers with a content type are rewritten
            return ids
        enc = self.encoding
        out = list(ids)
        index = 0
        while index < len(out):
            if out[index] != self.start_id:
                index += 1
                continue
            try:
                header_end = out.index(self.message_id, index + 1)
                channel = out.index(self.channel_id, index + 1, header_end)
                constrain = out.index(self.constrain_id, channel + 1, header_end)
            except ValueError:
                index += 1
                continue
            author = enc.decode(out[index + 1 : channel])
            channel_and_recipient = enc.decode(out[channel + 1 : constrain])
            content_type = enc.decode(out[constrain + 1 : header_end])
            if author != "assistant" or " to=" not in channel_and_recipient or not channel_and_recipient.endswith(" "):
                index = header_end + 1
                continue
            channel_name, recipient = channel_and_recipient[:-1].split(" to=", 1)
            if not channel_name or not recipient or not content_type:
                index = header_end + 1
                continue
            legacy = [
                self.start_id,
                *enc.encode(f"assistant to={recipient}"),
                self.channel_id,
                *enc.encode(f"{channel_name} {content_type}"),
                self.message_id,
            ]
            out[index : header_end + 1] = legacy
            index += len(legacy)
        return out
