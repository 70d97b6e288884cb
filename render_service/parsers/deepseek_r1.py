"""DeepSeek-R1 reasoning parser (`deepseek_r1`): `<think>...</think>` by token id.

Port of vLLM 0.33's `DeepSeekR1ReasoningParser` (+ `BaseThinkingReasoningParser`). vLLM's
version is stateless but asks `start_token_id in previous_token_ids` on every chunk (a scan of
all output ids); the only fact that scan yields is whether `<think>` was seen, kept here as one
bool. Output is identical chunk by chunk, including vLLM's chunking-dependent quirks:
- a chunk that is exactly one `<think>` or `</think>` token yields nothing;
- a multi-token chunk that contains `<think>` but not `</think>` yields its whole text as
  reasoning, `<think>` text included;
- batch `extract_reasoning` ignores the prompt (streaming does not: see `prompt_ends_reasoning`).
"""

from __future__ import annotations

from collections.abc import Sequence

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta
from render_service.parsers.protocols import ParserState, ReasoningParser
from render_service.parsers.registry import register_reasoning_parser


class DeepSeekR1State(ParserState, tag="deepseek_r1/2"):
    seen_start: bool = False  # `<think>` among the output ids so far


@register_reasoning_parser("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    version = 2
    state_type = DeepSeekR1State
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

    def _split_at_end(self, text: str) -> Delta:
        end_index = text.find(self.end_token)
        content = text[end_index + len(self.end_token) :]
        return Delta(reasoning=text[:end_index], content=content if content else None)

    def stream(self, st: DeepSeekR1State, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        """`extract_reasoning_streaming`, then whether reasoning ends in this chunk."""
        start, end = self.start_token_id, self.end_token_id
        start_prev = st.seen_start
        start_delta = start in delta_ids
        end_delta = end in delta_ids
        st.seen_start = start_prev or start_delta
        if len(delta_ids) == 1 and delta_ids[0] in (start, end):
            return None, end_delta
        # (an end token among previous ids would already have ended the reasoning phase)
        if start_prev:
            out = self._split_at_end(delta_text) if end_delta else Delta(reasoning=delta_text)
        elif start_delta:
            if end_delta:
                start_index = delta_text.find(self.start_token)
                end_index = delta_text.find(self.end_token)
                content = delta_text[end_index + len(self.end_token) :]
                out = Delta(
                    reasoning=delta_text[start_index + len(self.start_token) : end_index],
                    content=content if content else None,
                )
            else:
                out = Delta(reasoning=delta_text)
        else:  # DeepSeek-R1 override: no <think> at all means reasoning until </think>
            out = self._split_at_end(delta_text) if end_delta else Delta(reasoning=delta_text)
        return out, end_delta

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """Batch `extract_reasoning` (vLLM does not look at the prompt here)."""
        before, sep, after = model_output.partition(self.start_token)
        model_output = after if sep else before
        if self.end_token not in model_output:
            return model_output, None
        reasoning, _, content = model_output.partition(self.end_token)
        return reasoning, content or None
