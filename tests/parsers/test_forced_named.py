"""tool_choice named on vLLM's JSON path (`parsers/forced.py`): the stream announces the named
call only once the output is more than whitespace, so it accumulates to the batch answer (no
call for a blank output, the whitespace leading the arguments otherwise), under any chunking and
with the state JSON round-tripped between chunks (issue 16, docs/parsers.md)."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from render_service.parsers import forced


def _stream(text: str, sizes: list[int]) -> tuple[list[list[str | None]], list[int]]:
    """(calls as [id, name, arguments], the chunk indexes that sent something)."""
    st = forced.RequiredScan()
    calls: list[list[str | None]] = []
    sent: list[int] = []
    i = k = 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        delta = forced.named_feed(st, text[i : i + n], "get_weather", lambda j: f"id{j}")
        st = msgspec.convert(json.loads(msgspec.json.encode(st)), forced.RequiredScan)
        if delta is not None:
            sent.append(k)
            for tc in delta.tool_calls:
                if tc.name is not None:
                    calls.append([tc.id, tc.name, ""])
                calls[tc.index][2] = (calls[tc.index][2] or "") + (tc.arguments or "")
        i, k = i + n, k + 1
    return calls, sent


def _batch(text: str) -> list[list[str | None]]:
    """`ChatParser._extract_tool_calls` for named: no call for a blank output, else the whole
    text as the named call's arguments."""
    return [] if not text.strip() else [["id0", "get_weather", text]]


@pytest.mark.parametrize("text", ["", "\n", " \n\t ", '{"city": "Paris"}', '\n\n {"city": "Pa ris"} ', " x"])
def test_named_stream_accumulates_to_batch_under_any_chunking(text: str) -> None:
    for sizes in [[1], [2], [3, 1], [len(text) or 1], *([random.Random(s).randint(1, 5)] for s in range(10))]:
        assert _stream(text, sizes)[0] == _batch(text), (text, sizes)


def test_blank_output_sends_nothing_then_the_call_with_the_whitespace() -> None:
    calls, sent = _stream('\n\n{"a": 1}', [1])
    assert calls == [["id0", "get_weather", '\n\n{"a": 1}']]
    assert sent[0] == 2  # the two newlines waited for the "{"
    assert _stream("\n \n", [1]) == ([], [])
