"""What every renderer gets and gives: a parsed chat request in, prompt text or token ids out.

vLLM 0.33 picks one renderer per model (`vllm/renderers/registry.py`). The request checks,
sampling parameters and the `GenerateRequest` are the same for all of them; only the step that
turns the conversation into a prompt differs, and that step is this interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ChatInput:
    """One chat request, ready to render.

    `conversation` is vLLM's `parse_chat_messages` output in the renderer's content format
    (tool-call arguments as objects); `messages` are the validated request messages, which
    some encoders read instead (DeepSeek V4.1). `kwargs` are the effective chat template
    kwargs (request, `--default-chat-template-kwargs`, `add_generation_prompt`, ...), without
    `tools`, which travel separately (None when the request has none or they are excluded).
    """

    messages: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any]
    chat_template: str | None
    # The request's `tool_choice` when it has tools (vLLM collapses it to None otherwise).
    tool_choice: Any = None
    response_format: Any = None
    # The request's `reasoning_effort` as sent (Harmony reads it, not the template kwargs).
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class RenderedPrompt:
    """Prompt text to tokenize (with the request's `add_special_tokens`), or final token ids."""

    text: str | None = None
    token_ids: list[int] | None = None


class Renderer(Protocol):
    """One renderer kind (vLLM's `--tokenizer-mode` value that selects it)."""

    mode: str
    # The content format the renderer parses messages with; None: the HF rule (the
    # `--chat-template-content-format` flag, or detected from the template).
    content_format: str | None
    # Whether a chat template is required (HF); the Python encoders need none.
    needs_chat_template: bool

    def render(self, chat: ChatInput) -> RenderedPrompt: ...

    def completion_suffix(self, prompt: str, suffix: str) -> str | None:
        """The fill-in-the-middle prompt for a completions `suffix`, or None when unsupported."""
        ...


class NoFillInTheMiddle:
    """Renderers without FIM completion rendering (vLLM's `BaseRenderer` default)."""

    def completion_suffix(self, prompt: str, suffix: str) -> str | None:
        return None


def plain_messages(messages: list[Any]) -> bool:
    """Whether vLLM's message parsing (`templating.build_conversation`, run before any renderer)
    could neither fail nor collect media on `messages`: text or no content, tool calls as a list
    of function-call objects. A renderer that reads the request messages rather than that
    conversation (Mistral, Harmony) has the pipeline skip building it then (its
    `conversation_unused`); errors still come from it."""
    for message in messages:
        if type(message) is not dict:
            return False
        content = message.get("content")
        if content is not None and type(content) is not str:
            return False
        calls = message.get("tool_calls")
        if calls is not None and message.get("role") == "assistant":
            if type(calls) is not list:
                return False
            for call in calls:
                if type(call) is not dict or call.get("type", "function") != "function":
                    return False
                if type(call.get("function")) is not dict:
                    return False
    return True
