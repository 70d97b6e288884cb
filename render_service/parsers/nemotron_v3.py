"""Nemotron V3 reasoning parser (`nemotron_v3`): vLLM 0.33's `NemotronV3ParserReasoningAdapter`.

Nemotron 3 uses Qwen3's format (`<think>`/`</think>` + `<tool_call>`), and vLLM's parser is the
Qwen3 engine config with two differences, both kept here on top of `qwen3.py`'s port:

- `strip_trailing_reasoning_whitespace`: trailing whitespace of each streamed reasoning delta is
  held back until more reasoning follows (then emitted in front of it) and dropped when reasoning
  ends or the stream finishes (the engine's final flush is not stripped); batch reasoning is
  `rstrip()`ped;
- with `enable_thinking` false or `force_nonempty_content` true in the request's chat template
  kwargs: batch swaps reasoning and content when the content is empty or whitespace, and a
  stream that finishes still in reasoning gets all the reasoning it streamed (before stripping)
  once more, as content, in its last delta (vLLM's `get_streaming_fallback_content`). Only then
  does the state keep the streamed reasoning text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta
from render_service.parsers.qwen3 import CONTENT, EV_REASONING, EV_TEXT, REASONING, Qwen3ReasoningParser, Qwen3State
from render_service.parsers.registry import register_reasoning_parser

THINKING, FORCE_CONTENT = 1, 2  # bits of the mode `thinking_enabled_for` returns


class NemotronV3State(Qwen3State, tag="nemotron_v3/1"):
    """Qwen3's engine state plus `dreason` (trailing reasoning whitespace held back) and
    `streamed` (the reasoning streamed so far, kept only when content may be forced)."""

    dreason: str = ""
    streamed: str = ""


@register_reasoning_parser("nemotron_v3")
class NemotronV3ReasoningParser(Qwen3ReasoningParser):
    version = 2
    state_type = NemotronV3State

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool | int = True) -> None:
        mode = int(thinking_enabled)
        super().__init__(tokenizer, thinking_enabled=bool(mode & THINKING))
        self.force_content = bool(mode & FORCE_CONTENT)

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """A mode, not only a flag: THINKING (vLLM reads `enable_thinking`, default on) and
        FORCE_CONTENT (`enable_thinking is False` or `force_nonempty_content is True`)."""
        thinking = bool(template_kwargs.get("enable_thinking", True))
        force = template_kwargs.get("enable_thinking") is False or template_kwargs.get("force_nonempty_content") is True
        return THINKING * thinking | FORCE_CONTENT * force  # type: ignore[return-value]

    def new_state(self) -> NemotronV3State:
        return NemotronV3State(state=REASONING if self.thinking_enabled else CONTENT)

    def _strip(self, st: NemotronV3State, delta: Delta | None) -> Delta | None:
        """`ParserEngine._strip_trailing_reasoning` (after recording the raw reasoning)."""
        if delta is not None and delta.reasoning is not None:
            if self.force_content:
                st.streamed += delta.reasoning
            combined = st.dreason + delta.reasoning
            trimmed = combined.rstrip()
            st.dreason = combined[len(trimmed) :]
            delta.reasoning = trimmed or None
            if delta.reasoning is None and delta.content is None and not delta.tool_calls:
                return None
        elif st.dreason and st.ended:
            st.dreason = ""
        return delta

    def stream(self, st: NemotronV3State, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:  # type: ignore[override]
        delta, _ = super().stream(st, delta_text, delta_ids)
        return self._strip(st, delta), st.ended

    def flush_on_transition(self, st: NemotronV3State) -> Delta | None:  # type: ignore[override]
        """`finish_streaming()`: not stripped (only recorded for the fallback)."""
        delta = super().flush_on_transition(st)
        if delta is not None and delta.reasoning is not None and self.force_content:
            st.streamed += delta.reasoning
        return delta

    finish = flush_on_transition  # type: ignore[assignment]

    def fallback_content(self, st: NemotronV3State) -> str | None:
        """`get_streaming_fallback_content` at the end of a stream still in reasoning."""
        return (st.streamed or None) if self.force_content else None

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        reasoning: str | None
        content: str | None
        if not self.thinking_enabled:
            reasoning, content = None, model_output
        else:
            prompt_closes = (
                prompt_token_ids is not None
                and bool(self.boundary_ids)
                and self.prompt_ends_reasoning(prompt_token_ids)
            )
            st = Qwen3State(state=CONTENT if prompt_closes else REASONING)
            events = self._feed(st, model_output, ())
            events.extend(self._finish(st))
            raw = "".join(v for k, v in events if k == EV_REASONING).rstrip()
            reasoning = raw or None
            content = "".join(v for k, v in events if k == EV_TEXT) or None
        if self.force_content and (content is None or not content.strip()):
            reasoning, content = content, reasoning
        return reasoning, content
