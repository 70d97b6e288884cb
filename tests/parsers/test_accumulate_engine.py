"""Engine reasoning families (GLM, Seed-OSS, Kimi K2, DeepSeek V4), Kimi K2's tool calls and
Nemotron V3, whose streams now accumulate to the batch answer (issue 16 item 4, tools/ACC.md):
markers spelled as text or repeated, split across chunks, one token per chunk, trailing reasoning
whitespace across content, a stream resumed from its state in the middle of a held marker prefix,
Kimi's `{}` arguments and native ids, and Nemotron's forced content (a deliberate batch
difference, `tests/parsers/deliberate.py`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from tests.parity.compare_parsers import FAMILIES
from tests.parsers.cases import chunk, concat, encode, run_batch, run_stream
from tests.parsers.stream_vs_batch import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("acc-engine-models")


_TOKS: dict[str, Any] = {}


def _tok(models: Path, family: str) -> Any:
    if family not in _TOKS:
        _TOKS[family] = load_tokenizer(family, models)
    return _TOKS[family]


def _run(
    models: Path,
    family: str,
    reasoning: str | None,
    tool: str | None,
    segments: list[Any],
    how: Any,
    *,
    prompt: str,
    req: dict[str, Any] | None = None,
    finish: str = "stop",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what the stream accumulates to, the batch answer) for one output under one chunking,
    the stream state JSON round-tripped before every chunk (a resume on another replica)."""
    tok = _tok(models, family)
    fam = FAMILIES[family]
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **(req or {"tools": TOOLS})}
    kwargs = req.get("chat_template_kwargs") or {}
    parser = parsers.get_parser(
        tok, reasoning, tool, enable_auto_tools=True, thinking_enabled=parsers.thinking_enabled(reasoning, kwargs, tool)
    )
    assert parser is not None
    ids = encode(tok, segments)
    prompt_ids = encode(tok, fam.prompts[prompt])
    chunks = how(ids) if callable(how) else chunk(ids, how)
    steps = run_stream(tok, parser, req, prompt_ids, chunks, finish, roundtrip_every=1, eos=fam.eos)
    batch = run_batch(tok, parser, req, prompt_ids, ids, finish, eos=fam.eos)
    streamed = concat(steps)
    whole = {
        "reasoning": batch["reasoning"] or "",
        "content": batch["content"] or "",
        "calls": [(c[0], c[1]) for c in batch["tool_calls"]],
        "ids": [c[2] if len(c) > 2 else "" for c in batch["tool_calls"]],
        "finish": batch["finish_reason"],
    }
    indexes = sorted(set(streamed["names"]) | set(streamed["args"]))
    call_ids: dict[int, str] = {}
    for delta, _ in steps:
        for tc in delta.tool_calls if delta is not None else ():
            if tc.id is not None:
                call_ids[tc.index] = tc.id
    mine = {
        "reasoning": streamed["reasoning"],
        "content": streamed["content"],
        "calls": [(streamed["names"].get(i, ""), streamed["args"].get(i, "")) for i in indexes],
        "ids": [call_ids.get(i, "") for i in indexes],
        "finish": streamed["finish"],
    }
    return mine, whole


def _same(mine: dict[str, Any], whole: dict[str, Any]) -> None:
    for field in ("reasoning", "content", "calls", "finish"):
        assert mine[field] == whole[field], field


CHUNKINGS = ["one", "all", [3, 1, 2], [2, 5]]

# GLM: `<think>` spelled by ordinary tokens, reasoning whitespace before a content gap, a second
# reasoning block, then a call whose markup holds a `<think>` (batch re-opens reasoning there).
GLM_OUT = [
    ("chars", "<think>"),
    "plan a  \n",
    "@</think>",
    "mid",
    "@<think>",
    "more\n\n",
    "@</think>",
    " ok",
]


@pytest.mark.parametrize("how", CHUNKINGS)
@pytest.mark.parametrize("tool", [None, "glm45"])
def test_glm_markers_as_text_and_reasoning_whitespace(models: Path, tool: str | None, how: Any) -> None:
    mine, whole = _run(models, "glm", "glm45", tool, GLM_OUT, how, prompt="open")
    # batch: the spelled `<think>` is dropped in reasoning, the whitespace before the content gap
    # is kept (only the end of all the reasoning is stripped)
    assert whole["reasoning"] == "plan a  \nmore"
    assert whole["content"] == "mid ok"
    _same(mine, whole)


def test_glm_think_again_inside_a_call(models: Path) -> None:
    """Batch's reasoning pass re-opens reasoning at a `<think>` in a call's markup; the tool parser
    then reads what is left: the stream hands it the same text."""
    out = ["@<think>", "a", "@</think>", "@<tool_call>", "search\n", "@<think>", "b", "@</think>", "@<tool_call>"]
    for how in CHUNKINGS:
        mine, whole = _run(models, "glm", "glm45", "glm45", out, how, prompt="open")
        assert whole["reasoning"] == "ab"
        _same(mine, whole)


def test_glm_required_blank_content_dropped(models: Path) -> None:
    """tool_choice required parsed like auto: batch drops a blank content without calls."""
    out = ["@<think>", "x", "@</think>", "\n\n", "@<|user|>"]
    for how in CHUNKINGS:
        mine, whole = _run(
            models, "glm", "glm45", "glm45", out, how, prompt="open", req={"tools": TOOLS, "tool_choice": "required"}
        )
        assert whole["content"] == ""
        _same(mine, whole)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_seed_oss_stray_end_marker_and_reasoning(models: Path, how: Any) -> None:
    out = ["@<seed:think>", "a \n", ("chars", "</seed:think>"), "b", "@</seed:think>", "c  "]
    mine, whole = _run(models, "seed_oss", "seed_oss", "qwen3_coder", out, how, prompt="open")
    _same(mine, whole)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_deepseek_v4_reasoning_after_a_prompt_that_closed_it(models: Path, how: Any) -> None:
    """Thinking off: `<think>` in content opens reasoning; its trailing whitespace is batch's to strip."""
    out = ["@<think>", 'x "}\n', "@</think>", " a<b"]
    mine, whole = _run(
        models,
        "deepseek_v4",
        "deepseek_v4",
        None,
        out,
        how,
        prompt="bare",
        req={"chat_template_kwargs": {"thinking": False}},
    )
    assert whole["reasoning"] == 'x "}'
    assert whole["content"] == " a<b"
    _same(mine, whole)


def test_resume_mid_marker_prefix(models: Path) -> None:
    """The lexer's held marker prefix lives in the state: every split of a spelled `</think>`
    (state round-tripped before each chunk) still ends reasoning there."""
    tok = _tok(models, "glm")
    out = ["@<think>", "plan", ("chars", "</think>"), "done"]
    ids = encode(tok, out)
    for cut in range(1, len(ids)):
        mine, whole = _run(models, "glm", "glm45", None, out, lambda _ids, c=cut: [_ids[:c], _ids[c:]], prompt="open")
        assert whole["reasoning"] == "plan" and whole["content"] == "done"
        _same(mine, whole)


def _random_cut(rng: random.Random) -> Any:
    def cut(ids: list[int]) -> list[list[int]]:
        out, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            out.append(ids[i : i + n])
            i += n
        return out

    return cut


KIMI_CALLS = [
    "@<think>",
    "plan  ",
    "@</think>",
    "@<|tool_calls_section_begin|>",
    "@<|tool_call_begin|>",
    "functions.search:0",
    "@<|tool_call_argument_begin|>",
    "@<|tool_call_end|>",
    "@<|tool_call_begin|>",
    "bad header",
    "@<|tool_call_argument_begin|>",
    '{"city": "Oslo"}',
    "@<|tool_call_end|>",
    "@<|tool_call_begin|>",
    "functions.get_weather:2",
    "@<|tool_call_argument_begin|>",
    '{"city": "Lyon"}',
    "@<|tool_call_end|>",
    "@<|tool_calls_section_end|>",
]


@pytest.mark.parametrize("how", CHUNKINGS)
@pytest.mark.parametrize("reasoning", [None, "kimi_k2"])
def test_kimi_calls_whole_with_native_ids(models: Path, reasoning: str | None, how: Any) -> None:
    """A call without argument text gets `{}` (as in batch), a call after a malformed header is
    kept, and the ids are Kimi's own `functions.NAME:N`."""
    mine, whole = _run(models, "kimi", reasoning, "kimi_k2", KIMI_CALLS, how, prompt="open")
    assert whole["calls"] == [("search", "{}"), ("get_weather", '{"city": "Lyon"}')]
    assert whole["ids"] == ["functions.search:0", "functions.get_weather:2"]
    _same(mine, whole)
    assert mine["ids"] == whole["ids"]
    if reasoning:
        assert mine["reasoning"] == "plan"


def test_kimi_section_marker_spelled_as_text(models: Path) -> None:
    out = ["ok ", ("chars", "<|tool_calls_section_begin|>"), "@<|tool_call_begin|>", "functions.search:0"]
    for how in CHUNKINGS:
        mine, whole = _run(
            models, "kimi", None, "kimi_k2", out, how, prompt="open", req={"tools": TOOLS}, finish="length"
        )
        assert whole["content"] == "ok "
        assert whole["calls"] == [("search", "{}")]
        _same(mine, whole)


def test_engine_random_chunkings_accumulate(models: Path) -> None:
    rng = random.Random(11)
    for _ in range(15):
        mine, whole = _run(models, "kimi", "kimi_k2", "kimi_k2", KIMI_CALLS, _random_cut(rng), prompt="open")
        _same(mine, whole)
        mine, whole = _run(models, "glm", "glm45", "glm45", GLM_OUT, _random_cut(rng), prompt="open")
        _same(mine, whole)


FORCE = {"tools": TOOLS, "chat_template_kwargs": {"force_nonempty_content": True}}


@pytest.mark.parametrize("how", CHUNKINGS)
def test_nemotron_force_content_unfinished_reasoning(models: Path, how: Any) -> None:
    """Force mode, the output ends inside reasoning: the reasoning streamed goes out once more as
    content at the end; batch keeps it as reasoning too (deliberate: vLLM's swaps)."""
    mine, whole = _run(models, "nemotron_v3", "nemotron_v3", "hermes", ["plan a <  "], how, prompt="open", req=FORCE)
    assert whole["reasoning"] == "plan a <"
    assert whole["content"] == "plan a <"
    _same(mine, whole)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_nemotron_force_blank_content_after_reasoning(models: Path, how: Any) -> None:
    mine, whole = _run(
        models,
        "nemotron_v3",
        "nemotron_v3",
        None,
        ["plan\n", "@</think>", " \n", "@<|im_end|>"],
        how,
        prompt="open",
        req=FORCE,
    )
    assert whole["reasoning"] == "plan" and whole["content"] == "plan"
    _same(mine, whole)


def test_nemotron_thinking_off_blank_output_is_vllms_swap(models: Path) -> None:
    """No reasoning at all: the held blank content becomes the reasoning, as vLLM's batch swaps it."""
    req = {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}
    for how in CHUNKINGS:
        mine, whole = _run(
            models, "nemotron_v3", "nemotron_v3", None, ["  \n", "@<|im_end|>"], how, prompt="open", req=req
        )
        assert whole["reasoning"] == "  \n" and whole["content"] == ""
        _same(mine, whole)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_nemotron_trailing_reasoning_whitespace_and_split_marker(models: Path, how: Any) -> None:
    out = ["a \n", ("chars", "</think>"), "b  ", "@<|im_end|>"]
    mine, whole = _run(models, "nemotron_v3", "nemotron_v3", "hermes", out, how, prompt="open")
    assert whole["reasoning"] == "a"
    assert whole["content"] == "b  "
    _same(mine, whole)
