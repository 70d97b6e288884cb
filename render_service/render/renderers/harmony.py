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

Speed: Harmony renders a conversation as the concatenation of each message's own render, so
the prompt is assembled from per-message token ids kept in a bounded LRU (`MessageIds`); only
messages not seen before are built and tokenized by the library (the history a client re-sends
every turn costs a lookup).

`openai_harmony` is the optional `harmony` extra (a Rust wheel, no torch). It loads the
`o200k_base` vocabulary from `$TIKTOKEN_ENCODINGS_BASE` (or downloads it), as vLLM does.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any, NamedTuple

from render_service.api.protocol import handler_error
from render_service.render.renderers.base import ChatInput, NoFillInTheMiddle, RenderedPrompt, plain_messages

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


# A message rendered once is looked up, not re-tokenized: chat clients re-send the whole history
# every turn. Bounded by entries and by an estimate of the bytes held (ids and key text).
CACHE_MAX_BYTES = 64 << 20
CACHE_MAX_ENTRIES = 1 << 15
_ENTRY_OVERHEAD = 200
_BYTES_PER_ID = 36

# What one Harmony message is made of, as a hashable key: `("text", role, author name, channel,
# recipient, content type, texts)`, `("system", effort, instructions, date)` or
# `("developer", instructions, tools as JSON)`. Every input of the message is in its key.
MessageKey = tuple[Any, ...]
Build = Callable[[], "Message"]


class MessageIds:
    """Harmony's token ids for single messages, cached (an LRU).

    `HarmonyEncoding.render_conversation` renders each message on its own; the only thing it
    carries across messages is whether the conversation has function tools (the system message
    then names the `functions` namespace), so the key includes that flag, and a conversation's
    ids are its messages' ids in order (tests/render/test_harmony_cache.py checks it against the
    whole-conversation render).
    """

    def __init__(
        self, render: Callable[[MessageKey | None, bool, Build], list[int]], max_bytes: int, max_entries: int
    ) -> None:
        self._render = render
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[MessageKey, bool], tuple[int, ...]] = OrderedDict()
        self._bytes = 0
        # Workers render on the event loop, but tests and the audit may call from threads.
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: MessageKey | None, has_function_tools: bool, build: Build) -> tuple[int, ...]:
        """The message's ids; `key` None: not cacheable (an input that is not plain text)."""
        if key is None:
            return tuple(self._render(None, has_function_tools, build))
        full_key = (key, has_function_tools)
        with self._lock:
            cached = self._cache.get(full_key)
            if cached is not None:
                self._cache.move_to_end(full_key)
                self.hits += 1
                return cached
        ids = tuple(self._render(key, has_function_tools, build))
        size = _entry_bytes(key, ids)
        with self._lock:
            self.misses += 1
            if size <= self.max_bytes // 8 and full_key not in self._cache:
                self._cache[full_key] = ids
                self._bytes += size
                while self._bytes > self.max_bytes or len(self._cache) > self.max_entries:
                    old_key, old_ids = self._cache.popitem(last=False)
                    self._bytes -= _entry_bytes(old_key[0], old_ids)
        return ids


def _entry_bytes(key: MessageKey, ids: tuple[int, ...]) -> int:
    # The key's strings as Python holds them (1, 2 or 4 bytes a character), the ids, the slot.
    size = _ENTRY_OVERHEAD + _BYTES_PER_ID * len(ids)
    for part in key:
        if isinstance(part, str):
            size += sys.getsizeof(part)
        elif isinstance(part, tuple):
            size += sum(sys.getsizeof(text) for text in part if isinstance(text, str))
    return size


def _text_key(
    role: str,
    texts: tuple[Any, ...],
    channel: str | None = None,
    recipient: str | None = None,
    content_type: str | None = None,
    name: str | None = None,
) -> MessageKey | None:
    if not all(isinstance(text, str) for text in texts):
        return None
    return ("text", role, name, channel, recipient, content_type, texts)


# Distinct message framings (author, channel, recipient, content type) kept by a renderer.
FRAMINGS_MAX = 4096


class Part(NamedTuple):
    """One Harmony message of the prompt, before rendering."""

    role: Any
    channel: str | None
    key: MessageKey | None
    build: Build
    has_function_tools: bool = False


@dataclass(frozen=True, slots=True)
class DeveloperBuild:
    """How to make a developer message (a `Build`), with what it is made of: the renderer splices
    its instructions into the tool list's text instead of having the library encode them."""

    instructions: str | None
    functions: list[tuple[Any, str, Any]]

    def __call__(self) -> Message:
        return HarmonyRenderer._developer_message(self.instructions, self.functions)


# Roles whose text messages are spliced (library framing, fastokens text); the others (system,
# developer, unknown roles) are the library's alone.
SPLICED_ROLES = ("user", "assistant", "tool")
# Distinct function-tool lists whose `# Tools` text a renderer keeps (developer messages).
TOOL_SECTIONS_MAX = 256


class HarmonyRenderer(NoFillInTheMiddle):
    mode = "harmony"
    content_format: str | None = "openai"
    needs_chat_template = False

    def __init__(self, cache_bytes: int = CACHE_MAX_BYTES) -> None:
        from openai_harmony import Conversation, RenderOptions, Role

        self.encoding = encoding()  # fail at start, not on the first request
        self.system_instructions = _env_flag("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS")
        self.start_date = os.environ.get("VLLM_SYSTEM_START_DATE") or None
        special = self.encoding.special_tokens_set
        ids = {token: self.encoding.encode(token, allowed_special=special)[0] for token in special}
        self.start_id = ids["<|start|>"]
        self.channel_id = ids["<|channel|>"]
        self.constrain_id = ids["<|constrain|>"]
        self.message_id = ids["<|message|>"]
        # `<|start|>assistant`: what render_conversation_for_completion appends to the messages.
        self.completion_suffix_ids = self.encoding.render_conversation_for_completion(
            Conversation.from_messages([]), Role.ASSISTANT
        )
        # Message text through fastokens (o200k_base's ranks, checked against the library at
        # start); None keeps the library for all of it.
        from render_service.model.harmony_text import harmony_fastokens

        self.text_encode = harmony_fastokens(self.library_text_ids)
        self.text_encoder = "fastokens" if self.text_encode is not None else "harmony"
        self.framings: dict[tuple[Any, ...], tuple[list[int], list[int]]] = {}
        # A developer message with no instructions and no tools: `<|start|>developer<|message|>`, `<|end|>`.
        empty = self.encoding.render(self._developer_message(None, []), RenderOptions())
        cut = empty.index(self.message_id) + 1
        self.developer_framing = (empty[:cut], empty[cut:])
        # Developer messages: (function tools as JSON) -> their `# Tools` section as text (None: the
        # library renders that tool list's developer messages itself).
        self.tool_sections: OrderedDict[str | None, str | None] = OrderedDict()
        self.messages = MessageIds(self._render_part, cache_bytes, CACHE_MAX_ENTRIES)
        # For the config fingerprint: what the prompts depend on besides the request.
        self.fingerprint = {
            "oss_harmony": _library_version(),
            "system_instructions": self.system_instructions,
            "start_date": self.start_date,
        }

    def conversation_unused(self, messages: list[Any]) -> bool:
        """This renderer reads the request messages, not vLLM's parsed conversation: the pipeline
        skips building it when parsing could neither fail nor collect media (`plain_messages`)."""
        return plain_messages(messages)

    def render(self, chat: ChatInput) -> RenderedPrompt:
        effort = chat.reasoning_effort
        messages = list(chat.messages)
        instructions = None
        if messages and messages[0].get("role") in ("system", "developer"):
            instructions = flatten_text(messages[0].get("content"))
            messages = messages[1:]
        parts = self.preamble(instructions, chat.tools, effort)
        parts.extend(self.conversation(messages))
        return RenderedPrompt(token_ids=self.render_for_completion(parts))

    # -- messages ------------------------------------------------------------------------------
    # Each builder returns (key, build): the cache key and how to make the Harmony message on a
    # miss. Request checks run here, on every request, before the cache is consulted.

    def system_message(self, effort: str | None, instructions: str | None = None) -> tuple[MessageKey | None, Build]:
        if effort is not None and effort not in REASONING_EFFORTS:
            raise handler_error(
                f"reasoning_effort={effort!r} is not supported by Harmony. "
                f"Supported values are: {', '.join(REASONING_EFFORTS)}.",
                "reasoning_effort",
            )
        instructions = instructions if self.system_instructions else None
        # vLLM: "This brings non-determinism"; VLLM_SYSTEM_START_DATE pins it.
        date = self.start_date or datetime.datetime.now().strftime("%Y-%m-%d")
        key = ("system", effort, instructions, date) if instructions is None or isinstance(instructions, str) else None
        return key, partial(self._system_message, effort, instructions, date)

    @staticmethod
    def _system_message(effort: str | None, instructions: str | None, date: str) -> Message:
        from openai_harmony import Message, ReasoningEffort, Role, SystemContent

        content = SystemContent.new()
        if instructions is not None:
            identity = content.model_identity
            content = content.with_model_identity(f"{identity}\n{instructions}" if identity else instructions)
        if effort is not None:
            content = content.with_reasoning_effort(ReasoningEffort(effort.capitalize()))
        return Message.from_role_and_content(Role.SYSTEM, content.with_conversation_start_date(date))

    def developer_message(
        self, instructions: str | None, tools: list[dict[str, Any]] | None
    ) -> tuple[MessageKey | None, Build, bool]:
        """(key, build, has function tools)."""
        instructions = instructions if not self.system_instructions else None
        functions: list[tuple[Any, str, Any]] = []
        for tool in tools or ():
            if tool.get("type") != "function":
                raise handler_error(f"tool type {tool.get('type')!r} is not supported.", "tools")
            function = tool.get("function") or {}
            functions.append((function.get("name"), function.get("description") or "", function.get("parameters")))
        key: MessageKey | None = None
        if instructions is None or isinstance(instructions, str):
            try:  # Harmony itself takes the message as JSON: equal JSON, equal message
                key = ("developer", instructions, json.dumps(functions, ensure_ascii=False) if functions else None)
            except (TypeError, ValueError):
                key = None
        return key, DeveloperBuild(instructions, functions), bool(functions)

    @staticmethod
    def _developer_message(instructions: str | None, functions: list[tuple[Any, str, Any]]) -> Message:
        from openai_harmony import DeveloperContent, Message, Role, ToolDescription

        content = DeveloperContent.new()
        if instructions is not None:
            content = content.with_instructions(instructions)
        if functions:
            content = content.with_function_tools(
                [
                    ToolDescription.new(name=name, description=desc, parameters=params)
                    for name, desc, params in functions
                ]
            )
        return Message.from_role_and_content(Role.DEVELOPER, content)

    def preamble(self, instructions: str | None, tools: list[dict[str, Any]] | None, effort: str | None) -> list[Part]:
        """vLLM's `build_harmony_preamble`: the system message, then the developer message."""
        out = [Part("system", None, *self.system_message(effort, instructions))]
        developer_instructions = None if self.system_instructions else instructions
        if developer_instructions or tools:
            key, build, has_functions = self.developer_message(developer_instructions, tools)
            out.append(Part("developer", None, key, build, has_functions))
        return out

    def conversation(self, messages: list[dict[str, Any]]) -> list[Part]:
        """vLLM's `parse_chat_inputs_to_harmony_messages`."""
        names: dict[Any, Any] = {}
        for message in messages:
            for call in message.get("tool_calls") or []:
                names[call.get("id")] = (call.get("function") or {}).get("name")
        out: list[Part] = []
        for message in messages:
            out.extend(self.message(message, names))
        return out

    def message(self, message: dict[str, Any], names: dict[Any, Any]) -> list[Part]:
        role = message.get("role")
        out: list[Part] = []
        calls = message.get("tool_calls") or []
        if role == "assistant" and calls:
            text = flatten_text(message.get("content"))
            if text:
                out.append(self._text("assistant", (text,), "commentary"))
            reasoning = message.get("reasoning")
            if reasoning:
                out.append(self._text("assistant", (reasoning,), "analysis"))
            for call in calls:
                function = call.get("function") or {}
                arguments = function.get("arguments", "") or ""
                out.append(
                    self._text("assistant", (arguments,), "commentary", f"functions.{function.get('name', '')}", "json")
                )
            return out
        if role == "tool":
            name = names.get(message.get("tool_call_id", ""), "")
            text = flatten_text(message.get("content")) or ""
            return [self._text("tool", (text,), "commentary", "assistant", name=f"functions.{name}")]
        reasoning = message.get("reasoning")
        if role == "assistant" and reasoning:
            out.append(self._text("assistant", (reasoning,), "analysis"))
        content = message.get("content") or ""
        texts = (content,) if isinstance(content, str) else tuple(part.get("text", "") for part in content)
        if role == "assistant":
            if texts and texts[0]:
                out.append(self._text("assistant", texts, "final"))
        elif role in ("system", "developer"):
            instructions = flatten_text(message.get("content"))
            if instructions is not None:
                if role == "system" and self.system_instructions:
                    out.append(Part("system", None, *self.system_message(None, instructions)))
                else:
                    key, build, _ = self.developer_message(instructions, None)
                    out.append(Part("developer", None, key, build))
        else:
            out.append(self._text(role, texts))
        return out

    @staticmethod
    def _text(
        role: Any,
        texts: tuple[Any, ...],
        channel: str | None = None,
        recipient: str | None = None,
        content_type: str | None = None,
        name: str | None = None,
    ) -> Part:
        def build() -> Message:
            from openai_harmony import Author, Message, Role, TextContent

            author = Author.new(Role(role), name) if name is not None else Author(role=Role(role))
            built = Message(author=author, content=[TextContent(text=text) for text in texts])
            if channel is not None:
                built = built.with_channel(channel)
            if recipient is not None:
                built = built.with_recipient(recipient)
            if content_type is not None:
                built = built.with_content_type(content_type)
            return built

        key = _text_key(role, texts, channel, recipient, content_type, name) if isinstance(role, str) else None
        return Part(role, channel, key, build)

    # -- tokens --------------------------------------------------------------------------------

    def render_for_completion(self, parts: list[Part]) -> list[int]:
        """vLLM's `render_for_completion`: drop stale analysis, render (message by message, each
        through the cache), legacy tool headers, then `<|start|>assistant`."""
        last_final = -1
        for index in range(len(parts) - 1, -1, -1):
            if parts[index].role == "assistant" and parts[index].channel == "final":
                last_final = index
                break
        has_function_tools = any(part.has_function_tools for part in parts)
        ids: list[int] = []
        get = self.messages.get
        for index, part in enumerate(parts):
            if index < last_final and part.channel == "analysis":
                continue
            ids.extend(get(part.key, has_function_tools, part.build))
        ids.extend(self.completion_suffix_ids)
        return ids

    def _render_part(self, key: MessageKey | None, has_function_tools: bool, build: Build) -> list[int]:
        """One message's ids on a cache miss. Text messages and developer messages with text
        instructions are spliced (library framing, fastokens text: `_spliced_text`,
        `_spliced_developer`) without building the library's message objects; anything else is
        the library's render (`_render_message`)."""
        if self.text_encode is not None and key is not None:
            if key[0] == "text" and key[1] in SPLICED_ROLES and key[6]:
                return self._spliced_text(key, has_function_tools)
            if key[0] == "developer" and isinstance(key[1], str) and isinstance(build, DeveloperBuild):
                ids = self._spliced_developer(key, build, has_function_tools)
                if ids is not None:
                    return ids
        return self._render_message(build(), has_function_tools)

    def _render_message(self, message: Message, has_function_tools: bool) -> list[int]:
        """The library's render of one message. A message of text contents (user, assistant and
        tool messages) is `header <|message|> texts end`, each text encoded as plain text on its
        own: the library renders the message without its contents (the framing) and the texts
        are encoded by `self.text_encode` (fastokens) in between; identical ids, the texts being
        most of a prompt and the library's tokenizer the slow part on unseen text."""
        from openai_harmony import RenderOptions, Role, TextContent

        contents = message.content
        if (
            self.text_encode is None
            or not contents
            or message.author.role not in (Role.USER, Role.ASSISTANT, Role.TOOL)
            or not all(type(content) is TextContent for content in contents)
        ):
            options = RenderOptions(conversation_has_function_tools=has_function_tools)
            return self.legacy_tool_call_headers(self.encoding.render(message, options))
        author = message.author
        key = ("text", author.role.value, author.name, message.channel, message.recipient, message.content_type)
        return self._spliced_text((*key, tuple(content.text for content in contents)), has_function_tools)

    def _spliced_text(self, key: MessageKey, has_function_tools: bool) -> list[int]:
        """A text message (`_text_key`: role, name, channel, recipient, content type, texts): its
        framing's ids around each text's. The legacy header rewrite is the framing's alone: text
        encoded as plain text holds no special token, so the rewrite never reaches into it."""
        _, role, name, channel, recipient, content_type, texts = key
        head, tail = self._framing(role, name, channel, recipient, content_type, has_function_tools)
        ids = list(head)
        for text in texts:
            ids.extend(self.text_ids(text))
        ids.extend(tail)
        return ids

    def _framing(
        self,
        role: str,
        name: str | None,
        channel: str | None,
        recipient: str | None,
        content_type: str | None,
        has_function_tools: bool,
    ) -> tuple[list[int], list[int]]:
        """The library's render of a text message without its contents, legacy headers applied,
        cut after `<|message|>`: (header, end). Chats repeat a handful of these; bounded, as
        recipients are names."""
        frame_key = (role, name, channel, recipient, content_type, has_function_tools)
        framing = self.framings.get(frame_key)
        if framing is None:
            from openai_harmony import Author, Message, RenderOptions, Role

            author = Author.new(Role(role), name) if name is not None else Author(role=Role(role))
            message = Message(author=author, content=[])
            if channel is not None:
                message = message.with_channel(channel)
            if recipient is not None:
                message = message.with_recipient(recipient)
            if content_type is not None:
                message = message.with_content_type(content_type)
            options = RenderOptions(conversation_has_function_tools=has_function_tools)
            ids = self.legacy_tool_call_headers(self.encoding.render(message, options))
            cut = ids.index(self.message_id) + 1
            framing = (ids[:cut], ids[cut:])
            if len(self.framings) >= FRAMINGS_MAX:
                self.framings.clear()
            self.framings[frame_key] = framing
        return framing

    def _spliced_developer(self, key: MessageKey, build: DeveloperBuild, has_function_tools: bool) -> list[int] | None:
        """A developer message with text instructions, as Harmony renders it: one text,
        `"# Instructions", instructions[, tools section]` joined by blank lines, between the
        developer framing's ids. The tools section is the library's (its render of the message
        without instructions, decoded), once per tool list; the first splice of each tool list
        is checked against the library's render of that message, and a tool list whose splice
        differs is left to the library. None: the library renders it."""
        tools_json = key[2]
        sections = self.tool_sections
        if tools_json in sections:
            sections.move_to_end(tools_json)
            section = sections[tools_json]
            return None if section is None else self._developer_ids(build.instructions, section)
        section = self._tool_section(build.functions) if build.functions else ""
        library = self._render_message(build(), has_function_tools)
        if section is not None and self._developer_ids(build.instructions, section) != library:
            section = None
        sections[tools_json] = section
        while len(sections) > TOOL_SECTIONS_MAX:
            sections.popitem(last=False)
        return library

    def _developer_ids(self, instructions: str | None, section: str) -> list[int]:
        head, tail = self.developer_framing
        text = f"# Instructions\n\n{instructions}\n\n{section}" if section else f"# Instructions\n\n{instructions}"
        return [*head, *self.text_ids(text), *tail]

    def _tool_section(self, functions: list[tuple[Any, str, Any]]) -> str | None:
        """The `# Tools` text of a developer message with these function tools and no
        instructions (None: the library's ids are not the framing's around one text)."""
        from openai_harmony import RenderOptions

        ids = self.encoding.render(self._developer_message(None, functions), RenderOptions())
        head, tail = self.developer_framing
        if ids[: len(head)] != head or ids[len(ids) - len(tail) :] != tail:
            return None
        try:
            text: str = self.encoding.decode_utf8(ids[len(head) : len(ids) - len(tail)])
        except Exception:  # not text the library would encode back
            return None
        return text if text.startswith("# Tools") else None

    def text_ids(self, text: str) -> list[int]:
        """A message text's ids: fastokens, or the library for what fastokens cannot take (lone
        surrogates, which the library replaces)."""
        if self.text_encode is not None:
            try:
                return self.text_encode(text)
            except Exception:  # the library decides then (it fails the same way)
                pass
        return self.library_text_ids(text)

    def library_text_ids(self, text: str) -> list[int]:
        """The library's ids for a message text: a user message holding only `text`, rendered,
        less its framing (`<|start|>user<|message|>` ... `<|end|>`)."""
        from openai_harmony import Message, RenderOptions, Role

        ids = self.encoding.render(Message.from_role_and_content(Role.USER, text), RenderOptions())
        return ids[ids.index(self.message_id) + 1 : -1]

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
