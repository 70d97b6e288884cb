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
def test_long_string_argument_is_held_beside_a_bounded_snapshot(tok: Any, reasoning: str | None) -> None:
    # As many "(" as ")" in the value: the closing ")" outnumbers them and is dropped.
    pieces = ["word ", "(x) ", "y) ", "(z ", "é😀 ", "}, ", "<|", "\n"]
    value = "".join(pieces[i % len(pieces)] for i in range(2400))
    segments = ["@<|channel>", "thought\nplan", "@<channel|>", "@<|tool_call>", "call:get_weather{city:", '@<|"|>']
    segments += [value, '@<|"|>', ",n:3)", "@<tool_call|>", "@<turn|>"]
    ids = cases.encode(tok, segments)
    parser = parsers.get_parser(tok, reasoning, "gemma4", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    # The call's text is held until it ends (it goes out whole, as batch converts it), in a
    # segment beside the snapshot: each snapshot stays small and writes only its own chunk's text.
    deltas, sizes, writes = cases.stream_through_snapshots(parser, [], ids, opts)
    calls = [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls]
    assert len(ids) > 2400
    assert max(sizes) < 1500, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])
    batch = cases.run_batch(tok, parser, cases.REQ["auto"], [], ids, "stop")
    assert calls == [("get_weather", batch["tool_calls"][0][1])]
    assert json.loads(calls[0][1]) == {"city": value, "n": 3}
    streamed = "".join((d.reasoning or "") for d in deltas if d is not None)
    assert streamed == (batch["reasoning"] or "") == ("plan" if reasoning else "")


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


# (prompt, output segments, reasoning parser, tool parser) -> the batch answer our stream adds up to
_OPEN = ["@<|turn>", "model\n", "@<|channel>", "thought\n"]  # the template opened the thought channel
_CLOSED = ["@<|turn>", "model\n"]
_EOS = (fixture.IDS["<turn|>"], frozenset((fixture.IDS["<turn|>"], fixture.IDS["<eos>"])))
_CHANNEL_CASES = [
    # the output's start opens the channel: held while it may still become "thought\n"
    (_CLOSED, [("chars", "thought\nplan"), "@<channel|>", "ok"], "gemma4", None, ("plan", "ok")),
    (_CLOSED, [("chars", "thought")], "gemma4", None, (None, None)),
    (_CLOSED, [("chars", "thoughtful ok")], "gemma4", None, (None, "thoughtful ok")),
    # the prompt opened it; the channel's head "thought\n" (spelled by ordinary tokens) is dropped
    (_OPEN, ["plan", "@<channel|>", "ok"], "gemma4", None, ("plan", "ok")),
    (_CLOSED, ["@<|channel>", ("chars", "thought\nplan \n"), "@<channel|>", "ok"], "gemma4", None, ("plan", "ok")),
    # rule 2: a <channel|> after text that did not open the channel is dropped, the text is content
    # (vLLM's batch makes it reasoning, its stream only when <channel|> is in the first chunk)
    (_CLOSED, ["plan", "@<channel|>", "ok"], "gemma4", None, (None, "planok")),
    (_CLOSED, ["plan", "@<channel|>", "ok"], None, "gemma4", (None, "plan<channel|>ok")),
    # markers by text, as batch matches them: a <|channel> spelled by ordinary tokens opens it
    (_CLOSED, ["a ", ("chars", "<|channel>"), "b", ("chars", "<channel|>"), "c"], "gemma4", None, ("b", "a c")),
    # behind the reasoning parser, a content that starts with "thought\n" is the tool pass's reasoning
    (_CLOSED, ["@<|channel>", "x", "@<channel|>", ("chars", "thought\n"), "y"], "gemma4", "gemma4", ("x", None)),
]


@pytest.mark.parametrize(("prompt", "segments", "reasoning", "tool", "expected"), _CHANNEL_CASES)
def test_stream_accumulates_to_the_batch_answer(
    tok: Any,
    prompt: list[Any],
    segments: list[Any],
    reasoning: str | None,
    tool: str | None,
    expected: tuple[str | None, str | None],
) -> None:
    ids = cases.encode(tok, [*segments, "@<turn|>"])
    prompt_ids = cases.encode(tok, prompt)
    parser = parsers.get_parser(tok, reasoning, tool, enable_auto_tools=True)
    assert parser is not None
    batch = cases.run_batch(tok, parser, cases.REQ["auto"], prompt_ids, ids, "stop", eos=_EOS)
    assert (batch["reasoning"], batch["content"]) == expected
    for how in ("one", "all", [2, 1, 3]):
        chunks = cases.chunk(ids, how)
        steps = cases.run_stream(
            tok, parser, cases.REQ["auto"], prompt_ids, chunks, "stop", roundtrip_every=1, eos=_EOS
        )
        joined = cases.concat(steps)
        assert (joined["reasoning"] or None, joined["content"] or None) == expected, how


def test_batch_without_the_prompt_is_vllms(tok: Any) -> None:
    # Without the prompt a stream of the request would check (neither the request's nor the
    # generate response's), batch keeps vLLM's rule: a <channel|> anywhere opens the channel.
    parser = parsers.get_parser(tok, "gemma4", "gemma4", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    closed = cases.encode(tok, _CLOSED)
    assert parser.parse_batch("plan<channel|>ok", opts, None, (), None)[:2] == ("plan", "ok")
    assert parser.parse_batch("plan<channel|>ok", opts, None, (), closed)[:2] == (None, "planok")
    opened = cases.encode(tok, _OPEN)
    assert parser.parse_batch("plan", opts, None, (), None)[:2] == (None, "plan")
    assert parser.parse_batch("plan", opts, None, (), opened)[:2] == ("plan", None)
