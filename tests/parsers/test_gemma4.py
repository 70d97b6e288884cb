"""Gemma 4 (`gemma4` reasoning and tools) beyond the vLLM goldens (golden_families/gemma4.jsonl,
tests/parity/golden_parsers/gemma4/): the state stays small while a long string argument full of
parentheses streams (the elided middle keeps the converter's `)`/`(` balance), the render-side
effects, and the argument syntax's converter on its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.parsers import gemma4
from render_service.parsers.protocols import RequestAdjustment
from tests.parsers import cases
from tests.parsers.families import gemma4 as fixture


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    folder = fixture.build(Path(tmp_path_factory.mktemp("gemma4")))
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("reasoning", ["gemma4", None])
def test_long_string_argument_streams_through_a_bounded_state(tok: Any, reasoning: str | None) -> None:
    # As many "(" as ")" in the value: the closing ")" outnumbers them and is dropped.
    pieces = ["word ", "(x) ", "y) ", "(z ", "é😀 ", "}, ", "<|", "\n"]
    value = "".join(pieces[i % len(pieces)] for i in range(2400))
    segments = ["@<|channel>", "thought\nplan", "@<channel|>", "@<|tool_call>", "call:get_weather{city:", '@<|"|>']
    segments += [value, '@<|"|>', ",n:3)", "@<tool_call|>", "@<turn|>"]
    ids = cases.encode(tok, segments)
    parser = parsers.get_parser(tok, reasoning, "gemma4", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    sizes, args = cases.stream_sizes(parser, [], ids, opts)
    assert len(ids) > 2400
    assert max(sizes) < 1500, max(sizes)
    batch = cases.run_batch(tok, parser, cases.REQ["auto"], [], ids, "stop")
    assert batch["tool_calls"] == [["get_weather", args]]
    assert json.loads(args) == {"city": value, "n": 3}


def test_every_request_keeps_special_tokens() -> None:
    for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}}, "none"):
        adjustment = parsers.adjust_request("gemma4", "gemma4", RequestAdjustment(True, choice, None))
        assert adjustment.skip_special_tokens is False
    assert parsers.tool_parser_class("gemma4").supports_required_and_named is False


@pytest.mark.parametrize(
    ("raw", "partial", "expected"),
    [
        ('city:<|"|>Paris<|"|>,n:3}', False, {"city": "Paris", "n": "3"}),
        ('a:{b:[1,<|"|>x, y<|"|>],c:true}}', False, {"a": {"b": ["1", "x, y"], "c": "true"}}),
        ('q:<|"|>(a) b)<|"|>)', False, {"q": "(a) b)"}),
        ('city:<|"|>Par<|', True, {"city": "Par"}),
        ("n:108.", True, {}),
        ("n:3", True, {}),
        ("n:", False, {"n": ""}),
    ],
)
def test_argument_syntax(raw: str, partial: bool, expected: dict[str, Any]) -> None:
    assert json.loads(gemma4.gemma4_arg_converter(raw, partial)) == expected
