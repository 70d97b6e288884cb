"""Step3 reasoning (`step3`): vLLM 0.33's `Step3ReasoningParser`.

The output is reasoning from its first token up to the `</think>` token (the model writes no
opening marker), content after it. Reasoning ends in the chunk whose token ids hold `</think>`;
render still reports a prompt holding `</think>` anywhere (an earlier turn too) as closing
reasoning (vLLM's `is_reasoning_end`), but the stream, like batch, ignores the prompt: batch
without `</think>` is all reasoning (vLLM's stream sends it all as content there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta
from render_service.parsers.protocols import ParserState, ReasoningParser
from render_service.parsers.registry import register_reasoning_parser

THINK_END = "</think>"


class Step3State(ParserState, tag="step3/1"):
    pass  # vLLM reads only the chunk's own ids and text


@register_reasoning_parser("step3")
class Step3ReasoningParser(ReasoningParser):
    version = 2  # streams accumulate to the batch answer
    state_type = Step3State

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        end_id = tokenizer.token_to_id(THINK_END)
        if end_id is None:
            raise ValueError("Step3 reasoning parser could not locate think end token in the tokenizer!")
        self.end_id = end_id

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        return self.end_id in prompt_token_ids

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        """Batch ignores the prompt (reasoning until `</think>`): so does the stream, which
        then accumulates to the batch answer (vLLM streams it all as content)."""
        return False

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        if self.end_id not in delta_ids:
            return Delta(reasoning=delta_text), False
        if len(delta_ids) == 1:
            return None, True
        # vLLM slices at the marker's text position, -1 when the text does not spell it.
        at = delta_text.find(THINK_END)
        return Delta(reasoning=delta_text[:at], content=delta_text[at + len(THINK_END) :] or None), True

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        if self.end_id not in delta_ids[:-1]:
            return []
        return delta_ids[list(delta_ids).index(self.end_id) + 1 :]

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        reasoning, marker, content = model_output.partition(THINK_END)
        return reasoning, (content or None) if marker else None
