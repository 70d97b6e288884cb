"""The O(new text) paths for a long string argument (llama3_json, granite's engine) give
the same deltas as parsing the whole call on every chunk, resume from a JSON round trip of the
state, and keep the state small. vLLM parity itself is in the goldens and compare_parsers."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from render_service.parsers import llama3_json
from render_service.parsers.protocols import ParserState

LONG = "Paris (is) {lovely}, in: the spring=, a=b  " * 12
JSON_TEXTS = [
    '{"name": "f", "parameters": {"a": "' + LONG + '", "b": {"c": "' + "deep, value " * 9 + '"}}}; '
    '{"name": "g", "arguments": {"q": "' + "zz, " * 30 + '", "n": 1}}',
    '{"name": "f", "arguments": {"s": "' + "x \\n y, " * 20 + '"}}',
]


def _stream(parser: Any, state_type: type[ParserState], text: str, sizes: list[int]) -> tuple[list[Any], int]:
    st = state_type()
    out: list[Any] = []
    largest = 0
    i = k = 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        delta = parser.feed(st, text[i : i + n], lambda j: f"id{j}")
        out.append(
            None if delta is None else ([(t.index, t.name, t.arguments) for t in delta.tool_calls], delta.content)
        )
        encoded = msgspec.json.encode(st)
        largest = max(largest, len(encoded))
        st = parser.load_state(json.loads(encoded))
        i += n
        k += 1
    out.append(parser.remaining_args(st))
    return out, largest


def _parsers(cls: type, state_type: type[ParserState]) -> tuple[Any, Any]:
    fast = cls.__new__(cls)
    slow = cls.__new__(cls)
    slow._enter_open_string = lambda st: None  # every chunk parses the whole call
    return fast, slow


@pytest.mark.parametrize(
    ("cls", "state_type", "texts"),
    [
        (llama3_json.Llama3JsonToolParser, llama3_json.Llama3JsonState, JSON_TEXTS),
    ],
)
def test_open_string_path_matches_full_parse(cls: type, state_type: type[ParserState], texts: list[str]) -> None:
    fast, slow = _parsers(cls, state_type)
    for text in texts:
        for seed in range(40):
            rng = random.Random(seed)
            sizes = [rng.randint(1, 9) for _ in range(rng.randint(1, 5))]
            got, _ = _stream(fast, state_type, text, sizes)
            want, _ = _stream(slow, state_type, text, sizes)
            assert got == want, (text[:40], sizes)


@pytest.mark.parametrize(
    ("cls", "state_type", "text"),
    [
        (
            llama3_json.Llama3JsonToolParser,
            llama3_json.Llama3JsonState,
            '{"name": "f", "arguments": {"s": "' + "plain words " * 400 + '"}}',
        ),
    ],
)
def test_state_stays_small_inside_a_long_string(cls: type, state_type: type[ParserState], text: str) -> None:
    fast, slow = _parsers(cls, state_type)
    got, largest = _stream(fast, state_type, text, [3])
    want, slow_largest = _stream(slow, state_type, text, [3])
    assert got == want
    assert slow_largest > len(text)  # the full parse keeps the call (and what was sent)
    assert largest < 1000
