"""Step3's native tool parser (`render_service/parsers/step3_tool.py`) beyond the fuzzed goldens
(`golden_families/step3_tool.jsonl`, replayed by test_family_goldens.py): a whole turn under any
chunking, schema casting, an unclosed block as content, resuming from every snapshot while a long
call is held, and the render side (`skip_special_tokens=False` in the rendered GenerateRequest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from tests.parsers import cases
from tests.parsers.families import olmo3step

CALLS_BEGIN, CALLS_END = "@<｜tool_calls_begin｜>", "@<｜tool_calls_end｜>"
CALL_BEGIN, CALL_END, SEP = "@<｜tool_call_begin｜>", "@<｜tool_call_end｜>", "@<｜tool_sep｜>"
CALL = [CALL_BEGIN, "function", SEP, '<steptml:invoke name="get_weather">']
CALL += ['<steptml:parameter name="city"> Paris é 😀 </steptml:parameter>']
CALL += ['<steptml:parameter name="n">3</steptml:parameter><steptml:parameter name="deep">True</steptml:parameter>']
CALL += ["</steptml:invoke>", CALL_END]
OTHER = [CALL_BEGIN, "other", SEP, '<steptml:invoke name="search"></steptml:invoke>', CALL_END]
TURN = [
    "Need the weather.",
    "@</think>",
    "\n\nChecking. ",
    CALLS_BEGIN,
    *CALL,
    *OTHER,
    CALLS_END,
    " done\n",
    "@<|EOT|>",
]
PROMPT = olmo3step.STEP3_PROMPTS["open"]
REQ = {"tools": olmo3step.STEP3_TOOLS}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(olmo3step.build_step3(Path(tmp_path_factory.mktemp("step3")))))


def _run(tok: Any, segments: list[Any], size: int, req: dict[str, Any] = REQ) -> dict[str, Any]:
    parser = parsers.get_parser(tok, "step3", "step3", enable_auto_tools=True)
    assert parser is not None
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, PROMPT)
    chunks = [ids[i : i + size] for i in range(0, len(ids), size)]
    steps = cases.run_stream(tok, parser, req, prompt, chunks, "stop", roundtrip_every=1, eos=olmo3step.STEP3_EOS)
    joined = cases.concat(steps)
    batch = cases.run_batch(tok, parser, req, prompt, ids, "stop", eos=olmo3step.STEP3_EOS)
    return {
        "reasoning": joined["reasoning"],
        "content": joined["content"],
        "calls": [[joined["names"][i], joined["args"][i]] for i in sorted(joined["names"])],
        "finish": joined["finish"],
        "batch": [batch["reasoning"], batch["content"], [c[:2] for c in batch["tool_calls"]], batch["finish_reason"]],
    }


def test_a_whole_turn_under_any_chunking(tok: Any) -> None:
    one = _run(tok, TURN, 1)
    args = json.dumps({"city": "Paris é 😀", "n": 3, "deep": True}, ensure_ascii=False)  # cast to the schema
    assert one == {
        "reasoning": "Need the weather.",
        "content": "\n\nChecking.  done",  # text around the block, stripped; the leading newlines kept (rule 2)
        "calls": [["get_weather", args]],  # the part whose type is not function is skipped
        "finish": "tool_calls",
        "batch": ["Need the weather.", "\n\nChecking.  done", [["get_weather", args]], "tool_calls"],
    }
    for size in (2, 3, 5, 7, 1000):
        assert _run(tok, TURN, size) == one


def test_without_the_closing_marker_everything_is_content(tok: Any) -> None:
    segments = ["ok", "@</think>", " text ", CALLS_BEGIN, *CALL, "@<|EOT|>"]
    out = _run(tok, segments, 3)
    text = " text <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
    assert out["content"].startswith(text) and out["calls"] == [] and out["finish"] == "stop"
    assert out["batch"][1] == out["content"]
    # a block without any function call is content too
    out = _run(tok, ["ok", "@</think>", "x ", CALLS_BEGIN, *OTHER, CALLS_END, "@<|EOT|>"], 2)
    assert out["calls"] == [] and out["content"].startswith("x <｜tool_calls_begin｜>")


def test_a_held_call_resumes_from_every_snapshot_with_small_states(tok: Any) -> None:
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " </steptml:para", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = ["plan", "@</think>", "ok ", CALLS_BEGIN, CALL_BEGIN, "function", SEP]
    segments += ['<steptml:invoke name="search"><steptml:parameter name="text">', value, "</steptml:parameter>"]
    segments += ["</steptml:invoke>", CALL_END, CALLS_END, "@<|EOT|>"]
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, PROMPT)
    parser = parsers.get_parser(tok, "step3", "step3", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(REQ)
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    joined = cases.concat([(d, None) for d in deltas])
    calls = [(joined["names"][i], joined["args"][i]) for i in sorted(joined["names"])]
    content = joined["content"]
    assert len(ids) > 3000
    assert max(sizes) < 1000, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])  # each snapshot appends its own text only
    assert content == "ok"
    assert calls == [("search", json.dumps({"text": value.strip()}, ensure_ascii=False))]


def test_render_keeps_special_tokens_for_the_parser(tok: Any, tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from render_service.server.app import create_app
    from render_service.settings import Settings

    folder = olmo3step.build_step3(tmp_path / "step3")
    settings = Settings(
        model=str(folder),
        served_model_name=["tinystep3"],
        reasoning_parser="step3",
        tool_call_parser="step3",
        enable_auto_tool_choice=True,
        max_model_len=16384,
    )
    chat = {"model": "tinystep3", "messages": [{"role": "user", "content": "Weather?"}], **REQ}
    with TestClient(create_app(settings.validate())) as client:
        rendered = client.post("/v1/chat/completions/render", json={**chat, "skip_special_tokens": True}).json()
        assert rendered["sampling_params"]["skip_special_tokens"] is False
        rendered = client.post("/v1/chat/completions/render", json={**chat, "tool_choice": "none"}).json()
        assert rendered["sampling_params"].get("skip_special_tokens", True) is True  # vLLM's default, omitted
        rendered = client.post("/v1/chat/completions/render", json={"model": "tinystep3", "messages": chat["messages"]})
        assert rendered.json()["sampling_params"].get("skip_special_tokens", True) is True
