"""Granite reasoning (`parsers/granite_reasoning.py`) accumulates to its batch answer: the
thought marker at the start, the response marker found across chunks (only a possible marker
prefix held, in the state), any chunking with the state JSON round-tripped, a stream resumed
mid-hold, and the batch rule the stream keeps (ACC.md rule 2, tests/parsers/deliberate.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from render_service.parsers import granite_reasoning as gr

TEXTS = [
    "Here is my thought process: a: b Here is my response: fine ü",
    "Here's my thought process:\nHere is my resp Here's my response:",
    "Here is my thought process: never answered Here is my resp",  # no response marker: reasoning
    "Here is my thought process:",
    "Here is my",  # a prefix of the marker, then the end: content
    "Plain answer. Here is my thought process: x Here is my response: y",  # not at the start: content
    " Here is my thought process: x Here is my response: y",
    "",
]


def _parser() -> gr.GraniteReasoningParser:
    return gr.GraniteReasoningParser.__new__(gr.GraniteReasoningParser)


def _stream(text: str, sizes: list[int]) -> tuple[str, str, int]:
    """(reasoning, content, the chunk where reasoning ended or -1)."""
    parser = _parser()
    st = gr.GraniteReasoningState()
    reasoning = content = ""
    ended_at = -1
    i = k = 0
    while i < len(text) and ended_at < 0:
        piece = text[i : i + sizes[k % len(sizes)]]
        delta, ended = parser.stream(st, piece, ())
        st = msgspec.convert(json.loads(msgspec.json.encode(st)), gr.GraniteReasoningState)
        if delta is not None:
            reasoning += delta.reasoning or ""
            content += delta.content or ""
        i += len(piece)
        if ended:
            ended_at = k
        k += 1
    if ended_at >= 0:
        content += text[i:]  # after reasoning ends the text goes to the tool parser, as content
    else:
        end = parser.finish(st)
        if end is not None:
            reasoning += end.reasoning or ""
            content += end.content or ""
    return reasoning, content, ended_at


@pytest.mark.parametrize("text", TEXTS)
def test_stream_accumulates_to_batch_under_any_chunking(text: str) -> None:
    want_reasoning, want_content = _parser().extract(text)
    for sizes in [[1], [2], [5, 1], [len(text) or 1], *([random.Random(s).randint(1, 9)] for s in range(15))]:
        reasoning, content, _ = _stream(text, sizes)
        assert (reasoning, content) == (want_reasoning or "", want_content or ""), (text, sizes)


def test_batch_follows_the_stream_rule() -> None:
    parser = _parser()
    # vLLM's batch: reasoning " x ", content " y" (markers found anywhere); ours: content
    assert parser.extract("Plain. Here is my thought process: x Here is my response: y") == (
        None,
        "Plain. Here is my thought process: x Here is my response: y",
    )
    # vLLM's batch: all content (no response marker); ours: reasoning, as streamed
    assert parser.extract("Here's my thought process: thinking") == (" thinking", None)
    # the character before "Here" stays reasoning (vLLM's stream drops it)
    assert parser.extract("Here is my thought process: a Here is my response: b") == (" a ", " b")


def test_reasoning_ends_at_the_response_marker_for_the_tool_parser() -> None:
    parser = _parser()
    st = gr.GraniteReasoningState()
    delta, ended = parser.stream(st, "Here is my thought process: plan Here is my re", ())
    assert delta is not None and delta.reasoning == " plan " and not ended  # "Here is my re" held
    delta, ended = parser.stream(st, 'sponse: <|tool_call|>[{"name"', ())
    assert ended and delta is not None and delta.reasoning is None
    assert delta.content == ' <|tool_call|>[{"name"'


def test_no_thought_marker_hands_everything_to_the_tool_parser() -> None:
    parser = _parser()
    st = gr.GraniteReasoningState()
    assert parser.stream(st, "Here is", ()) == (None, False)  # may still be the marker
    delta, ended = parser.stream(st, " the answer", ())
    assert ended and delta is not None and delta.content == "Here is the answer"


def test_resume_mid_hold() -> None:
    parser = _parser()
    st = gr.GraniteReasoningState()
    parser.stream(st, "Here is my thought process: p Here's my res", ())
    obj: Any = json.loads(msgspec.json.encode(st))
    assert "Here's my res" in json.dumps(obj)
    resumed = msgspec.convert(obj, gr.GraniteReasoningState)
    delta, ended = parser.stream(resumed, "ponse: ok", ())
    assert ended and delta is not None and delta.content == " ok" and not delta.reasoning
