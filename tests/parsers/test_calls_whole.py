"""Engine tool parsers that send each call whole (`EngineToolParser.calls_whole`): the stream adds
up to the batch answer where vLLM's does not (a repeated or unclosed parameter, content after the
calls, whitespace around them), under 1-token and split chunkings, with the state resumed from a
snapshot at every chunk, also while a call or text is held."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from tests.parsers import cases
from tests.parsers.stream_vs_batch import _batch_view, _stream_view

FUNC = "\n<function=get_weather>\n"
THINK = ["@<think>", "plan", "@</think>"]
CHUNKINGS: list[str | list[int]] = ["one", [2, 1, 3], [5], "all"]


@pytest.fixture(scope="module")
def tok(qwen3_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_model_dir))


@pytest.fixture(scope="module")
def minimax_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The MiniMax fixture tokenizer, loaded once for the module's parametrised cases."""
    from tests.parsers.stream_vs_batch import load_tokenizer

    return load_tokenizer("minimax_m2", Path(tmp_path_factory.getbasetemp()) / "minimax")


def _both(tok: Any, segments: list[Any], how: str | list[int], req: str = "auto", finish: str = "stop") -> tuple:
    parser = parsers.get_parser(tok, "qwen3", "qwen3_coder", enable_auto_tools=True)
    assert parser is not None
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, cases.PROMPTS["open"])
    steps = cases.run_stream(tok, parser, cases.REQ[req], prompt, cases.chunk(ids, how), finish, roundtrip_every=1)
    batch = cases.run_batch(tok, parser, cases.REQ[req], prompt, ids, finish)
    return _stream_view(steps), _batch_view(batch), steps


@pytest.mark.parametrize("how", CHUNKINGS)
def test_a_repeated_parameter_arrives_as_batch_converts_it(tok: Any, how: str | list[int]) -> None:
    # vLLM streams "Lyon" for the first `city`, then batch keeps the second value in its place.
    body = "<parameter=city>\nLyon\n</parameter>\n<parameter=n>3</parameter>\n<parameter=city>Oslo</parameter>\n"
    segments = [*THINK, "\n\nChecking. \n", "@<tool_call>", FUNC, body]
    segments += ["</function>\n", "@</tool_call>", " after the call", "@<|im_end|>"]
    streamed, whole, steps = _both(tok, segments, how)
    assert streamed == whole
    assert json.loads(whole["args"][0]) == {"city": "Oslo", "n": 3}
    # text after the calls is dropped (batch drops it), the content's trailing whitespace too;
    # the leading one is kept by both (deliberate: the stream sends it before any call is known)
    assert whole["content"] == "\n\nChecking."
    call_deltas = [d for d, _ in steps if d is not None and d.tool_calls]
    assert len(call_deltas) == 1 and call_deltas[0].tool_calls[0].name == "get_weather"  # sent whole


@pytest.mark.parametrize("how", CHUNKINGS)
def test_an_unclosed_parameter_is_not_streamed(tok: Any, how: str | list[int]) -> None:
    body = "<parameter=city>Paris</parameter>\n<parameter=n>\n12"
    streamed, whole, _ = _both(tok, [*THINK, "@<tool_call>", FUNC, body], how, finish="length")
    assert streamed == whole
    assert json.loads(whole["args"][0]) == {"city": "Paris"}


@pytest.mark.parametrize("how", CHUNKINGS)
def test_markers_spelled_by_ordinary_tokens_split_across_chunks(tok: Any, how: str | list[int]) -> None:
    # `<function=`, `<parameter=` and `</function>` one character per token
    segments = [*THINK, "Sure.  ", "@<tool_call>", ("chars", "\n<function=search>\n<parameter=q>x < y</parameter>\n")]
    segments += [("chars", "</function>\n"), "@</tool_call>", "@<|im_end|>"]
    streamed, whole, _ = _both(tok, segments, how)
    assert streamed == whole
    assert whole["names"] == ["search"] and whole["content"] == "Sure."


@pytest.mark.parametrize("how", CHUNKINGS)
def test_text_after_an_unnamed_call_is_held_then_kept(tok: Any, how: str | list[int]) -> None:
    # `<tool_call></tool_call>` names no call: batch keeps the text after it (and the whitespace
    # held before it), so the stream holds that text until the end, then sends it.
    segments = [*THINK, "a  ", "@<tool_call>", "@</tool_call>", " b ", "@<|im_end|>"]
    streamed, whole, _ = _both(tok, segments, how)
    assert streamed == whole
    assert whole["content"] == "a   b " and whole["names"] == []


def test_tool_choice_none_streams_as_before(tok: Any) -> None:
    segments = [*THINK, "x ", "@<tool_call>", FUNC, "<parameter=city>Paris</parameter>\n</function>\n", "@</tool_call>"]
    streamed, whole, _ = _both(tok, segments, "one", req="none")
    assert streamed == whole and whole["names"] == []


def test_dsml_call_is_held_beside_the_snapshot_and_arrives_whole(tmp_path: Path) -> None:
    """DeepSeek V3.2: a long parameter value is held (its text stored in a segment beside each
    snapshot), the call is sent once it ends, and text after the calls block is dropped, as batch."""
    from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
    from render_service.parsers.chat import advance, load_parsed_stream, new_parsed_stream
    from render_service.server.metrics import Metrics
    from tests.parity.compare_parsers import FAMILIES
    from tests.parsers.stream_vs_batch import load_tokenizer

    family = FAMILIES["deepseek_v32"]
    dtok = load_tokenizer("deepseek_v32", tmp_path)
    parser = parsers.get_parser(dtok, None, "deepseek_v32", enable_auto_tools=True)
    assert parser is not None
    value = "word é " * 400
    text = (
        'Calling.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        f'<｜DSML｜parameter name="city" string="true">{value}</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls> trailing"
    )
    ids = dtok.encode(text, add_special_tokens=False)
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())
    assert store.local is not None
    state = new_parsed_stream(parser, [])
    sizes, calls, content = [], [], ""
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        delta, _ = advance(parser, state, [t], [t], "stop" if last else None, opts, cases.tool_ids("r"))
        if delta is not None:
            calls += [(c.name, c.arguments) for c in delta.tool_calls]
            content += delta.content or ""
        writer = store.segment_writer("f" * 16, "s", i + 1)
        obj = json.loads(json.dumps(state.to_obj(writer)))
        sizes.append(len(json.dumps(obj)))
        stored = [store.local.segments.text(*ref) for ref in writer.refs]
        state = load_parsed_stream(parser, obj, stored)  # type: ignore[arg-type]
    batch = cases.run_batch(dtok, parser, cases.REQ["auto"], [], ids, "stop", eos=family.eos)
    assert max(sizes) < 1500, max(sizes)
    assert [tuple(c[:2]) for c in batch["tool_calls"]] == calls
    assert json.loads(calls[0][1]) == {"city": value}
    assert content == (batch["content"] or "") == "Calling.\n\n"


@pytest.mark.parametrize("how", CHUNKINGS)
@pytest.mark.parametrize("prompt_closes", [False, True])
def test_minimax_append_think_streams_the_prefix_whatever_the_prompt(
    minimax_tok: Any, how: str | list[int], prompt_closes: bool
) -> None:
    """Batch prepends `<think>` whatever the prompt holds and parses calls anywhere after it; so
    does the stream (vLLM's skips the prefix when the prompt closed reasoning)."""
    from tests.parity.compare_parsers import FAMILIES

    family = FAMILIES["minimax_m2"]
    mtok = minimax_tok
    prompt = mtok.encode("hi</think>\n\n" if prompt_closes else "hi", add_special_tokens=False)
    call = '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n'
    ids = mtok.encode("plan</think>Sure. " + call + "</minimax:tool_call>", add_special_tokens=False)
    for tool in (None, "minimax_m2"):
        parser = parsers.get_parser(mtok, "minimax_m2_append_think", tool, enable_auto_tools=True)
        assert parser is not None
        steps = cases.run_stream(
            mtok, parser, cases.REQ["auto"], prompt, cases.chunk(ids, how), "stop", roundtrip_every=1, eos=family.eos
        )
        batch = cases.run_batch(mtok, parser, cases.REQ["auto"], prompt, ids, "stop", eos=family.eos)
        assert _stream_view(steps) == _batch_view(batch)
        assert batch["content"].startswith("<think>plan")
        assert [c[0] for c in batch["tool_calls"]] == ([] if tool is None else ["get_weather"])
