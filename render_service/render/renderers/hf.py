"""The `hf` renderer: the model's Jinja chat template with Hugging Face's semantics."""

from __future__ import annotations

from typing import Any

from render_service.render import templating
from render_service.render.renderers.base import ChatInput, NoFillInTheMiddle, RenderedPrompt


class HfRenderer(NoFillInTheMiddle):
    mode: str = "hf"
    content_format: str | None = None
    needs_chat_template: bool = True

    def __init__(self, hf_tokenizer: Any) -> None:
        self._hf_tokenizer = hf_tokenizer

    def render(self, chat: ChatInput) -> RenderedPrompt:
        assert chat.chat_template is not None  # the pipeline refuses a request without one first
        kwargs = {k: v for k, v in chat.kwargs.items() if k not in ("tools", "chat_template", "tokenize")}
        prompt = templating.render_prompt(self._hf_tokenizer, chat.chat_template, chat.conversation, chat.tools, kwargs)
        return RenderedPrompt(text=prompt)
