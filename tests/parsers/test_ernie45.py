"""ERNIE 4.5's native parsers (`render_service/parsers/ernie45.py`) beyond the fuzzed goldens
(`golden_families/ernie45.jsonl`, replayed by test_family_goldens.py): whole-turn answers under any
chunking, resuming from every snapshot with small states while text is held, the response-wrapper
rule shared by stream and batch, and the render side (vLLM 0.33's JSON paths for required/named)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.parsers import ernie45 as native
from tests.parsers import cases
from tests.parsers.families import ernie45 as fam

EOS = (fam.EOS, fam.MODEL_EOS)
CONFIGS = (("ernie45", "ernie45"), ("ernie45", None), (None, "ernie45"))
CALL = '\n{"name": "get_weather", "arguments": {"city": "東京 😀", "n": 3}}\n'
ANSWER = ["Let me think é.", "\n", "@</think>", "\n\n", "@<response>", "\nIt is sunny 😀.\n", "@</response>", "\n"]
TOOL_TURN = ["plan", "\n", "@</think>", "\n\n", "Checking.\n\n", "@<tool_call>", CALL, "@</tool_call>", "\n"]
TOOL_TURN += ["@<tool_call>", '\n{"name": "search", "arguments": {}}\n', "@</tool_call>", "@<|end_of_sentence|>"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(fam.build(Path(tmp_path_factory.mktemp("ernie45")))))


def _parser(tok: Any, config: tuple[str | None, str | None]) -> parsers.ChatParser:
    parser = parsers.get_parser(tok, config[0], config[1], enable_auto_tools=True)
    assert parser is not None
    return parser


def _stream(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], chunks: list[list[int]]) -> dict:
    prompt = cases.encode(tok, fam.PROMPTS["open"])
    steps = cases.run_stream(tok, _parser(tok, config), req, prompt, chunks, "stop", roundtrip_every=1, eos=EOS)
    joined = cases.concat(steps)
    calls = [(joined["names"].get(i, ""), joined["args"].get(i, "")) for i in sorted(joined["names"])]
    return {"reasoning": joined["reasoning"], "content": joined["content"], "calls": calls, "finish": joined["finish"]}


def _batch(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], ids: list[int]) -> dict:
    prompt = cases.encode(tok, fam.PROMPTS["open"])
    out = cases.run_batch(tok, _parser(tok, config), req, prompt, ids, "stop", eos=EOS)
    calls = [(c[0], c[1]) for c in out["tool_calls"]]
    return {
        "reasoning": out["reasoning"] or "",
        "content": out["content"] or "",
        "calls": calls,
        "finish": out["finish_reason"],
    }


def _chunkings(ids: list[int]) -> list[list[list[int]]]:
    rng = random.Random(7)
    out = [[[t] for t in ids], [ids]]
    for size in (2, 3, 5):
        out.append([ids[i : i + size] for i in range(0, len(ids), size)])
    for _ in range(5):
        out.append(cases.chunk(ids, [rng.randrange(1, 6) for _ in range(4)]))
    return out


def test_an_answer_splits_into_reasoning_and_the_unwrapped_response(tok: Any) -> None:
    ids = cases.encode(tok, [*ANSWER, "@<|end_of_sentence|>"])
    expected = {"reasoning": "Let me think é.\n", "content": "\nIt is sunny 😀.\n", "calls": [], "finish": "stop"}
    for config in CONFIGS[:2]:
        assert _batch(tok, config, {"tools": cases.TOOLS}, ids) == expected
        for chunks in _chunkings(ids):
            assert _stream(tok, config, {"tools": cases.TOOLS}, chunks) == expected, (config, [len(c) for c in chunks])
    # without a reasoning parser vLLM's tool parser keeps the text as it is: so does the stream
    raw = "".join(tok.decode([t]) for t in ids[:-1])
    for chunks in _chunkings(ids):
        assert _stream(tok, (None, "ernie45"), {"tools": cases.TOOLS}, chunks)["content"] == raw


def test_calls_arrive_whole_and_the_content_loses_its_trailing_newlines(tok: Any) -> None:
    ids = cases.encode(tok, TOOL_TURN)
    calls = [("get_weather", json.dumps({"city": "東京 😀", "n": 3}, ensure_ascii=False)), ("search", "{}")]
    expected = {"reasoning": "plan\n", "content": "\n\nChecking.", "calls": calls, "finish": "tool_calls"}
    assert _batch(tok, ("ernie45", "ernie45"), {"tools": cases.TOOLS}, ids) == expected
    for chunks in _chunkings(ids):
        assert _stream(tok, ("ernie45", "ernie45"), {"tools": cases.TOOLS}, chunks) == expected
    # one region that does not load makes the whole text content, in batch and in the stream
    broken = cases.encode(tok, [*TOOL_TURN[:-2], '\n{"name": "search", "arguments": {}\n', *TOOL_TURN[-2:]])
    whole = _batch(tok, ("ernie45", "ernie45"), {"tools": cases.TOOLS}, broken)
    assert whole["calls"] == [] and whole["content"].startswith("\n\nChecking.\n\n<tool_call>")
    for chunks in _chunkings(broken):
        assert _stream(tok, ("ernie45", "ernie45"), {"tools": cases.TOOLS}, chunks) == whole


@pytest.mark.parametrize(
    ("content", "kept"),
    [
        ("\n\n<response>\nhi\n</response>\n", "\nhi\n"),
        ("<response>a</response>b</response>c", "a</response>b"),
        ("\n<response>never closed", "never closed"),
        ("text first <response>x</response>", "text first <response>x</response>"),
        ("\n\n", "\n\n"),
        ("  <resp", "  <resp"),
    ],
)
def test_the_response_rule_stream_and_batch_share(tok: Any, content: str, kept: str) -> None:
    assert native.unwrap_response(content) == kept
    ids = cases.encode(tok, ["x", "@</think>", ("chars", content)])
    for chunks in _chunkings(ids):
        assert _stream(tok, ("ernie45", None), {}, chunks)["content"] == kept
    assert _batch(tok, ("ernie45", None), {}, ids)["content"] == kept


def test_resumes_from_every_snapshot_with_small_states_while_text_is_held(tok: Any) -> None:
    """A long answer after a `</response>` another one may still close, and a long call, are held
    beside the snapshot (each snapshot writes only its new text); resumed from every snapshot, the
    stream adds up to the batch answer."""
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " </resp", " {}"]
    long_text = "".join(words[i % len(words)] for i in range(3000))
    for config, segments in (
        (("ernie45", None), ["plan", "@</think>", "@<response>", "hi", "@</response>", long_text, "@</response>"]),
        (
            ("ernie45", "ernie45"),
            [
                "plan",
                "@</think>",
                "ok",
                "@<tool_call>",
                json.dumps({"name": "search", "arguments": {"q": long_text}}),
                "@</tool_call>",
            ],
        ),
    ):
        ids = cases.encode(tok, [*segments, "@<|end_of_sentence|>"])
        parser = _parser(tok, config)
        prompt = cases.encode(tok, fam.PROMPTS["open"])
        opts = parsers.RequestOptions.from_request({"tools": cases.TOOLS})
        deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
        assert len(ids) > 3000
        assert max(sizes) < 1000, max(sizes)
        assert max(writes[-2000:]) < 100, max(writes[-2000:])
        streamed = {
            "reasoning": "".join(d.reasoning or "" for d in deltas if d is not None),
            "content": "".join(d.content or "" for d in deltas if d is not None),
            "calls": [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls if c.name],
        }
        batch = _batch(tok, config, {"tools": cases.TOOLS}, ids)
        args = [c.arguments for d in deltas if d is not None for c in d.tool_calls if c.arguments]
        assert streamed["reasoning"] == batch["reasoning"] == "plan"
        assert streamed["content"] == batch["content"]
        assert [(name, a) for (name, _), a in zip(streamed["calls"], args, strict=True)] == batch["calls"]
    assert batch["calls"] == [("search", json.dumps({"q": long_text}, ensure_ascii=False))]


def test_the_prompt_check_is_vllms_but_the_stream_reads_the_output_as_batch_does(tok: Any) -> None:
    parser = _parser(tok, ("ernie45", None))
    assert parser.reasoning is not None
    assert parser.reasoning.prompt_ends_reasoning(cases.encode(tok, fam.PROMPTS["open"])) is False
    assert parser.reasoning.prompt_ends_reasoning(cases.encode(tok, fam.PROMPTS["closed"])) is True
    ids = cases.encode(tok, ["more thought", "@</think>", "answer"])
    prompt = cases.encode(tok, fam.PROMPTS["closed"])
    steps = cases.run_stream(tok, parser, {}, prompt, [[t] for t in ids], "stop", eos=EOS)
    batch = cases.run_batch(tok, parser, {}, prompt, ids, "stop", eos=EOS)
    joined = cases.concat(steps)
    assert (
        (joined["reasoning"], joined["content"]) == (batch["reasoning"], batch["content"]) == ("more thought", "answer")
    )


def test_render_effects_are_vllms() -> None:
    """vLLM 0.33's `Ernie45ToolParser.adjust_request` is the base one: nothing for auto/none, and
    the JSON schema of the tools for required/named (recorded from the oracle); no
    `skip_special_tokens` change (the markers are not special)."""
    from render_service.api import structured
    from render_service.parsers.protocols import RequestAdjustment

    adjusted = parsers.adjust_request(
        "ernie45", "ernie45", RequestAdjustment(has_tools=True, tool_choice="auto", skip_special_tokens=None)
    )
    assert adjusted.skip_special_tokens is None and adjusted.spaces_between_special_tokens is None
    weather = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}}
    required = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": weather},
                    "required": ["name", "parameters"],
                },
                {
                    "properties": {
                        "name": {"type": "string", "enum": ["search"]},
                        "parameters": {"type": "object", "properties": {}},
                    },
                    "required": ["name", "parameters"],
                },
            ],
        },
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, expected in (("auto", None), ("none", None), ("required", required), (named, weather)):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": copy.deepcopy(cases.TOOLS)}
        body["tool_choice"] = choice
        structured.validate_structured(body, chat=True)
        result = structured.resolve_structured_outputs(
            body, chat=True, tool_parser="ernie45", enable_auto_tool_choice=True, reasoning_parser="ernie45"
        )
        so = result.structured_outputs
        assert (so["json"] if so is not None else None) == expected, choice
