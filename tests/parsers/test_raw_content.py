"""Raw content (`parsers/raw_content.py`): an engine tool parser behind a reasoning parser that is
not engine-based (deepseek_r1 / step3 + qwen3_coder on the Qwen3 vocabulary). With no call
accepted, batch returns the content raw (call markup and reasoning markers kept), with one the
engine's content and the calls: the stream accumulates to that under any chunking (markers split
across chunks, 1-token chunks, the state JSON round-tripped every chunk), never streams the
engine's reasoning, forwards content both answers share as it comes, and resumes mid-hold from a
snapshot whose held text travels in a segment."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
from render_service.parsers import raw_content
from render_service.server.metrics import Metrics
from tests.parity.compare_parsers import random_chunks
from tests.parsers import cases, stream_vs_batch

CALL = [
    "@<tool_call>",
    "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
    "@</tool_call>",
]
UNKNOWN = ["@<tool_call>", "\n<function=unknown_tool>\n<parameter=q>\nx\n</parameter>\n</function>\n", "@</tool_call>"]
JSON_CALL = ["@<tool_call>", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "@</tool_call>"]
OUTPUTS: dict[str, list[Any]] = {
    "plain": ["Sunny", " in é 😀 Paris."],
    "call": ["Let me check.", *CALL, " trailing"],
    "any_name": ["Checking ", *UNKNOWN, " then 中文"],  # qwen3_coder accepts any function name
    "json_in_xml_parser": ["x ", *JSON_CALL],
    "unclosed": ["a ", "@<tool_call>", "\n<function=get_weather>\n<parameter=city>\nPar"],
    "think_in_content": ["@<think>", " later thoughts ", "@</think>", " answer {"],
    "think_then_call": ["@<think>", " hm ", "@</think>", " ok", *CALL],
    "spelled_markers": [("chars", "<tool_call>"), ("chars", "<function=search>"), " x"],
    "whitespace_then_call": ["\n\n", *CALL],
    "whitespace_only": ["\n \n"],
}
# (reasoning parser, prompt): both close reasoning before the output (deepseek_r1 with </think> in
# the prompt; step3's output closes it itself, so its outputs get a `</think>` in front)
CONFIGS = [("deepseek_r1", "nothink"), ("step3", "open")]
REQUESTS = {"auto": {"tools": cases.TOOLS}, "required": {"tools": cases.TOOLS, "tool_choice": "required"}}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return stream_vs_batch.load_tokenizer("qwen3_coder", Path(tmp_path_factory.mktemp("raw-content")))


def _setup(
    tok: Any, reasoning: str, prompt_name: str, output: str, request: str
) -> tuple[Any, dict, list[int], list[int]]:
    parser = parsers.get_parser(tok, reasoning, "qwen3_coder", enable_auto_tools=True)
    assert parser is not None and parser.raw_shadow
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **REQUESTS[request]}
    segments = OUTPUTS[output] if reasoning != "step3" else ["@</think>", *OUTPUTS[output]]
    ids = cases.encode(tok, [*segments, "@<|im_end|>"])
    return parser, req, cases.encode(tok, cases.PROMPTS[prompt_name]), ids


def _view(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        "reasoning": batch["reasoning"] or "",
        "content": batch["content"] or "",
        "calls": [list(c[:2]) for c in batch["tool_calls"]],
        "finish": batch["finish_reason"],
    }


def _accumulated(steps: list[tuple[Any, str | None]]) -> dict[str, Any]:
    joined = cases.concat(steps)
    calls = [[joined["names"].get(i, ""), joined["args"].get(i, "")] for i in sorted(joined["names"])]
    return {"reasoning": joined["reasoning"], "content": joined["content"], "calls": calls, "finish": joined["finish"]}


@pytest.mark.parametrize("request_name", sorted(REQUESTS))
@pytest.mark.parametrize(("reasoning", "prompt_name"), CONFIGS)
@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_stream_accumulates_to_batch_under_any_chunking(
    tok: Any, reasoning: str, prompt_name: str, output: str, request_name: str
) -> None:
    parser, req, prompt, ids = _setup(tok, reasoning, prompt_name, output, request_name)
    eos = (cases.EOS, cases.MODEL_EOS)
    want = _view(cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=eos))
    rng = random.Random(output)
    for chunks in [[[i] for i in ids], [ids], *(random_chunks(rng, ids) for _ in range(6))]:
        steps = cases.run_stream(tok, parser, req, prompt, chunks, "stop", roundtrip_every=1, eos=eos)
        assert _accumulated(steps) == want, (chunks, steps)
        assert not any(d is not None and d.reasoning for d, _ in steps)  # the engine's reasoning never goes out


def test_batch_answers_are_the_raw_and_the_parsed_content(tok: Any) -> None:
    eos = (cases.EOS, cases.MODEL_EOS)
    parser, req, prompt, ids = _setup(tok, "deepseek_r1", "nothink", "json_in_xml_parser", "auto")
    raw = _view(cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=eos))
    assert raw["content"] == 'x <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    parser, req, prompt, ids = _setup(tok, "deepseek_r1", "nothink", "think_in_content", "auto")
    raw = _view(cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=eos))
    assert raw == {
        "reasoning": "",
        "content": "<think> later thoughts </think> answer {",
        "calls": [],
        "finish": "stop",
    }
    parser, req, prompt, ids = _setup(tok, "deepseek_r1", "nothink", "call", "auto")
    called = _view(cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=eos))
    assert called["calls"] == [["get_weather", '{"city": "Paris"}']] and called["content"] == "Let me check."


def test_shared_content_streams_as_it_comes(tok: Any) -> None:
    """Content before any markup is forwarded chunk by chunk; from the first markup on the stream
    holds until a call is accepted or the stream ends."""
    parser, req, prompt, ids = _setup(tok, "deepseek_r1", "nothink", "json_in_xml_parser", "auto")
    steps = cases.run_stream(tok, parser, req, prompt, [[i] for i in ids], "stop", eos=(cases.EOS, cases.MODEL_EOS))
    contents = [d.content if d is not None else None for d, _ in steps]
    marker = ids.index(tok.convert_tokens_to_ids("<tool_call>"))
    before = "".join(c for c in contents[:marker] if c)
    assert before and "x ".startswith(before)  # went out before the markup arrived
    assert all(c is None for c in contents[marker:-1])  # held from the <tool_call> on ...
    assert contents[-1] and "<tool_call>" in contents[-1]  # ... then the raw text


class _Segments:
    """A snapshot store's segment writer and reader, as the derender pipeline uses them."""

    def __init__(self) -> None:
        self.store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())

    def save(self, state: Any, position: int) -> tuple[Any, list[Any]]:
        writer = self.store.segment_writer("f" * 16, "s", position)
        obj = json.loads(json.dumps(state.to_obj(writer)))
        return obj, list(writer.refs)

    def stored(self, refs: list[Any]) -> list[Any]:
        assert self.store.local is not None
        return [self.store.local.segments.text(*ref) for ref in refs]


def test_resume_from_a_snapshot_mid_hold(tok: Any) -> None:
    """A long raw backlog (a call the parser rejects: JSON, not XML) travels as a segment beside the
    snapshot; the resumed stream ends exactly as the one that never stopped."""
    parser = parsers.get_parser(tok, "deepseek_r1", "qwen3_coder", enable_auto_tools=True)
    assert parser is not None
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": cases.TOOLS}
    long_value = "lorem ipsum é 😀 " * 200
    ids = cases.encode(
        tok,
        ["Hi ", "@<tool_call>", json.dumps({"name": "search", "arguments": {"q": long_value}}, ensure_ascii=False)],
    )
    prompt = cases.encode(tok, cases.PROMPTS["nothink"])
    opts = parsers.RequestOptions.from_request(req)
    ids_fn = parsers.tool_ids("r")

    def run(state: Any, upto: range) -> list[Any]:
        out = []
        for i in upto:
            fr = "length" if i == len(ids) - 1 else None
            out.append(parsers.advance(parser, state, [ids[i]], [ids[i]], fr, opts, ids_fn))
        return out

    straight = run(parsers.new_parsed_stream(parser, prompt), range(len(ids)))
    segments = _Segments()
    for cut in (3, len(ids) // 2, len(ids) - 1):
        state = parsers.new_parsed_stream(parser, prompt)
        head = run(state, range(cut))
        obj, refs = segments.save(state, cut)
        if cut > 3:
            assert refs and len(json.dumps(obj)) < 2000  # the backlog is not in the state
        resumed = parsers.load_parsed_stream(parser, obj, segments.stored(refs))
        assert head + run(resumed, range(cut, len(ids))) == straight
    batch = cases.run_batch(tok, parser, req, prompt, ids, "length")
    assert _accumulated(straight) == _view(batch) and long_value in batch["content"]


def test_a_state_without_the_shadow_is_refused(tok: Any) -> None:
    parser = parsers.get_parser(tok, "deepseek_r1", "qwen3_coder", enable_auto_tools=True)
    assert parser is not None
    state = parser.new_state([])
    assert isinstance(state.raw, raw_content.RawShadow)
    obj = state.to_obj()
    assert obj[-1] is not None  # the shadow is the state's last field
    obj[-1] = None  # e.g. a state made before the shadow existed for this configuration
    with pytest.raises(ValueError, match="does not match"):
        parser.load_state(obj)
