"""The engine-based families against vLLM 0.33's own parser classes: fuzzed outputs (markers by
id and as text, several calls, calls after content and content after calls, malformed and
truncated arguments, `length` inside a call, thinking on/off, tool_choice none/auto/required/
named, parallel_tool_calls=false, include_reasoning=false) under random chunkings, recorded by
`python -m tests.parity.compare_parsers --record-families N` into `golden_families/*.jsonl`.

Every chunk's delta and finish reason and the batch answer must match, except where vLLM's own
stream does not accumulate to its batch answer and `deliberate.CONFIGS` names why (ours must then
accumulate to the batch answer), or where `deliberate.BATCH_CONFIGS` names why our batch answer
follows the stream's rule (it must then be what our stream accumulates to); the streams are replayed
with a JSON round trip of the parser state between chunks (`roundtrip_every`), so a stream that
resumes in another process answers the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from render_service import parsers
from render_service.model.example import build_example_model
from tests.parsers import cases, deliberate, stream_vs_batch
from tests.parsers.families import deepseek, ernie45, gemma4, hunyuan, json_tools, kimi_k3, minimax_m3, olmo3step

GOLDEN_DIR = Path(__file__).with_name("golden_families")
MODELS = {
    "qwen3_coder": "qwen3",
    "minimax_m2": "minimax_m2",
    "seed_oss": "seed_oss",
    "glm": "glm",
    "gemma4": "gemma4",
    "deepseek_v32": "deepseek",
    "deepseek_v4": "deepseek",
    "deepseek_v41": "deepseek",
    "step3": "qwen3",
    "kimi_k3": "kimi_k3",
    "hunyuan_a13b": "hunyuan_a13b",
    "hy": "hy",
    "step3p5": "qwen3",
    "step3_tool": "step3",
    "olmo3": "olmo3",
    "ernie45": "ernie45",
    "minimax_m3": "minimax_m3",
    "phi4_mini_json": "phi4_mini",
    "xlam": "xlam",
    "internlm": "internlm",
    "jamba": "jamba",
}
# Fixture folders built by tests/parsers/families/ (the others by render_service.model.example).
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "gemma4": gemma4.build,
    "deepseek": deepseek.build,
    "kimi_k3": kimi_k3.build,
    "hunyuan_a13b": hunyuan.build_a13b,
    "hy": hunyuan.build_hy,
    "step3": olmo3step.build_step3,
    "olmo3": olmo3step.build_olmo3,
    "ernie45": ernie45.build,
    "minimax_m3": minimax_m3.build,
    **{folder: json_tools.builder(folder) for folder in json_tools.MARKERS},
}


def _load(family: str) -> list[dict[str, Any]]:
    path = GOLDEN_DIR / f"{family}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoTokenizer

    out = {}
    for model in sorted(set(MODELS.values())):
        target = tmp_path_factory.mktemp(model)
        folder = BUILDERS[model](target) if model in BUILDERS else build_example_model(target, model)
        out[model] = AutoTokenizer.from_pretrained(str(folder))
    return out


@pytest.mark.parametrize("family", sorted(MODELS))
def test_family_matches_vllm(tokenizers: dict[str, Any], family: str) -> None:
    tok = tokenizers[MODELS[family]]
    records = _load(family)
    assert len(records) >= 50
    failures = []
    for n, record in enumerate(records):
        reasoning, tool = record["config"]
        req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **record["request_body"]}
        eos = (record["eos"][0], frozenset(record["eos"][1]))
        parser = parsers.get_parser(
            tok,
            reasoning,
            tool,
            enable_auto_tools=True,
            thinking_enabled=parsers.thinking_enabled(reasoning, req.get("chat_template_kwargs")),
        )
        assert parser is not None
        steps = cases.run_stream(
            tok, parser, req, record["prompt"], record["chunks"], record["finish"], roundtrip_every=1 + n % 3, eos=eos
        )
        stream = [[cases.wire(d), fr] for d, fr in steps]
        ids = [t for chunk in record["chunks"] for t in chunk]
        batch = cases.run_batch(tok, parser, req, record["prompt"], ids, record["finish"], eos=eos)
        config = f"{reasoning}+{tool}"
        still_open = stream_vs_batch.NOT_ACCUMULATING.get((family, config))
        batch_cause = deliberate.BATCH_CONFIGS.get((family, config))
        # Batch: vLLM's, or different only as a listed deliberate difference allows (the tool
        # parser's leading whitespace, or the configuration's rule-2 cause).
        problem = deliberate.check_batch_tool(batch, record["batch"], deliberate.BATCH_TOOLS.get(tool or ""))
        if problem is not None and batch_cause is not None:
            problem = deliberate.check_batch(batch, record["batch"], stream, batch_cause, still_open)
        if problem is None and batch_cause is deliberate.K3_LATE_CHANNEL_BATCH and batch != record["batch"]:
            reads_reasoning = reasoning is not None and parsers.thinking_enabled(
                reasoning, req.get("chat_template_kwargs")
            )
            if not deliberate.k3_late_channel(batch["text"], reads_reasoning):
                problem = f"{batch_cause}: our batch answer differs from vLLM's without a late channel marker"
        # A deliberate batch answer is the one our stream must accumulate to.
        whole = batch if batch_cause is not None and problem is None else record["batch"]
        if problem is None and tool in deliberate.WHOLE_CALLS and stream != record["stream"]:
            # calls sent whole: checked by what the stream adds up to (unless another part of
            # the configuration does not accumulate yet)
            problem = None if still_open else deliberate.check_whole(stream, batch)
        else:
            problem = problem or deliberate.check_stream(
                stream,
                record["stream"],
                whole,
                deliberate.CONFIGS.get((family, config)),
                still_open,
                deliberate.held(tool),
            )
        if problem is not None:
            failures.append((n, record["config"], record["request"], problem))
    assert not failures, failures[:5]


def test_goldens_exercise_tool_calls_and_every_configuration() -> None:
    for family in MODELS:
        records = _load(family)
        assert sum(bool(r["batch"]["tool_calls"]) for r in records) >= 5, family
        streamed = sum(any(d and d.get("tool_calls") for d, _ in r["stream"]) for r in records)
        assert streamed >= 5, family
        wanted = {"none", "auto", "named"} | (set() if family in json_tools.FAMILIES else {"required"})
        assert {r["request"] for r in records} >= wanted, family  # json_tools.py says why not required there


def test_engine_snapshot_stays_bounded_while_a_long_argument_is_held(tokenizers: dict[str, Any]) -> None:
    """A 3,000-token parameter value is held (the call is sent whole when it ends, as batch
    converts it) beside the snapshot: each snapshot stays a few hundred bytes and writes only
    the new text to its segment, a stream resumed from every snapshot answers the same, and the
    call adds up to the batch answer."""
    tok = tokenizers["qwen3"]
    words = ["alpha", " beta", " é", " 😀", " x < y", ' "q"', " \\", "\n", " </para", " {}"]
    value = "".join(words[i % len(words)] for i in range(3000))
    segments = ["@<think>", "plan", "@</think>", "@<tool_call>", "\n<function=search>\n<parameter=q>\n", value]
    segments += ["\n</parameter>\n</function>\n", "@</tool_call>", "@<|im_end|>"]
    ids = cases.encode(tok, segments)
    prompt = cases.encode(tok, cases.PROMPTS["open"])
    parser = parsers.get_parser(tok, "qwen3", "qwen3_coder", enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(cases.REQ["auto"])
    deltas, sizes, writes = cases.stream_through_snapshots(parser, prompt, ids, opts)
    calls = [(c.name, c.arguments) for d in deltas if d is not None for c in d.tool_calls]
    assert len(ids) > 3000
    assert max(sizes) < 1000, max(sizes)
    assert max(writes[-2000:]) < 100, max(writes[-2000:])  # each snapshot appends its own text only
    batch = cases.run_batch(tok, parser, cases.REQ["auto"], prompt, ids, "stop")
    assert calls == [("search", batch["tool_calls"][0][1])]
    assert json.loads(calls[0][1]) == {"q": value}


def test_structural_tags_match_vllm() -> None:
    """Each tool parser's structural tag (`structural_tag_model`), as vLLM 0.33 builds it,
    recorded by `python -m tests.parity.compare_parsers --record-structural-tags`."""
    from render_service.api import structured

    recorded = json.loads((GOLDEN_DIR / "structural_tags.json").read_text(encoding="utf-8"))
    assert len(recorded) == 72
    for case in recorded:
        parser = parsers.tool_parser_class(case["parser"])
        ours = structured._tools_structural_tag(
            json.loads(json.dumps(_TAG_TOOLS)),
            case["tool_choice"],
            structured.ToolStrictLevel[case["strict_level"]],
            parser,
        )
        assert ours == case["tag"], (case["parser"], case["tool_choice"], case["strict_level"])


_TAG_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "strict": True,
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {
        "type": "function",
        "function": {
            "name": "typed",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "mode": {"enum": ["a", 1]},
                    "x": {"type": ["string", "number", "null"]},
                },
            },
        },
    },
]
