"""DeepSeek V3/V3.1 and Kimi K2 parsers: a stream's state taken in one process resumes identically in
another, at every chunk boundary; streaming accumulates to what batch returns on well-formed output;
the state stays small while a long tool call streams.

(vLLM parity itself: tests/parity/test_families_parity.py and `compare_parsers.py --family deepseek kimi`.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from tests.parsers import cases
from tests.parsers.families import deepseek, kimi

ROOT = Path(__file__).resolve().parents[3]

V3_CALL = [
    "@<｜tool▁call▁begin｜>",
    "function",
    "@<｜tool▁sep｜>",
    'get_weather\n```json\n{"city": "東京", "n": 3}\n```',
]
V31_CALL = ["@<｜tool▁call▁begin｜>", "search", "@<｜tool▁sep｜>", '{"q": "weather 🎉 \\"x\\"", "n": 3}']
KIMI_CALL = ["@<|tool_call_begin|>", "functions.get_weather:0", "@<|tool_call_argument_begin|>", '{"city": "Paris"}']

# (folder, reasoning, tool, request kwargs, output segments)
STREAMS: dict[str, tuple[str, str | None, str, dict[str, Any], list[Any]]] = {
    "deepseek_v3": (
        "deepseek",
        "deepseek_v3",
        "deepseek_v3",
        {"thinking": True},
        [
            "@<think>",
            "Let me think 🤔.",
            "@</think>",
            "Sure. ",
            "@<｜tool▁calls▁begin｜>",
            *V3_CALL,
            "@<｜tool▁call▁end｜>",
            "@<｜tool▁calls▁end｜>",
            "@<｜end▁of▁sentence｜>",
        ],
    ),
    "deepseek_v31": (
        "deepseek",
        "deepseek_v3",
        "deepseek_v31",
        {},
        [
            "Looking it up. ",
            "@<｜tool▁calls▁begin｜>",
            *V31_CALL,
            "@<｜tool▁call▁end｜>",
            *V31_CALL,
            "@<｜tool▁call▁end｜>",
            "@<｜tool▁calls▁end｜>",
            "@<｜end▁of▁sentence｜>",
        ],
    ),
    "kimi_k2": (
        "kimi",
        "kimi_k2",
        "kimi_k2",
        {},
        [
            "@<think>",
            "Weather in Paris, one call.\n",
            "@</think>",
            "On it. ",
            "@<|tool_calls_section_begin|>",
            *KIMI_CALL,
            "@<|tool_call_end|>",
            "@<|tool_calls_section_end|>",
            "@<|im_end|>",
        ],
    ),
}
EOS = {"deepseek": 1, "kimi": kimi.IDS["<|im_end|>"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {"deepseek": deepseek.build(root / "deepseek"), "kimi": kimi.build(root / "kimi")}


@pytest.fixture(scope="module")
def toks(folders: dict[str, Path]) -> dict[str, Any]:
    """Each folder's tokenizer, loaded once for the module (the tests only read it)."""
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(str(folder)) for name, folder in folders.items()}


def _setup(folder: Path, name: str, tok: Any = None) -> tuple[Any, Any, dict[str, Any], list[int], list[int]]:
    from transformers import AutoTokenizer

    _kind, reasoning, tool, kwargs, segments = STREAMS[name]
    tok = tok if tok is not None else AutoTokenizer.from_pretrained(str(folder))
    parser = parsers.get_parser(
        tok, reasoning, tool, enable_auto_tools=True, thinking_enabled=parsers.thinking_enabled(reasoning, kwargs, tool)
    )
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": cases.TOOLS}
    if kwargs:
        req["chat_template_kwargs"] = kwargs
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, ["hi"])
    return tok, parser, req, ids, prompt


def _advance(parser: Any, state: Any, req: dict[str, Any], ids: list[int], i: int, eos: int) -> Any:
    from render_service.derender import detokenize as dt

    fr = "stop" if i == len(ids) - 1 else None
    text_ids, _ = dt.drop_stop_token([ids[i]], fr, None, eos_token_id=eos, model_eos_token_ids=frozenset({eos}))
    delta, finish = parsers.advance(
        parser, state, text_ids, [ids[i]], fr, parsers.RequestOptions.from_request(req), parsers.tool_ids("r")
    )
    return [cases.wire(delta), finish]


def _child(folder: str, name: str, upto: int) -> None:  # runs in the other process
    _, parser, req, ids, prompt = _setup(Path(folder), name)
    state = parsers.new_parsed_stream(parser, prompt)
    steps = [_advance(parser, state, req, ids, i, EOS[STREAMS[name][0]]) for i in range(upto)]
    print(json.dumps({"steps": steps, "state": state.to_obj()}, ensure_ascii=False))


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_state_resumes_in_another_process(folders: dict[str, Path], toks: dict[str, Any], name: str) -> None:
    folder = folders[STREAMS[name][0]]
    _, parser, req, ids, prompt = _setup(folder, name, toks[STREAMS[name][0]])
    eos = EOS[STREAMS[name][0]]
    state = parsers.new_parsed_stream(parser, prompt)
    straight = [_advance(parser, state, req, ids, i, eos) for i in range(len(ids))]
    assert any(step[0] and step[0].get("tool_calls") for step in straight)
    for upto in sorted({1, len(ids) // 3, len(ids) // 2, len(ids) - 2}):
        code = f"from tests.parsers.families.test_families import _child; _child({str(folder)!r}, {name!r}, {upto})"
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=300
        )
        child = json.loads(out.stdout.strip().splitlines()[-1])
        resumed = parsers.load_parsed_stream(parser, child["state"])
        rest = [_advance(parser, resumed, req, ids, i, eos) for i in range(upto, len(ids))]
        assert child["steps"] + rest == json.loads(json.dumps(straight)), (name, upto)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_streaming_accumulates_to_batch(folders: dict[str, Path], toks: dict[str, Any], name: str) -> None:
    tok, parser, req, ids, prompt = _setup(folders[STREAMS[name][0]], name, toks[STREAMS[name][0]])
    eos = EOS[STREAMS[name][0]]
    steps = cases.run_stream(tok, parser, req, prompt, cases.chunk(ids, "one"), "stop", eos=(eos, frozenset({eos})))
    streamed = cases.concat(steps)
    batch = cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=(eos, frozenset({eos})))
    assert streamed["reasoning"] == (batch["reasoning"] or "")
    assert streamed["content"].strip() == (batch["content"] or "").strip()
    names = [streamed["names"][k] for k in sorted(streamed["names"])]
    args = [streamed["args"][k] for k in sorted(streamed["args"])]
    assert names == [c[0] for c in batch["tool_calls"]]
    assert [json.loads(a) for a in args] == [json.loads(c[1]) for c in batch["tool_calls"]]


def test_state_stays_small_during_a_long_call(toks: dict[str, Any]) -> None:
    """A 3,000-token argument string: the encoded snapshot never holds the streamed text (a call
    held until it is decided, Kimi K2's, lives beside the snapshot in a segment that each chunk
    only appends its own text to, as compact mode stores it; the stream resumes from it)."""
    from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
    from render_service.server.metrics import Metrics

    store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())
    assert store.local is not None

    for folder, tool, call in (
        ("deepseek", "deepseek_v3", ["@<｜tool▁call▁begin｜>", "function", "@<｜tool▁sep｜>", 'f\n```json\n{"t": "']),
        ("deepseek", "deepseek_v31", ["@<｜tool▁call▁begin｜>", "f", "@<｜tool▁sep｜>", '{"t": "']),
        ("kimi", "kimi_k2", ["@<|tool_call_begin|>", "functions.f:0", "@<|tool_call_argument_begin|>", '{"t": "']),
    ):
        tok = toks[folder]
        begin = "@<｜tool▁calls▁begin｜>" if folder == "deepseek" else "@<|tool_calls_section_begin|>"
        ids = cases.encode(tok, [begin, *call, " lorem ipsum dolor" * 1000])
        parser = parsers.get_parser(tok, None, tool, enable_auto_tools=True)
        assert parser is not None
        state = parsers.new_parsed_stream(parser, [])
        sizes, writes = [], []
        for i in range(len(ids)):
            _advance(parser, state, {"model": "m", "messages": [], "tools": cases.TOOLS}, ids, i, -1)
            writer = store.segment_writer("f" * 16, tool, i + 1)
            obj = json.loads(json.dumps(state.to_obj(writer)))
            sizes.append(len(json.dumps(obj)))
            writes.append(sum(len(w.data) for w in writer.writes))
            stored = [store.local.segments.text(*ref) for ref in writer.refs]
            assert all(text is not None for text in stored)
            state = parsers.load_parsed_stream(parser, obj, stored)  # type: ignore[arg-type]
        assert max(sizes[-500:]) < 2000, (tool, max(sizes))
        assert max(writes[-500:]) < 100, (tool, max(writes[-500:]))  # each chunk appends its own text only
