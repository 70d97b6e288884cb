"""Nemotron V3 reasoning parser (`nemotron_v3`): vLLM 0.33's `NemotronV3ParserReasoningAdapter`.

Nemotron 3 uses Qwen3's format (`<think>`/`</think>` + `<tool_call>`), and vLLM's parser is the
Qwen3 engine config with two differences, both kept here on top of `qwen3.py`'s port:

- `strip_trailing_reasoning_whitespace`: batch reasoning is `rstrip()`ped (vLLM's stream strips
  each delta and drops the held whitespace when reasoning ends; its final flush is not stripped);
- with `enable_thinking` false or `force_nonempty_content` true in the request's chat template
  kwargs ("force" mode): batch swaps reasoning and content when the content is empty or
  whitespace (vLLM's stream instead sends, when it finishes still in reasoning, all the reasoning
  it streamed once more as content: `get_streaming_fallback_content`).

The stream accumulates to the batch answer (docs/parsers.md, "Streaming accumulates to the batch
answer"): it is batch's engine pass over the whole output, chunk by chunk (`after_end` from the
first chunk, `streams_whole_output`): markers by text (a possible marker prefix held at a chunk
end, as batch's lexer holds it), the reasoning's trailing whitespace held until more reasoning
text follows and dropped at the end. In force mode blank content is held until non-blank content
arrives; an output that ends with blank content gets, in its last delta, the reasoning sent so
far once more as content (with none sent, the held blank content as reasoning: vLLM's swap). Our
batch answer there keeps the reasoning as reasoning too, where vLLM's moves the blank content into
it (the stream cannot take back the reasoning it sent: a deliberate difference,
tests/parsers/deliberate.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta
from render_service.parsers.held import HeldText
from render_service.parsers.qwen3 import CONTENT, EV_REASONING, EV_TEXT, REASONING, Qwen3ReasoningParser, Qwen3State
from render_service.parsers.registry import register_reasoning_parser

THINKING, FORCE_CONTENT = 1, 2  # bits of the mode `thinking_enabled_for` returns


class NemotronV3State(Qwen3State, tag="nemotron_v3/2"):
    """Qwen3's engine state plus what the stream holds: `dreason` (the reasoning's trailing
    whitespace), and in force mode `held_blank` (blank content, until non-blank content comes),
    `content_sent` (non-blank content went out) and `streamed` (the reasoning sent so far, beside
    the snapshot: it goes out once more as content when the content stays blank)."""

    dreason: str = ""
    held_blank: str = ""
    content_sent: bool = False
    streamed: HeldText = msgspec.field(default_factory=HeldText)


@register_reasoning_parser("nemotron_v3")
class NemotronV3ReasoningParser(Qwen3ReasoningParser):
    version = 3  # the stream is batch's pass over the whole output (accumulates to it)
    state_type = NemotronV3State
    streams_whole_output = True

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

    def after_end(self, st: NemotronV3State, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:  # type: ignore[override]
        """One chunk of batch's pass (`extract`), from the first chunk on (`streams_whole_output`)."""
        if not self.thinking_enabled:
            events = [(EV_TEXT, text)] if text else []
        else:
            events = self._feed(st, text, ())
            if finished:
                events.extend(self._finish(st))
        reasoning = "".join(v for k, v in events if k == EV_REASONING)
        content = "".join(v for k, v in events if k == EV_TEXT)
        # Batch strips the trailing whitespace of all the reasoning, once.
        if reasoning or finished:
            combined = st.dreason + reasoning
            reasoning = combined.rstrip()
            st.dreason = "" if finished else combined[len(reasoning) :]
        if self.force_content:
            st.streamed.append(reasoning)
            if not st.content_sent:
                combined = st.held_blank + content
                if combined.strip():
                    st.content_sent, st.held_blank, content = True, "", combined
                else:
                    st.held_blank, content = combined, ""
            if finished and not st.content_sent:
                # Batch's swap: the content is blank, so the reasoning is the content.
                if st.streamed:
                    content = st.streamed.text()
                else:
                    reasoning = st.held_blank
                st.held_blank = ""
        if not reasoning and not content:
            return None
        return Delta(content=content or None, reasoning=reasoning or None)

    def fallback_content(self, st: NemotronV3State) -> str | None:
        """Never reached: the stream is past reasoning from its first chunk (`after_end`)."""
        return None

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
            # vLLM swaps reasoning and content. With reasoning, ours keeps it as reasoning too,
            # as the stream sent it (deliberate: tests/parsers/deliberate.py NEMOTRON_FORCE).
            reasoning, content = (reasoning, reasoning) if reasoning else (content, reasoning)
        return reasoning, content
