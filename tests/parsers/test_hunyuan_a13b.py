"""Hunyuan A13B's native parsers (`render_service/parsers/hunyuan_a13b.py`) beyond the fuzzed goldens
(`golden_families/hunyuan_a13b.jsonl`, one token per chunk as vLLM's stream needs): any chunking
answers as batch does, vLLM's id shapes, the batch decisions, and resuming from every snapshot
while a long calls block is held."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.parsers import hunyuan_a13b as hy
from tests.parsers import cases
from tests.parsers.families import hunyuan

EOS = (hunyuan.A13B_IDS["<|eos|>"], frozenset({hunyuan.A13B_IDS["<|eos|>"]}))
CALLS = [{"name": "get_weather", "arguments": {"city": "東京 😀"}}, {"name": "search", "arguments": "{}"}]
TURN = [
    "@<think>",
    "\nNeed the weather.",
    "\n",
    "@</think>",
    "\n",
    "@<answer>",
    "\nChecking é",
    "@<tool_calls>",
    json.dumps(CALLS, ensure_ascii=False),
    "@</tool_calls>",
    "\n",
    "@</answer>",
    " dropped",
    "@<|eos|>",
]
REQ = {"tools": cases.TOOLS}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hunyuan.build_a13b(Path(tmp_path_factory.mktemp("a13b")))))


def _parser(tok: Any, config: tuple[str | None, str | None]) -> Any:
    parser = parsers.get_parser(tok, config[0], config[1], enable_auto_tools=True)
    assert parser is not None
    return parser


def _stream(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], chunks: list[list[int]]) -> dict:
    prompt = cases.encode(tok, hunyuan.A13B_PROMPTS["open"])
    steps = cases.run_stream(tok, _parser(tok, config), req, prompt, chunks, "stop", roundtrip_every=1, eos=EOS)
    calls = [(c.id, c.name, c.arguments) for d, _ in steps if d is not None for c in d.tool_calls if c.name]
    args = {c.index: c.arguments for d, _ in steps if d is not None for c in d.tool_calls if c.arguments}
    return {
        "reasoning": "".join((d.reasoning or "") for d, _ in steps if d is not None),
        "content": "".join((d.content or "") for d, _ in steps if d is not None),
        "calls": [(cid, name, args.get(i, "")) for i, (cid, name, _) in enumerate(calls)],
        "finish": steps[-1][1],
    }


def _chunkings(ids: list[int]) -> list[list[list[int]]]:
    return [[ids[i : i + size] for i in range(0, len(ids), size)] for size in (1, 2, 3, 5, 8, len(ids))]


def test_a_whole_turn_answers_the_same_under_any_chunking_with_vllms_id_shapes(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    prompt = cases.encode(tok, hunyuan.A13B_PROMPTS["open"])
    batch = cases.run_batch(tok, _parser(tok, ("hunyuan_a13b", "hunyuan_a13b")), REQ, prompt, ids, "stop", eos=EOS)
    assert (batch["reasoning"], batch["content"]) == ("Need the weather.", "Checking é")
    arguments = [json.dumps(CALLS[0]["arguments"], ensure_ascii=False), "{}"]
    assert batch["tool_calls"] == [["get_weather", arguments[0], "call_ID"], ["search", arguments[1], "call_ID"]]
    for chunks in _chunkings(ids):
        out = _stream(tok, ("hunyuan_a13b", "hunyuan_a13b"), REQ, chunks)
        assert (out["reasoning"], out["content"], out["finish"]) == ("Need the weather.", "Checking é", "tool_calls")
        assert [(name, args) for _, name, args in out["calls"]] == list(
            zip(["get_weather", "search"], arguments, strict=True)
        )
        for i, (call_id, _, _) in enumerate(out["calls"]):
            assert re.fullmatch(rf"call_{i}_[0-9a-f]{{16}}", call_id), call_id
    # the markers spelled out by ordinary tokens split the same way
    spelled = [("chars", s[1:]) if s.startswith("@<") and s != "@<|eos|>" else s for s in TURN]
    for chunks in _chunkings(cases.encode(tok, spelled))[:3]:
        out = _stream(tok, ("hunyuan_a13b", "hunyuan_a13b"), REQ, chunks)
        assert (out["reasoning"], out["content"], len(out["calls"])) == ("Need the weather.", "Checking é", 2)


def test_reasoning_rule_shared_by_stream_and_batch(tok: Any) -> None:
    split = hy.split_reasoning
    assert split("<think>\nr\n</think>\n<answer>\nc\n</answer>tail") == ("r", "c")
    assert split("<think>\nr\n</think>\n<answer>\nc") == ("r", "c")
    assert split("plain\n</answer>tail") == (None, "plain")
    assert split("") == (None, "")  # vLLM: the output as it is
    # Rule 2 (deliberate): an opened reasoning that never reaches the answer marker stays reasoning
    assert split("<think>\nstill thinking\n</answer>x") == ("still thinking\n</answer>x", None)
    # and a later `<think>\n` opens nothing
    assert split("a<think>\nb\n</think>\n<answer>\nc") == (None, "a<think>\nb\n</think>\n<answer>\nc")
    for text, expected in (("<think>\nstill thinking", ("still thinking", "")), ("<think", ("", "<think"))):
        ids = cases.encode(tok, [text])
        for chunks in _chunkings(ids):
            out = _stream(tok, ("hunyuan_a13b", None), {}, chunks)
            assert (out["reasoning"], out["content"]) == expected


def test_batch_takes_the_first_loadable_calls_region_outside_a_think_span() -> None:
    ok = '<tool_calls>[{"name": "f", "arguments": {"a": 1}}]</tool_calls>'
    called, calls, content = hy.extract_calls("x<tool_calls>[1</tool_calls>" + ok)
    assert (
        called
        and content == "x<tool_calls>[1</tool_calls>"
        and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]
    )
    called, calls, content = hy.extract_calls("<think>" + ok + "</think>" + ok.replace('"f"', '"g"'))
    assert called and calls[0].name == "g"
    assert hy.extract_calls("<think>" + ok)[0]  # an unclosed think is no span
    # entries without name/arguments are skipped; a non-string name leaves all of it content
    assert hy.extract_calls('<tool_calls>[{"name": "f"}]</tool_calls>') == (
        False,
        [],
        '<tool_calls>[{"name": "f"}]</tool_calls>',
    )
    text = '<tool_calls>[{"name": 3, "arguments": {}}]</tool_calls>'
    assert hy.extract_calls(text) == (False, [], text)
    assert hy.extract_calls('  <tool_calls>{"name": "f", "arguments": {}}</tool_calls>')[0] is False  # not a list
    assert hy.extract_calls("  " + ok)[2] is None  # blank content with calls


def test_a_region_inside_a_streamed_think_span_is_skipped_in_the_stream_too(tok: Any) -> None:
    ok = '<tool_calls>[{"name": "search", "arguments": {}}]</tool_calls>'
    segments = ["@<think>", " plan ", ok, " more", "@</think>", " after"]
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, hunyuan.A13B_PROMPTS["open"])
    batch = cases.run_batch(tok, _parser(tok, (None, "hunyuan_a13b")), REQ, prompt, ids, "stop", eos=EOS)
    assert batch["tool_calls"] == [] and batch["content"] == "<think> plan " + ok + " more</think> after"
    for chunks in _chunkings(ids):
        out = _stream(tok, (None, "hunyuan_a13b"), REQ, chunks)
        assert (out["content"], out["calls"]) == (batch["content"], [])
    unclosed = cases.encode(tok, ["@<think>", " plan ", ok])
    for chunks in _chunkings(unclosed):
        out = _stream(tok, (None, "hunyuan_a13b"), REQ, chunks)
        assert out["content"] == "<think> plan " and [c[1] for c in out["calls"]] == ["search"]


def test_a_held_calls_block_resumes_from_every_snapshot_with_small_states(tok: Any) -> None:
    """A 3,000-token argument is held to the end of the stream: the held text lives beside the
    snapshot (each snapshot writes only its own new text), and a stream resumed from every
    snapshot sends the call whole, as batch reads it."""
    words = ["alpha", " beta", " é", " 😀", " x < y", ' \\"q\\"', " \\\\", " </tool_", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    body = '[{"name": "search", "arguments": {"q": "' + value + '"}}]'
    segments = ["@<think>", "\nplan\n", "@</think>", "\n", "@<answer>", "\nok", "@<tool_calls>", body, "@</tool_calls>"]
    ids = cases.encode(tok, [*segments, "\n", "@</answer>", "@<|eos|>"])
    prompt = cases.encode(tok, hunyuan.A13B_PROMPTS["open"])
    parser = _parser(tok, ("hunyuan_a13b", "hunyuan_a13b"))
    opts = parsers.RequestOptions.from_request(REQ)
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    calls = [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls]
    assert len(ids) > 3000
    assert max(sizes) < 1000, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])
    assert "".join(d.content or "" for d in deltas if d is not None) == "ok"
    assert [c[0] for c in calls] == ["search", None]
    batch = cases.run_batch(tok, parser, REQ, prompt, ids, "stop", eos=EOS)
    assert batch["tool_calls"][0][:2] == ["search", calls[1][1]]
    assert json.loads(calls[1][1]) == json.loads(body)[0]["arguments"]


def test_registered_under_vllms_names() -> None:
    assert parsers.reasoning_parser_class("hunyuan_a13b") is hy.HunyuanA13BReasoningParser
    assert parsers.tool_parser_class("hunyuan_a13b") is hy.HunyuanA13BToolParser
    assert parsers.tool_parser_class("hunyuan_a13b").supports_required_and_named is True
