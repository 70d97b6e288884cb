"""Step 3.5's native parsers (`render_service/parsers/step3p5.py`) beyond the fuzzed goldens
(`golden_families/step3p5.jsonl`, replayed by test_family_goldens.py): a whole turn under any
chunking, `enable_thinking` ignored, the reasoning's trailing whitespace stripped, resuming from
every snapshot with small states, the structural tag and the render effects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.model.example import build_example_model
from render_service.parsers.protocols import RequestAdjustment
from tests.parsers import cases

CALL = ["@<tool_call>", "\n<function=get_weather>\n<parameter=city>\nParis é 😀\n</parameter>\n"]
CALL += ["<parameter=n>\n3\n</parameter>\n</function>\n", "@</tool_call>"]
TURN = ["Need the weather.\n", "@</think>", "\n\nChecking.\n", *CALL, "@<|im_end|>"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(build_example_model(Path(tmp_path_factory.mktemp("qwen3")), "qwen3")))


def _stream(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], chunks: list[list[int]]) -> dict:
    parser = parsers.get_parser(
        tok,
        config[0],
        config[1],
        enable_auto_tools=True,
        thinking_enabled=parsers.thinking_enabled(config[0], req.get("chat_template_kwargs"), config[1]),
    )
    assert parser is not None
    prompt = cases.encode(tok, [*cases.PROMPTS["open"], "@<think>", "\n"])
    steps = cases.run_stream(tok, parser, req, prompt, chunks, "stop", roundtrip_every=1)
    batch = cases.run_batch(tok, parser, req, prompt, [t for c in chunks for t in c], "stop")
    joined = cases.concat(steps)
    calls = [(joined["names"][i], joined["args"][i]) for i in sorted(joined["names"])]
    return {
        "reasoning": joined["reasoning"],
        "content": joined["content"],
        "calls": calls,
        "finish": joined["finish"],
        "batch": (batch["reasoning"], batch["content"], [tuple(c[:2]) for c in batch["tool_calls"]]),
    }


def test_a_whole_turn_under_any_chunking(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    req = {"tools": cases.TOOLS}
    one = _stream(tok, ("step3p5", "step3p5"), req, [[t] for t in ids])
    call = ("get_weather", json.dumps({"city": "Paris é 😀", "n": 3}, ensure_ascii=False))  # coerced to the schema
    assert one == {
        "reasoning": "Need the weather.",  # the trailing newline stripped, as batch strips it
        "content": "\n\nChecking.",  # batch strips the content's trailing whitespace before a call
        "calls": [call],
        "finish": "tool_calls",
        "batch": ("Need the weather.", "\n\nChecking.", [call]),
    }
    for size in (2, 3, 5, 7, len(ids)):
        assert _stream(tok, ("step3p5", "step3p5"), req, [ids[i : i + size] for i in range(0, len(ids), size)]) == one


def test_enable_thinking_is_ignored(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    req = {"tools": cases.TOOLS, "chat_template_kwargs": {"enable_thinking": False}}
    assert parsers.thinking_enabled("step3p5", {"enable_thinking": False}) is True
    off = _stream(tok, ("step3p5", "step3p5"), req, [[t] for t in ids])
    assert off["reasoning"] == "Need the weather." and off["calls"] and off["calls"][0][0] == "get_weather"


def test_a_long_argument_resumes_from_every_snapshot_with_small_states(tok: Any) -> None:
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " </para", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = ["plan\n", "@</think>", "@<tool_call>", "\n<function=search>\n<parameter=q>\n", value]
    segments += ["\n</parameter>\n</function>\n", "@</tool_call>", "@<|im_end|>"]
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, [*cases.PROMPTS["open"], "@<think>", "\n"])
    parser = parsers.get_parser(tok, "step3p5", "step3p5", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    calls = [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls]
    reasoning = "".join(d.reasoning or "" for d in deltas if d is not None)
    assert len(ids) > 3000
    assert max(sizes) < 1200, max(sizes)  # qwen3+qwen3_coder: < 1000; the engine reasoning state adds ~80 bytes
    assert max(writes[-2000:]) < 100, max(writes[-2000:])
    assert reasoning == "plan"
    assert calls == [("search", json.dumps({"q": value}, ensure_ascii=False))]


def test_structural_tag_and_render_effects() -> None:
    step3p5 = parsers.tool_parser_class("step3p5")
    qwen3_coder = parsers.tool_parser_class("qwen3_coder")
    assert step3p5.name == "step3p5" and step3p5.structural_tag_model == "qwen_3_coder"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice in ("auto", "required", "forced"):
        assert step3p5.structural_tag(tools, [True], choice) == qwen3_coder.structural_tag(tools, [True], choice)
    for reasoning, tool in (("step3p5", None), (None, "step3p5")):
        adjusted = parsers.adjust_request(
            reasoning, tool, RequestAdjustment(has_tools=True, tool_choice="auto", skip_special_tokens=None)
        )
        assert adjusted.skip_special_tokens is False  # ParserEngine.adjust_request
