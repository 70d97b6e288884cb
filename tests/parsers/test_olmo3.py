"""Olmo 3's native parsers (`render_service/parsers/olmo3.py`) beyond the fuzzed goldens
(`golden_families/olmo3.jsonl`, replayed by test_family_goldens.py): the one-pass call-list reader
against vLLM's regex, a whole turn under any chunking, resuming from every snapshot while a long
call list is held, the two rule-2 batch answers, and the prompt check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import regex  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as hs

from render_service import parsers
from render_service.parsers.olmo3 import call_list_matches, vllm_call_list
from tests.parsers import cases
from tests.parsers.families import olmo3step

# vLLM 0.33's Olmo3PythonicToolParser.TOOL_CALL_REGEX: the oracle the reader must agree with.
VLLM_TOOL_CALL_REGEX = regex.compile(
    r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*"
    r"([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    regex.DOTALL,
)
# The pieces the regex reads (names, their Unicode \w tail, parentheses, '=', commas, Unicode and
# ASCII whitespace, brackets) and some it does not.
ATOMS = ["f", "g1", "x_y", "é", "_", "9", "(", ")", ",", " ", "\n", "\t", "\u3000", "\x1c", "\x85", "="]
ATOMS += ["a=", "x=1", "()", "]", "[", "'", '"', "a.b", "\\", "Ⅻ", "٣", ".", "-"]


@settings(max_examples=3000, deadline=None)
@given(body=hs.lists(hs.sampled_from(ATOMS), max_size=16), end=hs.sampled_from(["]", "", ")]", " ]", "),]"]))
def test_the_call_list_reader_agrees_with_vllms_regex(body: list[str], end: str) -> None:
    text = "[" + "".join(body) + end
    assert call_list_matches(text) is (VLLM_TOOL_CALL_REGEX.match(text) is not None), repr(text)


@pytest.mark.parametrize(
    "text",
    [
        "[f()]",
        "[f(), g()]",
        "[f() g()]",
        "[f() g(), h()]",  # a comma after a whitespace-separated call
        "[f(),]",
        "[f(a=1)]",
        "[f(a=1) x y)]",  # an argument absorbs everything up to a later `)]`
        "[f(a=1]",
        "[f( a=1)]",
        "[f(1)]",
        "[9f()]",
        "[é()]",
        "[fé(a=1)\u3000]",
        "[f()\x1c]",  # \x1c is whitespace to Python, not to `regex`
        "[a.b(x=1)]",
        "[get_weather(city='Paris'), search(q=None)]",
        "",
        "[",
    ],
)
def test_the_reader_on_edge_cases(text: str) -> None:
    assert call_list_matches(text) is (VLLM_TOOL_CALL_REGEX.match(text) is not None)


def test_vllms_rewriting_into_a_call_list() -> None:
    assert vllm_call_list("<function_calls>\n f(a=1)\n\n g()\n</function_calls> tail") == "[f(a=1), g()]"
    assert vllm_call_list("x\n<function_calls>f()</function_calls>\n<function_calls>g()</function_calls>") == "[f()]"
    assert vllm_call_list(" f()\n g() ") == "[f(), g()]"


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(olmo3step.build_olmo3(Path(tmp_path_factory.mktemp("olmo3")))))


def _run(tok: Any, config: tuple[str | None, str | None], segments: list[Any], size: int) -> dict[str, Any]:
    parser = parsers.get_parser(tok, config[0], config[1], enable_auto_tools=True)
    assert parser is not None
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, olmo3step.OLMO3_PROMPTS["open"])
    chunks = [ids[i : i + size] for i in range(0, len(ids), size)]
    req = {"tools": cases.TOOLS}
    steps = cases.run_stream(tok, parser, req, prompt, chunks, "stop", roundtrip_every=1, eos=olmo3step.OLMO3_EOS)
    joined = cases.concat(steps)
    batch = cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=olmo3step.OLMO3_EOS)
    return {
        "reasoning": joined["reasoning"],
        "content": joined["content"],
        "calls": [[joined["names"][i], joined["args"][i]] for i in sorted(joined["names"])],
        "finish": joined["finish"],
        "batch": [batch["reasoning"], batch["content"], [c[:2] for c in batch["tool_calls"]], batch["finish_reason"]],
    }


TURN = ["Need the weather é 😀.", "</think>", "\n<function_calls>", "get_weather(city='Paris', n=3)\n"]
TURN += ['search(q="x < y", deep={"a": [1, null, true]})', "</function_calls>", "@<|im_end|>"]


def test_a_whole_turn_under_any_chunking(tok: Any) -> None:
    one = _run(tok, ("olmo3", "olmo3"), TURN, 1)
    calls = [
        ["get_weather", json.dumps({"city": "Paris", "n": 3})],
        ["search", json.dumps({"q": "x < y", "deep": {"a": [1, None, True]}})],
    ]
    assert one == {
        "reasoning": "Need the weather é 😀.",
        "content": "",
        "calls": calls,
        "finish": "tool_calls",
        "batch": ["Need the weather é 😀.", None, calls, "tool_calls"],
    }
    for size in (2, 3, 5, 7, 1000):
        assert _run(tok, ("olmo3", "olmo3"), TURN, size) == one
    # the markers spelled one character per token: the same answer
    spelled = [("chars", s) if isinstance(s, str) and not s.startswith("@") else s for s in TURN]
    assert _run(tok, ("olmo3", "olmo3"), spelled, 1) == one


def test_rule_two_batch_answers_follow_the_stream(tok: Any) -> None:
    # no </think>: all reasoning (vLLM's batch: all content)
    out = _run(tok, ("olmo3", None), ["<think>", "still thinking <", "/thi"], 2)
    assert out["reasoning"] == "still thinking </thi" and out["batch"][:2] == ["still thinking </thi", None]
    # a bare call line (no <function_calls>) is content (vLLM's batch: a call)
    out = _run(tok, (None, "olmo3"), ["get_weather(city='Paris')", "@<|im_end|>"], 3)
    assert out["calls"] == [] and out["content"] == "get_weather(city='Paris')" and out["batch"][2] == []
    # a tag pair after text: content too (vLLM's batch: the calls, the text dropped)
    out = _run(tok, (None, "olmo3"), ["Sure: <function_calls>f(a=1)</function_calls>"], 4)
    assert out["calls"] == [] and out["content"] == "Sure: <function_calls>f(a=1)</function_calls>"


def test_a_rejected_call_list_is_content(tok: Any) -> None:
    segments = ["ok", "</think>", "<function_calls>get_weather(city=x + 1)</function_calls>", "@<|im_end|>"]
    out = _run(tok, ("olmo3", "olmo3"), segments, 2)
    assert out["calls"] == [] and out["content"] == "<function_calls>get_weather(city=x + 1)</function_calls>"
    assert out["finish"] == "stop" and out["batch"][1] == out["content"]


def test_a_held_call_list_resumes_from_every_snapshot_with_small_states(tok: Any) -> None:
    words = ["alpha", " beta", " é", " 😀", " x < y", ' \\"q\\"', " \\\\", " </function", " {}", " )]"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = ["plan", "</think>", "<function_calls>", f'search(q="{value}")', "</function_calls>", "@<|im_end|>"]
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, olmo3step.OLMO3_PROMPTS["open"])
    parser = parsers.get_parser(tok, "olmo3", "olmo3", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request({"tools": cases.TOOLS})
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    joined = cases.concat([(d, None) for d in deltas])
    assert len(ids) > 3000
    assert max(sizes) < 1000, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])  # each snapshot appends its own text only
    assert joined["reasoning"] == "plan"
    expected = json.dumps({"q": value.replace('\\"', '"').replace("\\\\", "\\")}, ensure_ascii=False)
    assert [joined["names"][0], joined["args"][0]] == ["search", expected]


def test_the_prompt_check_reads_the_token_pieces_of_think_end(tok: Any) -> None:
    parser = parsers.get_parser(tok, "olmo3", None, enable_auto_tools=False)
    assert parser is not None and parser.reasoning is not None
    for name, ends in (("open", False), ("bare", False), ("history", True)):
        assert parser.reasoning.prompt_ends_reasoning(cases.encode(tok, olmo3step.OLMO3_PROMPTS[name])) is ends, name
    # the stream still reads reasoning after such a prompt, as batch does
    out = parsers.get_parser(tok, "olmo3", None, enable_auto_tools=False)
    assert out is not None
    prompt = cases.encode(tok, olmo3step.OLMO3_PROMPTS["history"])
    ids = cases.encode(tok, ["why", "</think>", "answer"])
    steps = cases.run_stream(tok, out, {}, prompt, [ids], "stop", eos=olmo3step.OLMO3_EOS)
    assert cases.concat(steps)["reasoning"] == "why" and cases.concat(steps)["content"] == "answer"
