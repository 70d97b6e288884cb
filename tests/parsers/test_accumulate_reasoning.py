"""Reasoning parsers whose stream now accumulates to the batch answer (issue 16 item 4,
tools/ACC.md): markers split across chunks, one token per chunk, a stream resumed from its
state in the middle of a held marker prefix, and the batch answers that deliberately follow the
stream's rule (`tests/parsers/deliberate.py` BATCH_*).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from render_service.parsers import get_parser
from tests.parsers.cases import PROMPTS, REQ, chunk, concat, encode, run_batch, run_stream


@pytest.fixture(scope="module")
def tok(qwen3_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


def _both(tok: Any, reasoning: str, tool: str | None, segments: list[Any], chunks_how: Any, prompt: str = "open"):
    parser = get_parser(tok, reasoning, tool, enable_auto_tools=True)
    assert parser is not None
    ids = encode(tok, segments)
    prompt_ids = encode(tok, PROMPTS[prompt])
    chunks = chunks_how(ids) if callable(chunks_how) else chunk(ids, chunks_how)
    req = REQ["auto"]
    steps = run_stream(tok, parser, req, prompt_ids, chunks, "stop", roundtrip_every=1)
    batch = run_batch(tok, parser, req, prompt_ids, ids, "stop")
    return concat(steps), batch


def _same(streamed: dict, batch: dict) -> None:
    assert streamed["reasoning"] == (batch["reasoning"] or "")
    assert streamed["content"] == (batch["content"] or "")


SPELLED = [("chars", "<think>"), "plan < a", ("chars", "</thi"), "x", ("chars", "</think>"), "answer", "@<|im_end|>"]


@pytest.mark.parametrize("how", ["one", "all", [3, 1, 2]])
def test_deepseek_r1_markers_spelled_as_text_split_across_chunks(tok: Any, how: Any) -> None:
    """`<think>` / `</think>` spelled by ordinary tokens, one character per token: batch splits
    at the text, and so does the stream, holding only a possible marker prefix."""
    streamed, batch = _both(tok, "deepseek_r1", None, SPELLED, how)
    assert batch["reasoning"] == "plan < a</thix"
    assert batch["content"] == "answer"
    _same(streamed, batch)


def test_deepseek_r1_random_chunkings_accumulate(tok: Any) -> None:
    rng = random.Random(7)
    segments = ["pre ", "@<think>", "a<b </", "@</think>", "ans</think>wer <think>"]
    for _ in range(40):

        def cut(ids: list[int]) -> list[list[int]]:
            out, i = [], 0
            while i < len(ids):
                n = rng.randint(1, 4)
                out.append(ids[i : i + n])
                i += n
            return out

        streamed, batch = _both(tok, "deepseek_r1", "hermes", segments, cut)
        # text before <think> stays reasoning, the first <think> goes, content keeps later markers
        assert batch["reasoning"] == "pre a<b </"
        assert batch["content"] == "ans</think>wer <think>"
        _same(streamed, batch)


def test_deepseek_r1_resumes_mid_hold(tok: Any) -> None:
    """The held marker prefix lives in the state: a stream resumed from its JSON between
    `</th` and `ink>` still ends reasoning there."""
    from render_service.parsers import RequestOptions, advance, load_parsed_stream, new_parsed_stream, tool_ids

    parser = get_parser(tok, "deepseek_r1", None, enable_auto_tools=True)
    assert parser is not None
    opts = RequestOptions.from_request(REQ["auto"])
    state = new_parsed_stream(parser, encode(tok, PROMPTS["open"]))
    first = encode(tok, ["why", ("chars", "</th")])
    delta, _ = advance(parser, state, first, first, None, opts, tool_ids("r"))
    assert delta is not None and delta.reasoning == "why" and delta.content is None
    obj = json.loads(json.dumps(state.to_obj()))
    assert "</th" in json.dumps(obj)
    state = load_parsed_stream(parser, obj)
    rest = encode(tok, [("chars", "ink>"), "done"])
    delta, _ = advance(parser, state, rest, rest, None, opts, tool_ids("r"))
    assert delta is not None and not delta.reasoning and delta.content == "done"


def test_deepseek_r1_held_prefix_flushed_at_the_end(tok: Any) -> None:
    streamed, batch = _both(tok, "deepseek_r1", None, ["think ", ("chars", "</thi")], "one")
    assert streamed["reasoning"] == "think </thi" == batch["reasoning"]


@pytest.mark.parametrize("tool", [None, "hermes"])
def test_deepseek_r1_prompt_closed_batch_follows_the_stream(tok: Any, tool: str | None) -> None:
    """Prompt closed reasoning: the stream sends everything as content (as vLLM's does); batch
    follows it (vLLM's batch would make `Answer` reasoning, and here split at `</think>`)."""
    streamed, batch = _both(tok, "deepseek_r1", tool, ["Answer", "@</think>", " more", "@<|im_end|>"], "one", "nothink")
    assert batch["reasoning"] is None
    assert batch["content"] == "Answer</think> more"
    _same(streamed, batch)


def test_deepseek_r1_batch_without_prompt_keeps_vllm_rule(tok: Any) -> None:
    """Without prompt ids batch cannot know the prompt closed reasoning: vLLM's rule."""
    parser = get_parser(tok, "deepseek_r1", None, enable_auto_tools=True)
    assert parser is not None
    from render_service.parsers import RequestOptions

    assert parser.parse_batch("Answer", RequestOptions()) == ("Answer", None, [])
    closed = encode(tok, PROMPTS["nothink"])
    assert parser.parse_batch("Answer", RequestOptions(), None, (), closed) == (None, "Answer", [])


# -- qwen3: markers matched by text, as batch's engine matches them --------------------------------

QWEN3_SPELLED = [
    "@<think>",
    "plan ",
    ("chars", "<think>"),  # dropped from reasoning, as batch drops it
    "more",
    "@</think>",
    "ans",
    ("chars", "</think>"),  # dropped from content
    "wer ",
    "@<|im_end|>",  # ignore_eos: a special token inside the output, dropped from content
    " end",
]


@pytest.mark.parametrize("how", ["one", "all", [3, 1, 2]])
@pytest.mark.parametrize("tool", [None, "hermes"])
def test_qwen3_markers_spelled_as_text_split_across_chunks(tok: Any, how: Any, tool: str | None) -> None:
    streamed, batch = _both(tok, "qwen3", tool, QWEN3_SPELLED, how)
    assert batch["reasoning"] == "plan more"
    assert batch["content"] == "answer  end"
    _same(streamed, batch)


@pytest.mark.parametrize("prompt", ["open", "closed"])
def test_qwen3_random_chunkings_accumulate(tok: Any, prompt: str) -> None:
    rng = random.Random(11)
    segments = ["a<b ", ("chars", "<tool_call>"), " x", "@</think>", "c ", ("chars", "</think>"), "<d", "@<|im_end|>"]
    for _ in range(30):

        def cut(ids: list[int]) -> list[list[int]]:
            out, i = [], 0
            while i < len(ids):
                n = rng.randint(1, 4)
                out.append(ids[i : i + n])
                i += n
            return out

        streamed, batch = _both(tok, "qwen3", "hermes", segments, cut, prompt)
        _same(streamed, batch)


def test_qwen3_resumes_mid_hold_after_reasoning(tok: Any) -> None:
    """After reasoning, a possible `</think>` prefix at a chunk end is held in the state: a
    stream resumed from its JSON between `</th` and `ink>` still drops the marker."""
    from render_service.parsers import RequestOptions, advance, load_parsed_stream, new_parsed_stream, tool_ids

    parser = get_parser(tok, "qwen3", None, enable_auto_tools=True)
    assert parser is not None
    opts = RequestOptions.from_request(REQ["auto"])
    state = new_parsed_stream(parser, encode(tok, PROMPTS["closed"]))
    first = encode(tok, ["why", ("chars", "</th")])
    delta, _ = advance(parser, state, first, first, None, opts, tool_ids("r"))
    assert delta is not None and delta.content == "why" and not delta.reasoning
    obj = json.loads(json.dumps(state.to_obj()))
    assert "</th" in json.dumps(obj)
    state = load_parsed_stream(parser, obj)
    rest = encode(tok, [("chars", "ink>"), "done"])
    delta, _ = advance(parser, state, rest, rest, "stop", opts, tool_ids("r"))
    assert delta is not None and delta.content == "done"


def test_qwen3_held_prefix_flushed_at_the_end(tok: Any) -> None:
    streamed, batch = _both(tok, "qwen3", None, ["@</think>", "answer ", ("chars", "</thi")], "one")
    assert streamed["content"] == "answer </thi" == batch["content"]
