"""The Llama 3/4, pythonic, Granite and Nemotron parsers: a stream continues identically in
another process from a JSON snapshot of its state, at every split point of a few outputs, and
the state stays tagged with its family.

Parity with vLLM 0.33 is checked by tests/parity/test_parsers_llama_parity.py (HTTP goldens) and
tests/parity/compare_parsers.py (fuzzed, against vLLM's own classes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.derender import detokenize as dt
from tests.parsers import cases
from tests.parsers.families.llama import build_family

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '{"name": "get_weather", "parameters": {"city": "Pa\\"ris ü 😀", "n": [1, 2.5]}}'

# family folder, (reasoning, tool), request extras, output segments (cases.encode), eos token
STREAMS: dict[str, tuple[str, tuple[str | None, str | None], dict[str, Any], list[Any], str]] = {
    "llama3_json": ("llama3", (None, "llama3_json"), {}, ["@<|python_tag|>", CALL + "; " + CALL, " bye"], "<|eot_id|>"),
    "pythonic": (
        "llama3",
        (None, "pythonic"),
        {},
        ["[get_weather(city='Pa\\'ris', n=-3), f(x={'a': [1]})]"],
        "<|eot_id|>",
    ),
    "llama4_pythonic": (
        "llama4",
        (None, "llama4_pythonic"),
        {},
        ["@<|python_start|>", "[get_weather(city='ü 😀')]", "@<|python_end|>"],
        "<|eot|>",
    ),
    "granite": (
        "granite",
        ("granite", "granite"),
        {},
        ["Here is my thought process: a: b Here is my resp Here's my response: fine ü"],
        "<|end_of_text|>",
    ),
    "granite_tool": (
        "granite",
        (None, "granite"),
        {},
        [
            "ok ",
            "@<|tool_call|>",
            ' [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "x", "arguments": {}}] tail',
        ],
        "<|end_of_text|>",
    ),
    "granite4": (
        "granite",
        (None, "granite4"),
        {},
        ["a ", "@<tool_call>", '{"name": "get_weather", "arguments": {"city": "Rome"}}', "@</tool_call>", " b"],
        "<|end_of_text|>",
    ),
    "nemotron_v3": (
        "nemotron",
        ("nemotron_v3", "hermes"),
        {"chat_template_kwargs": {"force_nonempty_content": True}},
        ["think ü \n\n", "@</think>", "\n\n", "@<tool_call>", cases.TC, "@</tool_call>"],
        "<|im_end|>",
    ),
    "required_json": (
        "llama3",
        (None, "pythonic"),
        {"tool_choice": "required"},
        ['[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "x", "parameters": {}}]'],
        "<|eot_id|>",
    ),
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_family(root / name, name) for name in ("llama3", "llama4", "granite", "nemotron")}


def _setup(model_dir: str, name: str) -> tuple[Any, parsers.ChatParser, dict[str, Any], list[int], list[int]]:
    from transformers import AutoTokenizer

    _folder, (reasoning, tool), extra, segments, eos = STREAMS[name]
    tok = AutoTokenizer.from_pretrained(model_dir)
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **extra}
    kwargs = req.get("chat_template_kwargs") or {}
    parser = parsers.get_parser(
        tok, reasoning, tool, enable_auto_tools=True, thinking_enabled=parsers.thinking_enabled(reasoning, kwargs)
    )
    assert parser is not None
    ids = [*cases.encode(tok, segments), tok.convert_tokens_to_ids(eos)]
    return tok, parser, req, tok.encode("hi", add_special_tokens=False), ids


def run(model_dir: str, name: str, state_json: str | None, start: int, stop: int) -> dict[str, Any]:
    """Stream tokens [start, stop) one per chunk from `state_json` (a fresh stream when None);
    the deltas (as vLLM's wire shows them) and the state after."""
    _tok, parser, req, prompt, ids = _setup(model_dir, name)
    opts = parsers.RequestOptions.from_request(req)
    eos = ids[-1]
    state = (
        parsers.new_parsed_stream(parser, prompt)
        if state_json is None
        else parsers.load_parsed_stream(parser, json.loads(state_json))
    )
    out = []
    for i in range(start, stop):
        fr = "stop" if i == len(ids) - 1 else None
        text_ids, _ = dt.drop_stop_token([ids[i]], fr, None, eos_token_id=eos, model_eos_token_ids=frozenset({eos}))
        delta, finish = parsers.advance(parser, state, text_ids, [ids[i]], fr, opts, parsers.tool_ids("r", 0))
        out.append([cases.wire(delta), finish, None if delta is None else [tc.id for tc in delta.tool_calls]])
    return {"deltas": out, "state": json.dumps(state.to_obj()), "n": len(ids)}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_a_stream_resumes_identically_in_another_process(name: str, family_dirs: dict[str, Path]) -> None:
    model_dir = str(family_dirs[STREAMS[name][0]])
    n = run(model_dir, name, None, 0, 0)["n"]
    whole = run(model_dir, name, None, 0, n)["deltas"]
    assert any(d is not None for d, _, _ in whole)
    splits = sorted({1, n // 3, n // 2, (2 * n) // 3, n - 1})
    for split in splits:
        head = run(model_dir, name, None, 0, split)
        script = (
            "import json, sys; from tests.parsers.test_llama_families import run; "
            "a = json.load(sys.stdin); print(json.dumps(run(*a)))"
        )
        child = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps([model_dir, name, head["state"], split, n]),
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        tail = json.loads(child.stdout.strip().splitlines()[-1])["deltas"]
        assert head["deltas"] + tail == whole, f"{name}: split at {split}"


def test_states_carry_their_family_tags(family_dirs: dict[str, Path]) -> None:
    tags = {}
    for name in ("llama3_json", "pythonic", "granite", "granite4", "nemotron_v3"):
        result = run(str(family_dirs[STREAMS[name][0]]), name, None, 0, 1)
        parser_state = json.loads(result["state"])[2]
        tags[name] = [s[0] for s in parser_state[6:8] if s is not None]
    assert tags == {
        "llama3_json": ["llama3_json/2"],
        "pythonic": ["pythonic/2"],
        "granite": ["granite_reasoning/2", "granite/2"],
        "granite4": ["granite4/3"],
        "nemotron_v3": ["nemotron_v3/2", "hermes/3"],
    }


# -- the granite tool parser sends each call whole (issue 16: its stream adds up to its batch answer)

GRANITE_CHUNKINGS: list[str | list[int]] = ["one", [2, 1, 3], "all"]
GRANITE_PROMPT = ["@<|start_of_role|>", "assistant", "@<|end_of_role|>"]


def _granite_both(
    model_dir: str, reasoning: str | None, segments: list[Any], how: str | list[int], finish: str
) -> tuple:
    from transformers import AutoTokenizer

    from tests.parsers.stream_vs_batch import _batch_view, _stream_view

    tok = AutoTokenizer.from_pretrained(model_dir)
    end = tok.convert_tokens_to_ids("<|end_of_text|>")
    eos = (end, frozenset({end}))
    parser = parsers.get_parser(tok, reasoning, "granite", enable_auto_tools=True)
    assert parser is not None
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": cases.TOOLS}
    ids, prompt = cases.encode(tok, segments), cases.encode(tok, GRANITE_PROMPT)
    steps = cases.run_stream(tok, parser, req, prompt, cases.chunk(ids, how), finish, roundtrip_every=1, eos=eos)
    batch = cases.run_batch(tok, parser, req, prompt, ids, finish, eos=eos)
    return _stream_view(steps), _batch_view(batch), steps


@pytest.mark.parametrize("how", GRANITE_CHUNKINGS)
@pytest.mark.parametrize("reasoning", [None, "granite"])
def test_granite_calls_arrive_as_batch_converts_them(
    family_dirs: dict[str, Path], reasoning: str | None, how: Any
) -> None:
    # vLLM streams `"n": "5"` and `\u00fc` verbatim, then ` tail`; batch fixes the integer (which
    # re-dumps the object, decoding the escape), strips the content and drops the text after the array.
    array = (
        ' [{"name": "get_weather", "arguments": {"n": "5", "city": "\\u00fc"}}, {"name": "search", "arguments": {}}]'
    )
    segments = ["ok \n", "@<|tool_call|>", array, " tail"]
    streamed, whole, steps = _granite_both(str(family_dirs["granite"]), reasoning, segments, how, "stop")
    assert streamed == whole
    assert whole["names"] == ["get_weather", "search"] and whole["content"] == "ok"
    assert json.loads(whole["args"][0]) == {"n": 5, "city": "ü"} and whole["args"][1] == "{}"
    call_deltas = [tc for d, _ in steps if d is not None for tc in d.tool_calls]
    assert all(tc.name and tc.arguments is not None for tc in call_deltas)  # each call in one delta


@pytest.mark.parametrize("how", GRANITE_CHUNKINGS)
def test_granite_unterminated_last_element_is_kept_verbatim(family_dirs: dict[str, Path], how: Any) -> None:
    # Batch names the call from its arguments' "name" and keeps the open `arguments` text as it
    # stands (escapes included); re-reading the element as JSON would have dropped the call.
    segments = ["@<tool_call>", ' [{"name": "search", "arguments": {"q": "\\u00fc tail']
    streamed, whole, _ = _granite_both(str(family_dirs["granite"]), None, segments, how, "length")
    assert streamed == whole
    assert whole["names"] == ["search"] and whole["args"] == ['{"q": "\\u00fc tail']


@pytest.mark.parametrize("how", GRANITE_CHUNKINGS)
def test_granite_behind_reasoning_without_a_call_is_raw_content(family_dirs: dict[str, Path], how: Any) -> None:
    # Not a JSON array after the marker: no call is accepted, and behind the granite reasoning
    # parser vLLM's batch returns the content raw (the marker kept), where its stream drops it.
    segments = ["Here is my response: see ", "@<tool_call>", '{"name": "search", "arguments": {}}', "@</tool_call>"]
    streamed, whole, _ = _granite_both(str(family_dirs["granite"]), "granite", segments, how, "stop")
    assert streamed == whole
    assert whole["names"] == [] and whole["content"].endswith(
        'see <tool_call>{"name": "search", "arguments": {}}</tool_call>'
    )
