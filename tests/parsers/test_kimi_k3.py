"""Kimi K3's native parsers (`render_service/parsers/kimi_k3.py`) beyond the fuzzed goldens
(`golden_families/kimi_k3.jsonl`, replayed by test_family_goldens.py): whole-turn answers, the
chunking-independence of the stream, resuming from snapshots while a long call is held, and the
thinking switch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from tests.parsers import cases
from tests.parsers.families import kimi_k3 as k3

OPEN, CLOSE, SEP = k3.OPEN, k3.CLOSE, k3.SEP
TURN = [
    *k3._marker(OPEN, "think"),
    "Need the weather.",
    *k3._marker(CLOSE, "think"),
    *k3._marker(OPEN, "response"),
    "Checking é 😀",
    *k3._marker(CLOSE, "response"),
    *k3._marker(OPEN, "tools"),
    OPEN,
    'call tool="get_weather" index="1"',
    SEP,
    OPEN,
    'argument key="city" type="string"',
    SEP,
    "Paris <b>",
    *k3._marker(CLOSE, "argument"),
    OPEN,
    'argument key="days" type="number"',
    SEP,
    "3",
    *k3._marker(CLOSE, "argument"),
    *k3._marker(CLOSE, "call"),
    OPEN,
    'call tool="get_time" index="2"',
    SEP,
    *k3._marker(CLOSE, "call"),
    *k3._marker(CLOSE, "tools"),
    *k3._marker(CLOSE, "message"),
    "@<|end_of_msg|>",
]

TOOLS_CHANNEL = TURN[TURN.index("tools") - 1 :]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(k3.build(Path(tmp_path_factory.mktemp("k3")))))


def _stream(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], chunks: list[list[int]]) -> dict:
    parser = parsers.get_parser(
        tok,
        config[0],
        config[1],
        enable_auto_tools=True,
        thinking_enabled=parsers.thinking_enabled(config[0], req.get("chat_template_kwargs")),
    )
    assert parser is not None
    prompt = cases.encode(tok, k3.PROMPTS["thinking"])
    steps = cases.run_stream(tok, parser, req, prompt, chunks, "stop", roundtrip_every=1, eos=(k3.EOS, k3.MODEL_EOS))
    reasoning = "".join((d.reasoning or "") for d, _ in steps if d is not None)
    content = "".join((d.content or "") for d, _ in steps if d is not None)
    calls = [(c.name, c.arguments) for d, _ in steps if d is not None for c in d.tool_calls]
    return {"reasoning": reasoning, "content": content, "calls": calls, "finish": steps[-1][1]}


def test_a_whole_turn_splits_into_reasoning_content_and_calls(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    req = {"tools": cases.TOOLS}
    one_token = _stream(tok, ("kimi_k3", "kimi_k3"), req, [[t] for t in ids])
    assert one_token == {
        "reasoning": "Need the weather.",
        "content": "Checking é 😀",
        "calls": [("get_weather", json.dumps({"city": "Paris <b>", "days": 3})), ("get_time", "{}")],
        "finish": "tool_calls",
    }
    # any chunking answers the same (the markers are three tokens each: every split is seen)
    for size in (2, 3, 5, 7, len(ids)):
        assert (
            _stream(tok, ("kimi_k3", "kimi_k3"), req, [ids[i : i + size] for i in range(0, len(ids), size)])
            == one_token
        )


def test_without_a_tool_parser_the_response_channel_is_unwrapped_unless_the_request_has_tools(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    chunks = [[t] for t in ids]
    bare = _stream(tok, ("kimi_k3", None), {}, chunks)
    assert bare["content"] == "Checking é 😀"
    # with tools (and tool_choice not none) vLLM's batch hands the raw channels on: so does the stream
    raw = _stream(tok, ("kimi_k3", None), {"tools": cases.TOOLS}, chunks)
    assert raw["content"].startswith("<|open|>response<|sep|>Checking é 😀<|close|>response<|sep|><|open|>tools<|sep|>")
    assert raw["calls"] == []


def test_thinking_off_reads_everything_as_content(tok: Any) -> None:
    segments = ["Hi there", *k3._marker(CLOSE, "response"), *k3._marker(CLOSE, "message")]
    ids = cases.encode(tok, segments)
    for kwargs in ({"thinking": False}, {"enable_thinking": False}):
        out = _stream(tok, ("kimi_k3", "kimi_k3"), {"chat_template_kwargs": kwargs}, [[t] for t in ids])
        assert out["reasoning"] == "" and out["content"] == "Hi there"
    assert parsers.thinking_enabled("kimi_k3", {"thinking": None, "enable_thinking": False}) is False
    assert parsers.thinking_enabled("kimi_k3", {"thinking": True, "enable_thinking": False}) is True


def _batch(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], ids: list[int]) -> dict:
    parser = parsers.get_parser(
        tok,
        config[0],
        config[1],
        enable_auto_tools=True,
        thinking_enabled=parsers.thinking_enabled(config[0], req.get("chat_template_kwargs")),
    )
    assert parser is not None
    prompt = cases.encode(tok, k3.PROMPTS["thinking"])
    batch = cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=(k3.EOS, k3.MODEL_EOS))
    calls = [(c[0], c[1]) for c in batch["tool_calls"]]
    return {
        "reasoning": batch["reasoning"] or "",
        "content": batch["content"] or "",
        "calls": calls,
        "finish": batch["finish_reason"],
    }


# A channel marker after text already streamed (deliberate.K3_LATE_CHANNEL_BATCH): vLLM's batch
# re-reads the output from it (the answer it gives in the comment); ours, stream and batch alike,
# reads it where the stream meets it.
LATE_CHANNEL = [
    # thinking off: content before the opener stays (vLLM: "there")
    (
        ("kimi_k3", "kimi_k3"),
        {"tools": cases.TOOLS, "chat_template_kwargs": {"thinking": False}},
        ["Hi ", *k3._marker(OPEN, "response"), "there", *k3._marker(CLOSE, "response")],
        {"reasoning": "", "content": "Hi there", "calls": [], "finish": "stop"},
    ),
    # reasoning that never closes stays reasoning (vLLM: no reasoning, content "x")
    (
        ("kimi_k3", "kimi_k3"),
        {"tools": cases.TOOLS},
        ["plan ", *k3._marker(OPEN, "response"), "x"],
        {"reasoning": "plan <|open|>response<|sep|>x", "content": "", "calls": [], "finish": "stop"},
    ),
    # a second opener inside the body is text, unwrapped once (vLLM unwraps twice: "y")
    (
        ("kimi_k3", "kimi_k3"),
        {},
        ["r", *k3._marker(CLOSE, "think"), *k3._marker(OPEN, "response"), "x", *k3._marker(OPEN, "response"), "y"],
        {"reasoning": "r", "content": "x<|open|>response<|sep|>y", "calls": [], "finish": "stop"},
    ),
    # a think opener after reasoning text is text (vLLM: reasoning "b")
    (
        ("kimi_k3", None),
        {},
        ["a", *k3._marker(OPEN, "think"), "b", *k3._marker(CLOSE, "think"), "c"],
        {"reasoning": "a<|open|>think<|sep|>b", "content": "c", "calls": [], "finish": "stop"},
    ),
    # a think close after a leading response opener is content text (vLLM: reasoning up to it)
    (
        ("kimi_k3", None),
        {},
        [*k3._marker(OPEN, "response"), "x", *k3._marker(CLOSE, "think"), "y"],
        {"reasoning": "", "content": "x<|close|>think<|sep|>y", "calls": [], "finish": "stop"},
    ),
    # no reasoning parser: the calls after a late opener are read as usual (vLLM: content "b")
    (
        (None, "kimi_k3"),
        {"tools": cases.TOOLS},
        ["a ", *k3._marker(OPEN, "response"), "b", *k3._marker(CLOSE, "response"), *TOOLS_CHANNEL],
        {
            "reasoning": "",
            "content": "a b",
            "calls": [("get_weather", json.dumps({"city": "Paris <b>", "days": 3})), ("get_time", "{}")],
            "finish": "tool_calls",
        },
    ),
]


@pytest.mark.parametrize("n", range(len(LATE_CHANNEL)))
def test_a_late_channel_marker_is_read_where_the_stream_meets_it(tok: Any, n: int) -> None:
    config, req, segments, expected = LATE_CHANNEL[n]
    ids = cases.encode(tok, segments)
    assert _batch(tok, config, req, ids) == expected
    for size in (1, 2, 3, 5, len(ids)):
        assert _stream(tok, config, req, [ids[i : i + size] for i in range(0, len(ids), size)]) == expected, size


def test_the_prompt_ends_reasoning_only_when_its_newest_think_marker_closes(tok: Any) -> None:
    parser = parsers.get_parser(tok, "kimi_k3", None, enable_auto_tools=False)
    assert parser is not None and parser.reasoning is not None
    for name, ends in (("thinking", False), ("history", False), ("response", False)):
        assert parser.reasoning.prompt_ends_reasoning(cases.encode(tok, k3.PROMPTS[name])) is ends, name
    closed = cases.encode(tok, [*k3.PROMPTS["thinking"], "x", *k3._marker(CLOSE, "think")])
    assert parser.reasoning.prompt_ends_reasoning(closed) is True


def test_a_held_call_resumes_from_every_snapshot_with_small_states(tok: Any) -> None:
    """A 3,000-token string argument is held until its call closes: the held text lives beside
    the snapshot (each snapshot writes only its own new text), and a stream resumed from every
    snapshot sends the call whole, as batch reads it."""
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " <|clo", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = [*k3._marker(OPEN, "response"), "ok", *k3._marker(CLOSE, "response"), *k3._marker(OPEN, "tools")]
    segments += [OPEN, 'call tool="search" index="1"', SEP, OPEN, 'argument key="q" type="string"', SEP, value]
    segments += [
        *k3._marker(CLOSE, "argument"),
        *k3._marker(CLOSE, "call"),
        *k3._marker(CLOSE, "tools"),
        "@<|end_of_msg|>",
    ]
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, k3.PROMPTS["response"])
    parser = parsers.get_parser(tok, "kimi_k3", "kimi_k3", enable_auto_tools=True, thinking_enabled=False)
    assert parser is not None
    opts = parsers.RequestOptions.from_request({"tools": cases.TOOLS})
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    calls = [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls]
    content = "".join(d.content or "" for d in deltas if d is not None)
    assert len(ids) > 3000
    assert max(sizes) < 1000, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])
    assert content == "ok"
    assert calls == [("search", json.dumps({"q": value}, ensure_ascii=False))]
    batch = cases.run_batch(tok, parser, {"tools": cases.TOOLS}, prompt, ids, "stop", eos=(k3.EOS, k3.MODEL_EOS))
    assert [[name, args] for name, args in calls] == [list(c[:2]) for c in batch["tool_calls"]]


def test_render_effects() -> None:
    from render_service.parsers.protocols import RequestAdjustment

    adjusted = parsers.adjust_request(
        "kimi_k3", "kimi_k3", RequestAdjustment(has_tools=False, tool_choice="none", skip_special_tokens=None)
    )
    assert adjusted.skip_special_tokens is False and adjusted.spaces_between_special_tokens is False
    assert parsers.tool_parser_class("kimi_k3").supports_required_and_named is False
