"""Stop strings, applied by the gateway: a `--tokens-only` engine has no detokenizer and refuses them.

vLLM applies stop strings in its detokenizer (`BaseIncrementalDetokenizer.update`): after each
step it detokenizes the new tokens, looks for a stop string ending in the new text (past
`min_tokens`), and on a match drops the tokens after the one that completed it and finishes the
request with `finish_reason` "stop" and `stop_reason` the string. `StopWatch` does the same to the
engine's stream, choice by choice, so what reaches the converters is what a detokenizing engine
would have sent; the gateway then closes the engine stream (the engine aborts the request).

The text itself is cut and held back by the converters (`HeldText`), as vLLM's
`get_next_output_text` holds back `len(longest stop) - 1` characters so that a stream never shows
the start of a stop string that is about to match.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from render_service.derender.detokenize import (
    DetokState,
    check_stop_strings,
    detokenize_delta,
    seed_state,
)


def stop_strings(request: dict[str, Any]) -> tuple[str, ...]:
    """The request's `stop`, as SamplingParams normalizes it."""
    stop = request.get("stop")
    if not stop:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)


def without_stop_strings(body: dict[str, Any]) -> dict[str, Any]:
    """The rendered `GenerateRequest` as the engine can take it (stop strings are the gateway's)."""
    sampling = {**body["sampling_params"], "stop": []}
    sampling.pop("output_text_buffer_length", None)
    return {**body, "sampling_params": sampling}


@dataclass
class _Choice:
    detok: DetokState
    text: str = ""
    tokens: int = 0
    finished: bool = False


@dataclass
class StopWatch:
    """vLLM's stop-string check over an engine stream (`apply` each chunk; `done` when every
    choice has finished)."""

    tokenizer: Any
    prompt_ids: list[int]
    stop: tuple[str, ...]
    n: int = 1
    include_in_output: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    choices: dict[int, _Choice] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.choices) == self.n and all(c.finished for c in self.choices.values())

    def _choice(self, index: int) -> _Choice:
        choice = self.choices.get(index)
        if choice is None:
            choice = _Choice(seed_state(self.tokenizer, self.prompt_ids, self.skip_special_tokens))
            self.choices[index] = choice
        return choice

    def apply(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """`chunk` as a detokenizing engine would have sent it (a matched choice cut and finished;
        choices that finished earlier dropped)."""
        out = []
        for engine_choice in chunk.get("choices") or []:
            state = self._choice(int(engine_choice.get("index") or 0))
            if state.finished:
                continue
            out.append(self._update(state, engine_choice))
        return {**chunk, "choices": out}

    def _update(self, state: _Choice, engine_choice: dict[str, Any]) -> dict[str, Any]:
        ids: list[int] = list(engine_choice.get("token_ids") or [])
        finish = engine_choice.get("finish_reason")
        if finish is not None:
            state.finished = True
        if not ids:
            return engine_choice
        # A stop token the engine stopped on is not detokenized (unless it is to be shown).
        stop_terminated = finish == "stop" and not isinstance(engine_choice.get("stop_reason"), str)
        decoded = ids[:-1] if stop_terminated and not self.include_in_output else ids
        previous_tokens = state.tokens
        offsets = [len(state.text)]
        for token in decoded:
            piece, state.detok = detokenize_delta(
                self.tokenizer,
                [token],
                state.detok,
                skip_special_tokens=self.skip_special_tokens,
                spaces_between_special_tokens=self.spaces_between_special_tokens,
            )
            state.text += piece
            offsets.append(len(state.text))
        if len(decoded) < len(ids):
            offsets.append(len(state.text))
        state.tokens += len(ids)
        if state.tokens <= self.min_tokens:
            return engine_choice
        check_from = offsets[max(self.min_tokens - previous_tokens, 0)]
        match = check_stop_strings(state.text, len(state.text) - check_from, self.stop, self.include_in_output)
        if match is None:
            return engine_choice
        stop_string, truncate_to = match
        stop_end = len(state.text) if truncate_to == -1 else truncate_to
        if not self.include_in_output:
            stop_end += len(stop_string)
        kept = bisect_left(offsets, stop_end, lo=1)
        state.tokens = previous_tokens + kept
        state.finished = True
        if truncate_to != -1:
            state.text = state.text[:truncate_to]
        cut = {**engine_choice, "token_ids": ids[:kept], "finish_reason": "stop", "stop_reason": stop_string}
        logprobs = engine_choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            cut["logprobs"] = {**logprobs, "content": logprobs["content"][:kept]}
        return cut


@dataclass
class HeldText:
    """One choice's streamed text under stop strings: `len(longest stop) - 1` characters held back
    until the end, and the text cut at the stop string that finished it."""

    stop: tuple[str, ...]
    include_in_output: bool = False
    text: str = ""
    sent: int = 0

    @property
    def buffer_length(self) -> int:
        return 0 if self.include_in_output or not self.stop else max(len(s) for s in self.stop) - 1

    def push(self, piece: str, finish_reason: str | None, stop_reason: int | str | None) -> str:
        """The text to send for `piece` (the choice's newly decoded text)."""
        self.text += piece
        if finish_reason is None:
            limit = len(self.text) - self.buffer_length
            if limit <= self.sent:
                return ""
            out = self.text[self.sent : limit]
            self.sent = limit
            return out
        if finish_reason == "stop" and isinstance(stop_reason, str):
            match = check_stop_strings(self.text, len(piece), (stop_reason,), self.include_in_output)
            if match is not None and match[1] != -1:
                self.text = self.text[: match[1]]
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out
