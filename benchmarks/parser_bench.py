"""Per-chunk parser CPU over a long stream, per family, as compact-mode derender runs it.

    python -m benchmarks.parser_bench [--tokens 4000] [--family qwen3_coder ...]
    VLLM_PYTHON -m benchmarks.parser_bench --tokens 2000 --vllm --models DIR   # side by side with vLLM

For each family a realistic output (reasoning, content, then a tool call whose string argument
is most of the output, so the argument streaming path is the one measured) is streamed one
token per chunk. Each chunk does what a compact-mode derender call does with the parser state:
decode the stored snapshot (msgpack), load it, detokenize + parse the chunk, encode the new
state. The table shows the mean per-chunk CPU over the first and the last 10% of chunks and
their ratio (flat = 1.0x; the target is <= 1.5x at 4,000 tokens); "in phase" is the same
ratio inside the long last phase (the streamed tool argument, or the content), which separates
growth with the stream from the start and the end running different code paths (reasoning vs
argument streaming); and the snapshot size at the end. A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from render_service import parsers
from render_service.derender import detokenize as dt
from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
from render_service.model.example import build_example_model
from render_service.server.metrics import Metrics

WORDS = ["the", " quick", " é", " 😀", " 中文", " data", " a<b", " {", " }", "\n", " value", " x"]


@dataclass(frozen=True)
class Scenario:
    model: str
    reasoning: str | None
    tool: str | None
    build: Callable[[Any, int, random.Random], tuple[list[int], int]]  # -> (output ids, where the long tail starts)
    prompt: tuple[str, ...]
    builder: Callable[[Path], Path] | None = None  # the model folder's builder (default: build_example_model)


def _text_ids(tok: Any, n: int, rng: random.Random) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids.extend(tok.encode(rng.choice(WORDS), add_special_tokens=False))
    return ids[:n]


def _marker(tok: Any, text: str) -> list[int]:
    return [tok.convert_tokens_to_ids(text)]


def _enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _qwen3_xml(tok: Any, n: int, rng: random.Random, prefix: str = "", eos: str = "<|im_end|>") -> list[int]:
    """A Qwen3 XML call; `prefix` names Seed-OSS's markers (`<seed:think>`, `<seed:tool_call>`, ...)."""
    think, end_think = _marker(tok, f"<{prefix}think>"), _marker(tok, f"</{prefix}think>")
    head = think + _text_ids(tok, n // 4, rng) + end_think + _text_ids(tok, 50, rng)
    call = _marker(tok, f"<{prefix}tool_call>") + _enc(tok, "\n<function=search>\n<parameter=q>\n")
    tail = _enc(tok, "\n</parameter>\n</function>\n") + _marker(tok, f"</{prefix}tool_call>") + _marker(tok, eos)
    body = _text_ids(tok, n - len(head) - len(call) - len(tail), rng)
    return head + call + body + tail, len(head) + len(call)


def _seed_xml(tok: Any, n: int, rng: random.Random) -> list[int]:
    return _qwen3_xml(tok, n, rng, "seed:", "<seed:eos>")


def _hermes(tok: Any, n: int, rng: random.Random) -> list[int]:
    head = _marker(tok, "<think>") + _text_ids(tok, n // 4, rng) + _marker(tok, "</think>") + _text_ids(tok, 50, rng)
    call = _marker(tok, "<tool_call>") + _enc(tok, '\n{"name": "search", "arguments": {"q": "')
    tail = _enc(tok, '"}}\n') + _marker(tok, "</tool_call>") + _marker(tok, "<|im_end|>")
    body = [t for t in _text_ids(tok, n, rng) if '"' not in tok.decode([t]) and "\\" not in tok.decode([t])]
    return head + call + body[: n - len(head) - len(call) - len(tail)] + tail, len(head) + len(call)


def _minimax(tok: Any, n: int, rng: random.Random) -> list[int]:
    head = _text_ids(tok, n // 4, rng) + _marker(tok, "</think>") + _text_ids(tok, 50, rng)
    call = _marker(tok, "<minimax:tool_call>") + _enc(tok, '\n<invoke name="search">\n<parameter name="q">')
    tail = _enc(tok, "</parameter>\n</invoke>\n") + _marker(tok, "</minimax:tool_call>") + _marker(tok, "[e~[")
    body = _text_ids(tok, n - len(head) - len(call) - len(tail), rng)
    return head + call + body + tail, len(head) + len(call)


def _glm(tok: Any, n: int, rng: random.Random) -> list[int]:
    head = _marker(tok, "<think>") + _text_ids(tok, n // 4, rng) + _marker(tok, "</think>") + _text_ids(tok, 50, rng)
    call = _marker(tok, "<tool_call>") + _enc(tok, "search") + _marker(tok, "<arg_key>") + _enc(tok, "q")
    call += _marker(tok, "</arg_key>") + _marker(tok, "<arg_value>")
    tail = _marker(tok, "</arg_value>") + _marker(tok, "</tool_call>") + _marker(tok, "<|user|>")
    return head + call + _text_ids(tok, n - len(head) - len(call) - len(tail), rng) + tail, len(head) + len(call)


def _seed(tok: Any, n: int, rng: random.Random) -> list[int]:
    head = _marker(tok, "<seed:think>") + _text_ids(tok, n // 2, rng) + _marker(tok, "</seed:think>")
    return head + _text_ids(tok, n - len(head) - 1, rng) + _marker(tok, "<seed:eos>"), len(head)


def _step3(tok: Any, n: int, rng: random.Random) -> list[int]:
    head = _text_ids(tok, n // 2, rng) + _marker(tok, "</think>")  # no opening marker
    return head + _text_ids(tok, n - len(head) - 1, rng) + _marker(tok, "<|im_end|>"), len(head)


def _deepseek(tok: Any, n: int, rng: random.Random, v31: bool = False) -> list[int]:
    """DeepSeek V3 (```json fence) or V3.1 markup: thinking, content, then one call whose string
    argument is most of the output (held to the end of the stream)."""
    head = _marker(tok, "<think>") + _text_ids(tok, n // 4, rng) + _marker(tok, "</think>") + _text_ids(tok, 50, rng)
    name = _enc(tok, "search") if v31 else _enc(tok, "function")
    call = _marker(tok, "<｜tool▁calls▁begin｜>") + _marker(tok, "<｜tool▁call▁begin｜>") + name
    call += _marker(tok, "<｜tool▁sep｜>") + _enc(tok, '{"q": "' if v31 else 'search\n```json\n{"q": "')
    tail = _enc(tok, '"}' if v31 else '"}\n```') + _marker(tok, "<｜tool▁call▁end｜>")
    tail += _marker(tok, "<｜tool▁calls▁end｜>") + _marker(tok, "<｜end▁of▁sentence｜>")
    body = [t for t in _text_ids(tok, n, rng) if '"' not in tok.decode([t]) and "\\" not in tok.decode([t])]
    return head + call + body[: n - len(head) - len(call) - len(tail)] + tail, len(head) + len(call)


def _deepseek_v31(tok: Any, n: int, rng: random.Random) -> list[int]:
    return _deepseek(tok, n, rng, v31=True)


def _deepseek_folder(path: Path) -> Path:
    from tests.parsers.families import deepseek

    return deepseek.build(path)


SCENARIOS: dict[str, Scenario] = {
    "qwen3+hermes": Scenario("qwen3", "qwen3", "hermes", _hermes, ("<|im_start|>", "assistant\n")),
    "qwen3+qwen3_coder": Scenario("qwen3", "qwen3", "qwen3_coder", _qwen3_xml, ("<|im_start|>", "assistant\n")),
    "minimax_m2": Scenario("minimax_m2", "minimax_m2", "minimax_m2", _minimax, ("]~b]", "ai\n")),
    "minimax_m2_append_think+minimax_m2": Scenario(
        "minimax_m2", "minimax_m2_append_think", "minimax_m2", _minimax, ("]~b]", "ai\n")
    ),
    "seed_oss": Scenario("seed_oss", "seed_oss", None, _seed, ("<seed:bos>", "assistant\n")),
    "seed_oss+seed_oss": Scenario("seed_oss", "seed_oss", "seed_oss", _seed_xml, ("<seed:bos>", "assistant\n")),
    "step3": Scenario("qwen3", "step3", None, _step3, ("<|im_start|>", "assistant\n")),
    # An engine tool parser behind a reasoning parser that is not engine-based (raw_content.py)
    "deepseek_r1+qwen3_coder": Scenario(
        "qwen3", "deepseek_r1", "qwen3_coder", _qwen3_xml, ("<|im_start|>", "assistant\n")
    ),
    "step3+qwen3_coder": Scenario("qwen3", "step3", "qwen3_coder", _qwen3_xml, ("<|im_start|>", "assistant\n")),
    # DeepSeek V3/V3.1: calls held to the end of the stream (deepseek_v3.py)
    "deepseek_r1+deepseek_v3": Scenario(
        "deepseek", "deepseek_r1", "deepseek_v3", _deepseek, ("<｜Assistant｜>", ""), _deepseek_folder
    ),
    "deepseek_r1+deepseek_v31": Scenario(
        "deepseek", "deepseek_r1", "deepseek_v31", _deepseek_v31, ("<｜Assistant｜>", ""), _deepseek_folder
    ),
    "glm45": Scenario("glm", "glm45", "glm45", _glm, ("<|assistant|>", "")),
}

REQUEST = {
    "tools": [
        {
            "type": "function",
            "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        }
    ]
}


def run(name: str, scenario: Scenario, model_dir: Path, tokens: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids, tail_start = scenario.build(tok, tokens, random.Random(0))
    prompt = [tok.convert_tokens_to_ids(scenario.prompt[0]), *_enc(tok, scenario.prompt[1])]
    parser = parsers.get_parser(tok, scenario.reasoning, scenario.tool, enable_auto_tools=True)
    assert parser is not None
    opts = parsers.RequestOptions.from_request(REQUEST)
    tool_id = parsers.tool_ids("bench")
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    # Held text (a call the parser holds until it ends) goes to a segment beside the snapshot, as
    # compact mode stores it (derender/segments.py, in-process store).
    store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())

    def encode(state: Any, position: int) -> bytes:
        held = store.segment_writer("f" * 16, "bench", position)
        return encoder.encode([state.to_obj(held), held.refs])

    def decode(blob: bytes) -> Any:
        obj, refs = decoder.decode(blob)
        stored = store.local_held_texts(refs) if refs else []
        assert stored is not None, "a held-text segment is missing"
        return parsers.load_parsed_stream(parser, obj, stored)

    blob = encode(parsers.new_parsed_stream(parser, prompt), 0)
    per_chunk: list[float] = []
    calls = 0
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        finish = "stop" if last else None
        start = time.thread_time()
        state = decode(blob)
        text_ids, _ = dt.drop_stop_token([t], finish, None, eos_token_id=ids[-1], model_eos_token_ids={ids[-1]})
        delta, _ = parsers.advance(parser, state, text_ids, [t], finish, opts, tool_id)
        blob = encode(state, i + 1)
        per_chunk.append(time.thread_time() - start)
        if delta is not None and delta.tool_calls:
            calls += 1
    window = max(1, len(per_chunk) // 10)
    head = sum(per_chunk[:window]) / window
    tail = sum(per_chunk[-window:]) / window
    # The same comparison inside the long last phase (tool arguments, or content): growth
    # there is growth with the stream, not a change of code path.
    phase = per_chunk[tail_start + 20 : -1]
    pw = max(1, len(phase) // 10)
    phase_ratio = (sum(phase[-pw:]) / pw) / (sum(phase[:pw]) / pw)
    return {
        "phase_ratio": phase_ratio,
        "name": name,
        "tokens": len(ids),
        "start_us": head * 1e6,
        "end_us": tail * 1e6,
        "ratio": tail / head,
        "total_ms": sum(per_chunk) * 1e3,
        "snapshot_bytes": len(blob),
        "tool_deltas": calls,
    }


def vllm_total_seconds(scenario: Scenario, model_dir: Path, tokens: int, samples: int) -> float:
    """vLLM 0.33's CPU for the same stream as its derender runs it: every chunk builds a fresh
    parser and replays every earlier chunk (detokenize + `ChatStreamProcessor.step`). Measured
    at `samples` evenly spaced chunks and integrated (the cost per chunk grows linearly).
    Needs the vLLM environment (run this module with its Python)."""
    from transformers import AutoTokenizer

    from tests.parity.compare_parsers import Oracle

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids, _ = scenario.build(tok, tokens, random.Random(0))
    prompt = [tok.convert_tokens_to_ids(scenario.prompt[0]), *_enc(tok, scenario.prompt[1])]
    oracle = Oracle(model_dir, (ids[-1], frozenset({ids[-1]})))
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **REQUEST}
    positions = sorted({round(i * (len(ids) - 1) / (samples - 1)) for i in range(samples)})
    costs = []
    for k in positions:
        chunks = [[t] for t in ids[: k + 1]]
        start = time.thread_time()
        oracle.stream(scenario.reasoning, scenario.tool, request, prompt, chunks, "stop" if k == len(ids) - 1 else None)  # type: ignore[arg-type]
        costs.append(time.thread_time() - start)
    total = 0.0
    for (k0, c0), (k1, c1) in zip(
        zip(positions, costs, strict=True), zip(positions[1:], costs[1:], strict=True), strict=False
    ):
        total += (c0 + c1) / 2 * (k1 - k0)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--family", action="append", choices=sorted(SCENARIOS))
    ap.add_argument(
        "--vllm", action="store_true", help="also vLLM's replaying derender (run with the vLLM environment's Python)"
    )
    ap.add_argument("--vllm-samples", type=int, default=12)
    ap.add_argument("--models", type=Path, help="folder of example model folders (built there when missing)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        built: dict[str, Path] = {}
        for name in args.family or list(SCENARIOS):
            scenario = SCENARIOS[name]
            if scenario.model not in built:
                folder = (args.models or Path(tmp)) / scenario.model
                ready = (folder / "tokenizer.json").exists()
                if ready:
                    built[scenario.model] = folder
                elif scenario.builder is not None:
                    built[scenario.model] = scenario.builder(folder)
                else:
                    built[scenario.model] = build_example_model(folder, scenario.model)
            row = run(name, scenario, built[scenario.model], args.tokens)
            if args.vllm:
                row["vllm_s"] = vllm_total_seconds(scenario, built[scenario.model], args.tokens, args.vllm_samples)
            rows.append(row)
    header = (
        f"{'parsers':38} {'tokens':>6} {'start µs':>9} {'end µs':>9} {'end/start':>9} {'in phase':>9} "
        f"{'total ms':>9} {'state B':>8}"
    )
    print(header)
    if args.vllm:
        for r in rows:
            ours = r["total_ms"] / 1e3
            print(
                f"{r['name']:38} vLLM {r['vllm_s']:.1f} s vs ours {ours * 1e3:.1f} ms: {r['vllm_s'] / ours:.0f}x less CPU"
            )
    for r in rows:
        print(
            f"{r['name']:38} {r['tokens']:>6} {r['start_us']:>9.1f} {r['end_us']:>9.1f} {r['ratio']:>8.2f}x "
            f"{r['phase_ratio']:>8.2f}x {r['total_ms']:>9.1f} {r['snapshot_bytes']:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
