"""MiniMax M3's native parsers (`render_service/parsers/minimax_m3.py`) beyond the fuzzed goldens
(`golden_families/minimax_m3.jsonl`, replayed by test_family_goldens.py): whole turns under any
chunking, nested argument elements converted by the tool schema, `thinking_mode`, resuming from
every snapshot with small states while a long call is held, and the render side (vLLM 0.33 leaves
the request alone)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.parsers import minimax_m3 as native
from tests.parsers import cases
from tests.parsers.families import minimax_m3 as fam

NS = fam.NS
EOS = (fam.EOS, fam.MODEL_EOS)
REQ = {"tools": fam.M3_TOOLS}
CALLS = [
    NS + "<tool_call>\n",
    NS + '<invoke name="get_weather">\n',
    f"{NS}<city>東京 😀{NS}</city>\n{NS}<n>3{NS}</n>\n",
    NS + "</invoke>\n",
    NS + "<invoke name='search'>",
    f"{NS}<items>{NS}<item>1{NS}</item>{NS}<item>2{NS}</item>{NS}</items>",
    f"{NS}<q>a{NS}</q>{NS}<q>b{NS}</q>",
    NS + "</invoke>\n",
    NS + "</tool_call>",
]
TURN = ["@<mm:think>", "Need the weather é.", "@</mm:think>", "Checking.", *CALLS, "[e~["]
EXPECTED_CALLS = [
    ("get_weather", json.dumps({"city": "東京 😀", "n": 3}, ensure_ascii=False)),
    # the schema makes `items` an integer array; a repeated `q` collects into a list
    ("search", json.dumps({"items": [1, 2], "q": ["a", "b"]})),
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(fam.build(Path(tmp_path_factory.mktemp("minimax_m3")))))


def _parser(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any]) -> parsers.ChatParser:
    kwargs = req.get("chat_template_kwargs")
    parser = parsers.get_parser(
        tok, config[0], config[1], enable_auto_tools=True, thinking_enabled=parsers.thinking_enabled(config[0], kwargs)
    )
    assert parser is not None
    return parser


def _stream(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], chunks: list[list[int]]) -> dict:
    prompt = cases.encode(tok, fam.PROMPTS["bare"])
    steps = cases.run_stream(tok, _parser(tok, config, req), req, prompt, chunks, "stop", roundtrip_every=1, eos=EOS)
    joined = cases.concat(steps)
    calls = [(joined["names"].get(i, ""), joined["args"].get(i, "")) for i in sorted(joined["names"])]
    return {"reasoning": joined["reasoning"], "content": joined["content"], "calls": calls, "finish": joined["finish"]}


def _batch(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], ids: list[int]) -> dict:
    prompt = cases.encode(tok, fam.PROMPTS["bare"])
    out = cases.run_batch(tok, _parser(tok, config, req), req, prompt, ids, "stop", eos=EOS)
    return {
        "reasoning": out["reasoning"] or "",
        "content": out["content"] or "",
        "calls": [(c[0], c[1]) for c in out["tool_calls"]],
        "finish": out["finish_reason"],
    }


def _chunkings(ids: list[int]) -> list[list[list[int]]]:
    rng = random.Random(3)
    out = [[[t] for t in ids], [ids]]
    for size in (2, 3, 5):
        out.append([ids[i : i + size] for i in range(0, len(ids), size)])
    for _ in range(5):
        out.append(cases.chunk(ids, [rng.randrange(1, 6) for _ in range(4)]))
    return out


def test_a_whole_turn_splits_into_reasoning_content_and_converted_calls(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    expected = {
        "reasoning": "Need the weather é.",
        "content": "Checking.",
        "calls": EXPECTED_CALLS,
        "finish": "tool_calls",
    }
    assert _batch(tok, ("minimax_m3", "minimax_m3"), REQ, ids) == expected
    for chunks in _chunkings(ids):
        assert _stream(tok, ("minimax_m3", "minimax_m3"), REQ, chunks) == expected, [len(c) for c in chunks]
    # the markers spelled one character per token answer the same (they are matched by text)
    spelled = cases.encode(tok, [("chars", "<mm:think>"), "Need the weather é.", ("chars", "</mm:think>")])
    spelled += cases.encode(tok, ["Checking.", *CALLS, "[e~["])
    assert _stream(tok, ("minimax_m3", "minimax_m3"), REQ, [[t] for t in spelled]) == expected


@pytest.mark.parametrize(
    ("output", "thinking", "split"),
    [
        ("</mm:think>hi <mm:think>x", False, (None, "hi <mm:think>x")),  # a stray closer opening the output
        ("a<mm:think>r</mm:think>b", False, ("r", "ab")),
        ("a<mm:think>r", False, ("r", "a")),
        ("plain</mm:think>", False, (None, "plain</mm:think>")),
        ("r</mm:think>c", True, ("r", "c")),
        ("still thinking", True, ("still thinking", None)),
        ("x<mm:think>r</mm:think>c<mm:think>", True, ("xr", "c<mm:think>")),  # the stream's rule (rule 2)
    ],
)
def test_reasoning_rule_stream_and_batch_share(tok: Any, output: str, thinking: bool, split: tuple) -> None:
    req: dict[str, Any] = {"chat_template_kwargs": {"thinking_mode": "enabled"}} if thinking else {}
    parser = _parser(tok, ("minimax_m3", None), req)
    assert parser.reasoning is not None
    assert parser.reasoning.extract(output) == split
    ids = cases.encode(tok, [("chars", output)])
    for chunks in _chunkings(ids):
        got = _stream(tok, ("minimax_m3", None), req, chunks)
        assert (got["reasoning"] or None, got["content"] or None) == split


def test_the_converter_follows_the_schema() -> None:
    props = {"items": {"type": "array", "items": {"type": "integer"}}, "flag": {"type": "boolean"}, "obj": {}}
    raw = f"{NS}<items>{NS}</items>{NS}<flag>true{NS}</flag>{NS}<obj>{NS}<a>1{NS}</a>note{NS}</obj>"
    assert json.loads(native.minimax_m3_arg_converter(raw, False, props)) == {
        "items": [],
        "flag": True,
        "obj": {"a": "1", "$text": "note"},
    }
    # parsing stops at the first open element, keeping the ones before it
    assert json.loads(native.minimax_m3_arg_converter(f"{NS}<n>1{NS}</n>{NS}<m>2", False, {})) == {"n": "1"}


def test_resumes_from_every_snapshot_with_small_states_while_a_long_call_is_held(tok: Any) -> None:
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " ]<]mini", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = ["@<mm:think>", "plan", "@</mm:think>", "ok", NS + "<tool_call>", NS + '<invoke name="search">']
    segments += [NS + "<q>", value, NS + "</q>", NS + "</invoke>", NS + "</tool_call>", "[e~["]
    ids = cases.encode(tok, segments)
    parser = _parser(tok, ("minimax_m3", "minimax_m3"), REQ)
    prompt = cases.encode(tok, fam.PROMPTS["bare"])
    deltas, sizes, writes = cases.stream_through_snapshots(
        parser, prompt, ids, parsers.RequestOptions.from_request(REQ)
    )
    assert len(ids) > 3000
    # two held texts (the call's argument text and the raw content beside it) each stay inline
    # until they outgrow the sink's inline size: bounded by that, then by the markup
    assert max(sizes) < 2000, max(sizes)
    assert max(sizes[-2000:]) < 600, max(sizes[-2000:])
    assert max(writes[-2000:]) < 100, max(writes[-2000:])
    joined = cases.concat([(d, None) for d in deltas])
    calls = [(joined["names"][i], joined["args"].get(i, "")) for i in sorted(joined["names"])]
    batch = _batch(tok, ("minimax_m3", "minimax_m3"), REQ, ids)
    assert (joined["reasoning"], joined["content"]) == (batch["reasoning"], batch["content"]) == ("plan", "ok")
    assert calls == batch["calls"] == [("search", json.dumps({"q": value}, ensure_ascii=False))]


def test_thinking_mode_and_the_prompt_check(tok: Any) -> None:
    assert parsers.thinking_enabled("minimax_m3", {"thinking_mode": "enabled"}) is True
    assert parsers.thinking_enabled("minimax_m3", {"thinking_mode": "disabled"}) is False
    assert parsers.thinking_enabled("minimax_m3", {}) is False
    parser = _parser(tok, ("minimax_m3", None), {})
    assert parser.reasoning is not None
    ends = parser.reasoning.prompt_ends_reasoning
    assert ends(cases.encode(tok, fam.PROMPTS["open"])) is False
    assert ends(cases.encode(tok, fam.PROMPTS["closed"])) is True
    assert ends(cases.encode(tok, fam.PROMPTS["bare"])) is False


def test_render_leaves_the_request_alone() -> None:
    """vLLM 0.33's `MinimaxM3Parser.adjust_request` returns the request unchanged (no
    `skip_special_tokens=False`, unlike the other engine families), and with
    `supports_required_and_named=False` required/named get no JSON schema (checked against the
    oracle: `structured_outputs` stays unset for auto, required, named and none)."""
    from render_service.api import structured
    from render_service.parsers.protocols import RequestAdjustment

    adjusted = parsers.adjust_request(
        "minimax_m3", "minimax_m3", RequestAdjustment(has_tools=True, tool_choice="auto", skip_special_tokens=None)
    )
    assert adjusted.skip_special_tokens is None and adjusted.spaces_between_special_tokens is None
    assert parsers.tool_parser_class("minimax_m3").supports_required_and_named is False
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("auto", "required", named, "none"):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": copy.deepcopy(cases.TOOLS)}
        body["tool_choice"] = choice
        structured.validate_structured(body, chat=True)
        result = structured.resolve_structured_outputs(
            body, chat=True, tool_parser="minimax_m3", enable_auto_tool_choice=True, reasoning_parser="minimax_m3"
        )
        assert result.structured_outputs is None, choice


def test_the_prompt_scan_finds_the_last_marker_sequence() -> None:
    """`_rfind` (the prompt-ends-reasoning scan, last id first) against a plain slice-by-slice scan."""

    def plain(ids: list[int], marker: tuple[int, ...]) -> int:
        n = len(marker)
        return next((i for i in range(len(ids) - n, -1, -1) if tuple(ids[i : i + n]) == marker), -1)

    rng = random.Random(0)
    for _ in range(5000):
        ids = [rng.randrange(4) for _ in range(rng.randrange(12))]
        marker = tuple(rng.randrange(4) for _ in range(rng.randrange(1, 4)))
        assert native.MinimaxM3ReasoningParser._rfind(ids, marker) == plain(ids, marker), (ids, marker)
