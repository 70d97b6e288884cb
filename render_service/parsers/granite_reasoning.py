"""Granite reasoning parser (`granite`): vLLM 0.33's `GraniteReasoningParser`, made to
accumulate to its batch answer (issue 16, docs/parsers.md "Streaming accumulates to the batch
answer").

Granite 3.x thinks in plain text: "Here is my thought process: ... Here is my response: ..."
("Here's" is accepted too).

vLLM's batch `extract_reasoning` is a regex over the whole text: both markers, anywhere in it;
reasoning is the text between them, content the text after the response marker; without both,
everything is content. vLLM's stream re-scans the whole output on every chunk: reasoning only
when the output begins with the thought-process marker, the character before "Here" of the
response marker in neither part, and (`is_reasoning_end` not implemented) the reasoning phase
never ends, so a tool parser never runs. The two disagree whenever the markers are not at the
start, no response marker follows, or by that character.

Ours decides as the stream can (ACC.md rule 2 for what only the end of the output could decide,
listed as a deliberate batch difference, `tests/parsers/deliberate.py`):

- the output is reasoning only if it begins with a thought-process marker (while it is still a
  prefix of one it is held; else it is content from the start, handed to the tool parser);
- reasoning runs to the first response marker (found across chunks by holding back only a
  possible marker prefix, at most 19 characters, in the state), or to the end of the output
  when none comes (vLLM's batch would make all of it content: known only at the end);
- the text after the response marker is content, handed to the tool parser (reasoning ends).

Batch follows the same rule, so the stream accumulates to it. A chunk costs O(its text).
"""

from __future__ import annotations

from collections.abc import Sequence

from render_service.parsers.base import Delta
from render_service.parsers.protocols import ParserState, ReasoningParser
from render_service.parsers.registry import register_reasoning_parser

THINK_STARTS = ("Here's my thought process:", "Here is my thought process:")
RESPONSE_STARTS = ("Here's my response:", "Here is my response:")
LONGEST_THINK = max(len(s) for s in THINK_STARTS)

HEAD, REASONING = 0, 1


def _think_prefix(text: str) -> bool:
    return any(s.startswith(text) for s in THINK_STARTS)


def _first_response(text: str, start: int = 0) -> tuple[int, int]:
    """(position, length) of the first response marker in `text` from `start`, or (-1, 0)."""
    best, length = -1, 0
    for marker in RESPONSE_STARTS:
        i = text.find(marker, start)
        if i >= 0 and (best < 0 or i < best):
            best, length = i, len(marker)
    return best, length


def _held_suffix(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a response marker."""
    for n in range(min(len(text), max(len(m) for m in RESPONSE_STARTS) - 1), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in RESPONSE_STARTS):
            return n
    return 0


def split(model_output: str) -> tuple[str | None, str | None]:
    """The rule both sides keep: (reasoning, content)."""
    for marker in THINK_STARTS:
        if model_output.startswith(marker):
            rest = model_output[len(marker) :]
            at, length = _first_response(rest)
            if at < 0:
                return rest, None
            return rest[:at], rest[at + length :] or None
    return None, model_output


class GraniteReasoningState(ParserState, tag="granite_reasoning/2"):
    """`phase`: HEAD while the output may still become the thought-process marker (`pend` is the
    output so far), then REASONING (`pend` is the held possible response-marker prefix)."""

    phase: int = HEAD
    pend: str = ""


@register_reasoning_parser("granite")
class GraniteReasoningParser(ReasoningParser):
    version = 2  # 2: accumulates to the batch answer, which follows the stream's rule
    state_type = GraniteReasoningState

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool | None:
        # vLLM's GraniteReasoningParser leaves is_reasoning_end unimplemented: it returns None,
        # which render sends as `reasoning_ended: null` and the stream reads as "not ended".
        return None

    def stream(self, st: GraniteReasoningState, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        if st.phase == HEAD:
            head = st.pend + delta_text
            marker = next((m for m in THINK_STARTS if head.startswith(m)), None)
            if marker is None:
                if _think_prefix(head):
                    st.pend = head  # may still become the marker
                    return None, False
                # Not reasoning: all of it is content, for the tool parser.
                st.pend = ""
                return (Delta(content=head) if head else None), True
            st.phase, st.pend = REASONING, ""
            delta_text = head[len(marker) :]
        text = st.pend + delta_text
        at, length = _first_response(text)
        if at >= 0:
            st.pend = ""
            reasoning, content = text[:at], text[at + length :]
            return Delta(reasoning=reasoning or None, content=content or None), True
        keep = _held_suffix(text)
        st.pend = text[len(text) - keep :] if keep else ""
        out = text[: len(text) - keep]
        return (Delta(reasoning=out) if out else None), False

    def flush_on_transition(self, st: GraniteReasoningState) -> Delta | None:
        return None

    def finish(self, st: GraniteReasoningState) -> Delta | None:
        """The end of a stream still undecided or in reasoning: what was held."""
        out, st.pend = st.pend, ""
        if not out:
            return None
        return Delta(content=out) if st.phase == HEAD else Delta(reasoning=out)

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        return split(model_output)
