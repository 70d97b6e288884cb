"""Hunyuan V3/V4's native parsers (`render_service/parsers/hy.py`) beyond the fuzzed goldens
(`golden_families/hy.jsonl`): the checkpoint suffix, the `reasoning_effort` switch, values typed by
the request's schema, any chunking answering as batch does, and resuming from every snapshot while
a long call is held."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers import hy
from tests.parsers import cases
from tests.parsers.families import hunyuan

S = hunyuan.SUFFIX
EOS = (hunyuan.HY_IDS["<|hy_end|>"], frozenset({hunyuan.HY_IDS["<|hy_end|>"]}))
THINKING = {"reasoning_effort": "high"}
REQ = {"tools": hunyuan.HY_TOOLS, "chat_template_kwargs": THINKING}


def _m(name: str) -> str:
    return f"@<{name}{S}>"


def _arg(key: str, value: str) -> list[str]:
    return [_m("arg_key"), key, _m("/arg_key"), "\n", _m("arg_value"), value, _m("/arg_value")]


TURN = [
    "Need the weather.",
    _m("/think"),
    "Checking é",
    _m("tool_calls"),
    _m("tool_call"),
    "typed",
    _m("tool_sep"),
    *_arg("flag", "True"),
    *_arg("n", " 7 "),
    *_arg("x", "2.50"),
    *_arg("tags", '["a", 1]'),
    *_arg("either", '{"k": 1}'),
    *_arg("other", "(1, 2)"),
    _m("/tool_call"),
    _m("tool_call"),
    " search\n",
    _m("tool_sep"),
    *_arg("q", "x < y"),
    *_arg("q", "last"),
    _m("/tool_call"),
    _m("/tool_calls"),
    " dropped",
    "@<|hy_end|>",
]
# `either` is string or object: JSON first; `other` has no schema: text
TYPED = {"flag": True, "n": 7, "x": 2.5, "tags": ["a", 1], "either": {"k": 1}, "other": "(1, 2)"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hunyuan.build_hy(Path(tmp_path_factory.mktemp("hy")))))


def _parser(tok: Any, config: tuple[str | None, str | None], kwargs: dict[str, Any]) -> Any:
    parser = parsers.get_parser(
        tok,
        config[0],
        config[1],
        enable_auto_tools=True,
        thinking_enabled=parsers.thinking_enabled(config[0], kwargs, config[1]),
    )
    assert parser is not None
    return parser


def _stream(tok: Any, config: tuple[str | None, str | None], req: dict[str, Any], chunks: list[list[int]]) -> dict:
    parser = _parser(tok, config, req.get("chat_template_kwargs") or {})
    prompt = cases.encode(tok, hunyuan.HY_PROMPTS["open"])
    steps = cases.run_stream(tok, parser, req, prompt, chunks, "stop", roundtrip_every=1, eos=EOS)
    joined = cases.concat(steps)
    return {
        "reasoning": joined["reasoning"],
        "content": joined["content"],
        "calls": [(joined["names"][i], joined["args"].get(i, "")) for i in sorted(joined["names"])],
        "finish": joined["finish"],
    }


def _chunkings(ids: list[int]) -> list[list[list[int]]]:
    return [[ids[i : i + size] for i in range(0, len(ids), size)] for size in (1, 2, 3, 5, 8, len(ids))]


def test_the_suffix_comes_from_the_config_for_v3_and_from_the_vocabulary_for_v4(tok: Any) -> None:
    info = TokenizerInfo.of(tok)
    assert hy.config_suffix(info) == S and hy.vocab_suffix(info) == S
    for name in ("hy_v3", "hy_v4"):
        parser = _parser(tok, (name, None), THINKING).reasoning
        assert (parser.start_token, parser.end_token) == (f"<think{S}>", f"</think{S}>")


def test_reasoning_effort_switches_reasoning_off_with_per_version_defaults() -> None:
    assert parsers.thinking_enabled("hy_v3", {}) is False  # vLLM: no effort is no_think
    assert parsers.thinking_enabled("hy_v4", {}) is True  # the template's default, high
    for name in ("hy_v3", "hy_v4"):
        assert parsers.thinking_enabled(name, {"reasoning_effort": "no_think"}) is False
        assert parsers.thinking_enabled(name, {"reasoning_effort": "low"}) is True


def test_a_whole_turn_types_values_by_schema_under_any_chunking(tok: Any) -> None:
    ids = cases.encode(tok, TURN)
    prompt = cases.encode(tok, hunyuan.HY_PROMPTS["open"])
    batch = cases.run_batch(tok, _parser(tok, ("hy_v3", "hy_v3"), THINKING), REQ, prompt, ids, "stop", eos=EOS)
    calls = [("typed", json.dumps(TYPED, ensure_ascii=False)), ("search", json.dumps({"q": "last"}))]
    assert (batch["reasoning"], batch["content"]) == ("Need the weather.", "Checking é")
    assert [tuple(c) for c in batch["tool_calls"]] == calls
    for config in (("hy_v3", "hy_v3"), ("hy_v4", "hy_v3")):
        for chunks in _chunkings(ids):
            out = _stream(tok, config, REQ, chunks)
            assert out == {
                "reasoning": "Need the weather.",
                "content": "Checking é",
                "calls": calls,
                "finish": "tool_calls",
            }
    # no_think: all of it is content, the calls after it are still read
    out = _stream(tok, ("hy_v3", "hy_v3"), {"tools": hunyuan.HY_TOOLS}, [ids])
    assert out["reasoning"] == "" and out["content"] == f"Need the weather.</think{S}>Checking é"


def test_values_are_typed_as_vllm_falls_through_its_types() -> None:
    tools = hunyuan.HY_TOOLS
    assert hy.parse_value("[1, 2]", "unknown", "k", tools) == "[1, 2]"  # no schema: text
    assert hy.parse_value("3", "get_weather", "n", tools) == 3
    assert hy.parse_value("3x", "get_weather", "n", tools) == "3x"  # not an int: JSON, literal, else text
    assert hy.parse_value("1e3", "typed", "x", tools) == 1000.0
    assert hy.parse_value("5", "typed", "x", tools) == 5
    assert hy.parse_value("(1, 2)", "typed", "flag", tools) == (1, 2)  # not a bool: a Python literal
    assert hy.parse_value("maybe", "typed", "flag", tools) == "maybe"


def test_a_marker_without_a_complete_call_still_counts_as_called(tok: Any) -> None:
    ids = cases.encode(tok, ["Hi", _m("tool_calls"), _m("tool_call"), "search", "@<|hy_end|>"])
    prompt = cases.encode(tok, hunyuan.HY_PROMPTS["bare"])
    batch = cases.run_batch(tok, _parser(tok, (None, "hy_v3"), {}), REQ, prompt, ids, "stop", eos=EOS)
    assert (batch["content"], batch["tool_calls"], batch["finish_reason"]) == ("Hi", [], "stop")
    for chunks in _chunkings(ids):
        out = _stream(tok, (None, "hy_v3"), REQ, chunks)
        assert (out["content"], out["calls"], out["finish"]) == ("Hi", [], "stop")


def test_a_held_call_resumes_from_every_snapshot_with_small_states(tok: Any) -> None:
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " </arg_", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = ["plan", _m("/think"), "ok", _m("tool_calls"), _m("tool_call"), "search", _m("tool_sep")]
    ids = cases.encode(tok, [*segments, *_arg("q", value), _m("/tool_call"), _m("/tool_calls"), "@<|hy_end|>"])
    prompt = cases.encode(tok, hunyuan.HY_PROMPTS["open"])
    parser = _parser(tok, ("hy_v4", "hy_v3"), {})
    opts = parsers.RequestOptions.from_request(REQ)
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    calls = [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls]
    assert len(ids) > 3000
    assert max(sizes) < 1000, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])
    assert "".join(d.reasoning or "" for d in deltas if d is not None) == "plan"
    assert calls == [("search", None), (None, json.dumps({"q": value}, ensure_ascii=False))]


def test_the_tool_parser_needs_its_markers_in_the_vocabulary(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from render_service.model.example import build_example_model

    other = AutoTokenizer.from_pretrained(str(build_example_model(tmp_path / "qwen3", "qwen3")))
    with pytest.raises(RuntimeError):
        parsers.get_parser(other, None, "hy_v3", enable_auto_tools=True)
