"""DeepSeek-R1 reasoning parser (`deepseek_r1`): `<think>...</think>`.

Port of vLLM 0.33's `DeepSeekR1ReasoningParser` (+ `BaseThinkingReasoningParser`), changed where
vLLM's stream does not accumulate to its batch answer (docs/parsers.md, "Streaming accumulates
to the batch answer"):

- vLLM's batch splits the text at the marker *text* (`<think>`, `</think>`), its stream at the
  marker *token ids*, with chunking-dependent quirks (a multi-token chunk holding `<think>` but
  not `</think>` streams its whole text, marker included; a chunk holding both drops what
  precedes `<think>`). Here both split at the marker text, the stream finding it across chunk
  boundaries by holding back only a possible marker prefix at a chunk end (at most 7
  characters, kept in the state): reasoning is the text before the first `</think>` with the
  first `<think>` in it removed, content what follows.
- vLLM's batch also drops the text before the first `<think>`, and looks for that `<think>`
  anywhere in the output, after `</think>` too (`x</think>y<think>z` is all reasoning "z"): both
  are known only at the end, so batch follows the stream's rule above instead (deliberate).
- when the prompt already closed reasoning (`is_reasoning_end(prompt)`, e.g. a template that
  appends `<think></think>` with thinking off), the stream sends the whole output as content,
  as vLLM's does, but vLLM's batch still reads reasoning out of it up to a `</think>` that may
  come last: batch follows the stream (`batch_follows_prompt_end`, deliberate).
"""

from __future__ import annotations

from collections.abc import Sequence

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, partial_tag_overlap
from render_service.parsers.protocols import ParserState, ReasoningParser
from render_service.parsers.registry import register_reasoning_parser


class DeepSeekR1State(ParserState, tag="deepseek_r1/3"):
    seen_start: bool = False  # the first `<think>` (text) is behind us (or `</think>` was seen)
    held: str = ""  # a possible marker prefix at the end of the text so far (< 8 characters)


@register_reasoning_parser("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    version = 3  # 3: markers matched as text in streaming; batch follows the stream's rules
    state_type = DeepSeekR1State
    batch_follows_prompt_end = True
    start_token = "<think>"
    end_token = "</think>"

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        info = tokenizer
        start_id = info.token_to_id(self.start_token)
        end_id = info.token_to_id(self.end_token)
        if start_id is None or end_id is None:
            raise ValueError("deepseek_r1 reasoning parser could not locate think start/end tokens in the tokenizer")
        self.start_token_id: int = start_id
        self.end_token_id: int = end_id

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        """`is_reasoning_end(prompt)`: the last think token of the prompt is `</think>`."""
        start, end = self.start_token_id, self.end_token_id
        for tid in reversed(prompt_token_ids):
            if tid == start:
                return False
            if tid == end:
                return True
        return False

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        """`BaseThinkingReasoningParser.extract_content_ids`: the ids after `</think>`, if it
        is not the last id."""
        if self.end_token_id not in delta_ids[:-1]:
            return []
        return delta_ids[list(delta_ids).index(self.end_token_id) + 1 :]

    def _split(self, text: str, seen_start: bool) -> tuple[str, str | None, bool]:
        """(reasoning, content or None when `</think>` is not in `text`, whether `<think>` was
        removed): the rule stream and batch share."""
        end = text.find(self.end_token)
        head = text if end == -1 else text[:end]
        removed = False
        if not seen_start:
            i = head.find(self.start_token)
            if i != -1:
                head = head[:i] + head[i + len(self.start_token) :]
                removed = True
        return head, (None if end == -1 else text[end + len(self.end_token) :]), removed

    def stream(self, st: DeepSeekR1State, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        """`extract_reasoning_streaming` on the marker text, then whether reasoning ended."""
        text = st.held + delta_text
        st.held = ""
        reasoning, content, removed = self._split(text, st.seen_start)
        st.seen_start = st.seen_start or removed
        if content is None:
            # hold a suffix that may still become `</think>` (or, before it, `<think>`)
            keep = partial_tag_overlap(reasoning, self.end_token)
            if not st.seen_start:
                keep = max(keep, partial_tag_overlap(reasoning, self.start_token))
            if keep:
                st.held = reasoning[-keep:]
                reasoning = reasoning[:-keep]
            if not reasoning and len(delta_ids) == 1 and delta_ids[0] in (self.start_token_id, self.end_token_id):
                return None, False  # vLLM: a chunk that is one marker token yields nothing
            # (vLLM sends `reasoning: ""` for a chunk whose text is still empty, e.g. half a
            # multibyte character: so do we)
            return Delta(reasoning=reasoning), False
        st.seen_start = True
        if not reasoning and not content and len(delta_ids) == 1 and delta_ids[0] == self.end_token_id:
            return None, True  # vLLM: a chunk that is one marker token yields nothing
        return Delta(reasoning=reasoning, content=content or None), True

    def finish(self, st: DeepSeekR1State) -> Delta | None:
        """The stream ends still in reasoning: a held marker prefix is reasoning after all."""
        held, st.held = st.held, ""
        return Delta(reasoning=held) if held else None

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """Batch `extract_reasoning`, by the stream's rule (`_split`); vLLM does not look at the
        prompt here (`ChatParser.parse` does first: `batch_follows_prompt_end`)."""
        reasoning, content, _ = self._split(model_output, False)
        return reasoning, content or None
