"""Granite reasoning parser (`granite`): vLLM 0.33's `GraniteReasoningParser`.

Granite 3.x thinks in plain text: "Here is my thought process: ... Here is my response: ..."
("Here's" is accepted too). vLLM re-scans the whole output on every chunk; the facts that scan
yields are kept here as a few offsets and a 32-character window, so a chunk costs O(its text):

- reasoning starts only when the output begins exactly with the thought-process marker;
- the response starts at the first later ':' whose preceding text ends with "Here is my
  response" / "Here's my response"; the character before "Here" belongs to neither part;
- the deltas reproduce vLLM's chunk arithmetic exactly, including its quirks: text that looked
  like the start of a marker and was not is released as one piece (before the markers: the whole
  output so far, as content); a marker that arrives in the same chunk as reasoning text is emitted
  as reasoning; the transition chunk's reasoning is cut by vLLM's offset formula.

vLLM's `is_reasoning_end` is not implemented for Granite (it returns None), so in streaming the
reasoning phase never ends: the tool parser never runs and everything is reasoning or content as
this parser decides. Batch `extract_reasoning` is a regex over the whole text (both markers
required, anywhere in it; reasoning keeps the character before "Here"): streaming and batch differ
when the markers are not at the start, when no response marker follows, and by that character.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from render_service.parsers.base import Delta
from render_service.parsers.protocols import ParserState, ReasoningParser
from render_service.parsers.registry import register_reasoning_parser

THINK_STARTS = ("Here's my thought process:", "Here is my thought process:")
RESPONSE_STARTS = ("Here's my response:", "Here is my response:")
LONGEST_THINK = max(len(s) for s in THINK_STARTS)
WINDOW = 32  # > longest marker + "Here" look-back: enough to decide every rule above
REASONING_REGEX = re.compile(
    r"(?:Here's|Here is) my thought process:(.*?)(?:Here's|Here is) my response:(.*)", re.DOTALL
)


def _think_prefix(text: str) -> bool:
    return any(s.startswith(text) for s in THINK_STARTS)


def _response_prefix(text: str) -> bool:
    return any(s.startswith(text) for s in RESPONSE_STARTS)


class GraniteReasoningState(ParserState, tag="granite_reasoning/1"):
    """`length`: characters of output seen; `win`: its last WINDOW characters; `start`: where the
    reasoning starts (-1 before the thought-process marker); `colon`/`marker`: the response
    marker's ':' position and length (-1/0 before it)."""

    length: int = 0
    win: str = ""
    start: int = -1
    colon: int = -1
    marker: int = 0


@register_reasoning_parser("granite")
class GraniteReasoningParser(ReasoningParser):
    version = 1
    state_type = GraniteReasoningState

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool | None:
        # vLLM's GraniteReasoningParser leaves is_reasoning_end unimplemented: it returns None,
        # which render sends as `reasoning_ended: null` and the stream reads as "not ended".
        return None

    def _scan(self, st: GraniteReasoningState, prev_win: str, prev_len: int, delta: str) -> None:
        """Update `start` / `colon` with the ':' characters of `delta` (absolute offsets)."""
        base = prev_len - len(prev_win)  # absolute offset of prev_win[0]
        text = prev_win + delta
        i = text.find(":", len(prev_win))
        while i != -1 and st.colon < 0:
            pos = base + i
            if st.start < 0:
                head = text[: i + 1] if base == 0 else ""
                if pos < LONGEST_THINK and head in THINK_STARTS:
                    st.start = pos + 1
            else:
                chunk_start = max(base + max(0, i - 19), st.start)
                chunk = text[chunk_start - base : i]
                for marker in RESPONSE_STARTS:
                    if chunk[-len(marker) + 1 :] == marker[:-1]:
                        st.colon, st.marker = pos, len(marker)
                        break
            i = text.find(":", i + 1)

    def stream(self, st: GraniteReasoningState, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        prev_len, prev_win = st.length, st.win
        st.length = prev_len + len(delta_text)
        st.win = (prev_win + delta_text)[-WINDOW:]
        if st.colon < 0:
            self._scan(st, prev_win, prev_len, delta_text)
        out = self._delta(st, prev_win, prev_len, delta_text)
        if out is None or (not out.content and not out.reasoning):
            return None, False
        return out, False

    def _delta(self, st: GraniteReasoningState, prev_win: str, prev_len: int, delta: str) -> Delta | None:
        total = st.length
        if st.start < 0:
            reasoning_len = 0
            content_len = 0
        elif st.colon < 0:
            reasoning_len = total - st.start
            content_len = 0
        else:
            reasoning_len = max(0, st.colon - st.marker - st.start)
            content_len = total - (st.colon + 1)
        if reasoning_len == 0:  # vLLM: `if not reasoning`
            current = (prev_win + delta) if prev_len <= WINDOW else None
            is_sub = current is not None and _think_prefix(current)
            was_sub = prev_len <= WINDOW and _think_prefix(prev_win)
            if was_sub and not is_sub:
                # the whole output so far (it is at most WINDOW + delta long here)
                return Delta(content=prev_win + delta)
            if is_sub:
                return None
            return Delta(content=delta)
        if content_len == 0:
            return self._no_response(st, prev_win, prev_len, delta)
        # both markers seen
        delta_content = delta[-content_len:]
        reasoning_end = len(delta) - (content_len + st.marker)
        reasoning: str | None = None
        if reasoning_end >= 0:
            start_reasoning = reasoning_len + st.marker + content_len - 1
            start_offset = max(0, start_reasoning - (total - len(delta)))
            reasoning = delta[start_offset:reasoning_end]
        return Delta(reasoning=reasoning, content=delta_content)

    def _no_response(self, st: GraniteReasoningState, prev_win: str, prev_len: int, delta: str) -> Delta | None:
        current = prev_win + delta
        if any(current.endswith(m) for m in RESPONSE_STARTS):
            return None
        # vLLM: previous_text = reasoning[:-len(delta)] ("" for an empty delta)
        prev_end = max(st.start, prev_len) if delta else st.start
        prev_tail = ""
        if prev_end > st.start:
            lo = max(st.start, prev_len - len(prev_win))
            prev_tail = prev_win[lo - (prev_len - len(prev_win)) : prev_end - (prev_len - len(prev_win))]
        prev_idx = prev_tail.rfind("Here")
        delta_idx = delta.rfind("Here")
        prev_was = prev_idx >= 0 and _response_prefix(prev_tail[prev_idx:])
        continues = prev_idx >= 0 and _response_prefix(prev_tail[prev_idx:] + delta)
        new_sub = delta_idx >= 0 and _response_prefix(delta[delta_idx:])
        if continues:
            return None
        if not prev_was:
            return Delta(reasoning=delta[:delta_idx] if new_sub else delta)
        if new_sub:
            return Delta(reasoning=prev_tail[prev_idx:] + delta[:delta_idx])
        return Delta(reasoning=prev_tail[prev_idx:] + delta)

    def flush_on_transition(self, st: GraniteReasoningState) -> Delta | None:
        return None

    def finish(self, st: GraniteReasoningState) -> Delta | None:
        return None

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        match = REASONING_REGEX.search(model_output)
        if match is None:
            return None, model_output
        reasoning, content = match.group(1), match.group(2)
        return reasoning, content or None
