#!/usr/bin/env python3
"""Streaming parser cost: render-service's incremental parsers vs vLLM 0.33's parser path,
side by side in one process, for the Llama 3/4, pythonic, Granite, Nemotron and DeepSeek DSML (V3.2, V4, V4.1) families.

A benchmark script, not a timed test. Run it with the vLLM 0.33 oracle's Python from the
repository root (it imports vLLM's parser classes and ours):

    for f in llama3 llama4 granite nemotron; do python -m tests.parsers.families.llama MODELS/$f $f; done
    python -m tests.parsers.families.deepseek MODELS/deepseek
    ORACLE_PYTHON benchmarks/parsers_bench.py --models MODELS [--family NAME] [--sizes 2000,4000]

Each family gets an N-token output in its own format (prose, then one tool call whose string
argument carries most of the tokens: the worst case for parsers that re-read the current call),
streamed one token per chunk as derender does (stop token dropped, detokenized with special
tokens kept):

- ours: `parsers.advance` per chunk, with the state decoded before and encoded after every chunk
  as compact mode's snapshots are (msgpack, HMAC-SHA256 checked and signed: what a snapshot
  from Redis costs; held text appended to its in-process segment beside the snapshot and checked
  against the snapshot's digest, as `SnapshotStore` does); per-chunk thread CPU is recorded;
- vLLM: `ChatStreamProcessor` over vLLM's own parser classes, fed the same chunks. vLLM's render
  tier replays the whole output through fresh parsers on every chunk, so the CPU it spends on
  chunk k is the CPU of processing chunks 0..k from scratch: the cumulative curve C(k) of one
  run, and a stream costs sum_k C(k).

Printed per family and size: our per-chunk CPU at the start and the end of the stream (median of
the first / last 100 chunks) and their ratio, our total, vLLM's total, and vLLM / ours. The
outputs of both sides are checked to be equal (every delta; for the DSML parsers, which send each
call whole, ours must add up to vLLM's batch answer) before any number is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

WORDS = (
    "the payment service retried every settlement after the deploy and the queue grew until the "
    "scheduler stalled so we rolled back the change and opened this ticket to track the fix "
).split()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "create_ticket",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "description": {"type": "string"}},
            },
        },
    }
]


def prose(tok: Any, n: int, start: int = 0) -> str:
    """Text of exactly about `n` tokens (ASCII words)."""
    words: list[str] = []
    i = start
    while len(tok.encode(" ".join(words), add_special_tokens=False)) < n:
        words.extend(WORDS[(i + k) % len(WORDS)] for k in range(16))
        i += 16
    ids = tok.encode(" ".join(words), add_special_tokens=False)[:n]
    return tok.decode(ids)


def output_ids(family: str, tok: Any, n: int) -> list[int]:
    """An N-token output in the family's format (the eos is appended by the caller)."""

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def special(name: str) -> list[int]:
        return [tok.convert_tokens_to_ids(name)]

    def fit(head: list[int], make: Any, tail_len: int) -> list[int]:
        body = enc(make(prose(tok, max(8, n - len(head) - tail_len))))
        return (head + body)[: n - 1]

    if family in ("llama3_json", "llama4_json"):
        return fit(
            special("<|python_tag|>"),
            lambda p: json.dumps({"name": "create_ticket", "parameters": {"title": "Retry storm", "description": p}}),
            4,
        )
    if family == "pythonic":
        return fit([], lambda p: f"[create_ticket(title='Retry storm', description='{p}')]", 4)
    if family == "llama4_pythonic":
        return fit(special("<|python_start|>"), lambda p: f"[create_ticket(title='Retry storm', description='{p}')]", 6)
    if family == "granite":  # reasoning granite + tool granite: reasoning, then content after the response marker
        return enc(
            "Here is my thought process: " + prose(tok, n // 2) + " Here is my response: " + prose(tok, n // 2, 3)
        )[: n - 1]
    if family == "granite_tool":
        head = enc(prose(tok, n // 5)) + special("<|tool_call|>")
        return fit(head, lambda p: " " + json.dumps([{"name": "create_ticket", "arguments": {"description": p}}]), 4)
    if family == "granite4":
        head = enc(prose(tok, n // 5)) + special("<tool_call>")
        return fit(head, lambda p: json.dumps({"name": "create_ticket", "arguments": {"description": p}}), 6)
    if family == "nemotron_v3":
        head = enc(prose(tok, n * 35 // 100)) + special("</think>") + enc("\n\n" + prose(tok, n * 15 // 100, 5) + "\n")
        return fit(
            head + special("<tool_call>"),
            lambda p: "\n" + json.dumps({"name": "create_ticket", "arguments": {"description": p}}) + "\n",
            6,
        )
    if family in ("deepseek_v32", "deepseek_v4", "deepseek_v41"):
        # DSML: the long string parameter streams only when its closing tag's ">" arrives (vLLM
        # gives these families no open-value extender), so the call's raw text is the state.
        sp = " " if family == "deepseek_v41" else ""
        block = {"deepseek_v32": "function_calls", "deepseek_v4": "tool_calls", "deepseek_v41": " calls"}[family]
        head = enc(prose(tok, n // 5))
        if family != "deepseek_v32":  # thinking is on: the stream starts in reasoning
            head += special("</think>")
        return fit(
            head,
            lambda p: (
                f'\n\n<｜DSML｜{block}>\n<｜DSML｜{sp}invoke name="create_ticket">\n'
                f'<｜DSML｜{sp}parameter name="title" string="true">Retry storm</｜DSML｜{sp}parameter>\n'
                f'<｜DSML｜{sp}parameter name="description" string="true">{p}</｜DSML｜{sp}parameter>\n'
                f"</｜DSML｜{sp}invoke>\n</｜DSML｜{block}>"
            ),
            48,
        )
    raise SystemExit(f"unknown family {family}")


# family -> (model folder, reasoning parser, tool parser, eos token)
FAMILIES: dict[str, tuple[str, str | None, str | None, str]] = {
    "llama3_json": ("llama3", None, "llama3_json", "<|eot_id|>"),
    "llama4_json": ("llama4", None, "llama4_json", "<|eot|>"),
    "pythonic": ("llama3", None, "pythonic", "<|eot_id|>"),
    "llama4_pythonic": ("llama4", None, "llama4_pythonic", "<|eot|>"),
    "granite": ("granite", "granite", "granite", "<|end_of_text|>"),
    "granite_tool": ("granite", None, "granite", "<|end_of_text|>"),
    "granite4": ("granite", None, "granite4", "<|end_of_text|>"),
    "nemotron_v3": ("nemotron", "nemotron_v3", "hermes", "<|im_end|>"),
    "deepseek_v32": ("deepseek", None, "deepseek_v32", "<｜end▁of▁sentence｜>"),
    "deepseek_v4": ("deepseek", "deepseek_v4", "deepseek_v4", "<｜end▁of▁sentence｜>"),
    "deepseek_v41": ("deepseek", "deepseek_v41", "deepseek_v41", "<｜end▁of▁sentence｜>"),
}


out_state_bytes: list[int] = []


# Tool parsers whose stream sends each call whole (tests/parsers/deliberate.py).
WHOLE_CALLS = frozenset(("deepseek_v32", "deepseek_v4", "deepseek_v41", "granite"))


def run_ours(
    tok: Any,
    reasoning: str | None,
    tool: str | None,
    req: dict,
    prompt: list[int],
    chunks: list[list[int]],
    eos: tuple[int, frozenset[int]],
) -> tuple[list[Any], list[int]]:
    from render_service import parsers
    from render_service.derender.detokenize import StopParams, drop_stop_token
    from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
    from render_service.server.metrics import Metrics
    from tests.parsers import cases

    parser = parsers.get_parser(
        tok, reasoning, tool, enable_auto_tools=True, thinking_enabled=parsers.thinking_enabled(reasoning, {})
    )
    assert parser is not None
    opts = parsers.RequestOptions.from_request(req)
    ids_fn = parsers.tool_ids("bench", 0)
    # The snapshot as compact mode stores it: msgpack, HMAC-SHA256 signed (derender/snapshots.py),
    # held text in segments beside it (derender/segments.py) in the in-process store.
    codec = SnapshotCodec(b"k" * 32)
    store = SnapshotStore(codec, Metrics(), local=LocalStore())

    def encode(state: Any, position: int) -> bytes:
        held = store.segment_writer("f" * 16, "bench", position)
        snapshot = {"parser": state.to_obj(held)}
        if held.refs:
            snapshot["held"] = held.refs
        return codec.encode(snapshot)

    def decode(blob: bytes) -> Any:
        snapshot = codec.decode(blob)
        stored = store.local_held_texts(snapshot["held"]) if "held" in snapshot else []
        assert stored is not None, "a held-text segment is missing"
        return parsers.load_parsed_stream(parser, snapshot["parser"], stored)

    state_obj = encode(parsers.new_parsed_stream(parser, prompt), 0)
    out, cpu, state_bytes = [], [], []
    for i, ids in enumerate(chunks):
        finish = "stop" if i == len(chunks) - 1 else None
        t0 = time.thread_time_ns()
        state = decode(state_obj)
        text_ids, _ = drop_stop_token(
            ids, finish, None, eos_token_id=eos[0], model_eos_token_ids=eos[1], params=StopParams()
        )
        delta, fr = parsers.advance(parser, state, text_ids, ids, finish, opts, ids_fn)
        state_obj = encode(state, i + 1)
        cpu.append(time.thread_time_ns() - t0)
        state_bytes.append(len(state_obj))
        out.append((cases.wire(delta), fr))
    # The largest snapshot: its bytes are signed and checked on every chunk (~1 us/KB here); held
    # text longer than segments.INLINE_CHARS is not in it.
    out_state_bytes.append(max(state_bytes))
    return out, cpu


def run_vllm(
    oracle: Any, reasoning: str | None, tool: str | None, req: dict, prompt: list[int], chunks: list[list[int]]
) -> tuple[list[Any], list[int]]:
    """One incremental run of vLLM's parser path; per-chunk CPU (C(k) is its running sum)."""
    from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
    from vllm.renderers.online_derenderer import _seed_stream_state

    from tests.parity.compare_parsers import _vllm_wire

    request = oracle._request(req)
    parser_cls = oracle.parser_class(reasoning, tool)
    t0 = time.thread_time_ns()
    processor = ChatStreamProcessor(
        request,
        parser_cls(oracle.tokenizer, request.tools, chat_template_kwargs={}, model_config=None),
        enable_auto_tools=True,
        parser_cls=parser_cls,
    )
    detok = _seed_stream_state(oracle.tokenizer, prompt, skip_special_tokens=False)
    setup = time.thread_time_ns() - t0
    out, cpu = [], []
    for i, ids in enumerate(chunks):
        fr = "stop" if i == len(chunks) - 1 else None
        t0 = time.thread_time_ns()
        text_ids, _ = oracle.derenderer._drop_stop_token(ids, fr, None, request)
        text, detok = oracle.derenderer._detokenize_delta(
            oracle.tokenizer, text_ids, detok, skip_special_tokens=False, spaces_between_special_tokens=True
        )
        delta, finish_reason = processor.step(text, ids, fr, prompt)
        cpu.append(time.thread_time_ns() - t0 + (setup if i == 0 else 0))
        out.append((_vllm_wire(delta), finish_reason))
    return out, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", type=Path, required=True, help="folder with llama3/ llama4/ granite/ nemotron/ deepseek/"
    )
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--sizes", default="2000,4000")
    ap.add_argument("--window", type=int, default=100, help="chunks in the start / end medians")
    ap.add_argument("--ours-only", action="store_true", help="skip vLLM (no side-by-side column, no output comparison)")
    args = ap.parse_args(argv)

    import logging

    from transformers import AutoTokenizer

    logging.getLogger("vllm").setLevel(logging.CRITICAL)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        "family           tokens  ours start us/chunk  ours end us/chunk  end/start  max state KB  ours total s  vLLM total s  vLLM/ours"
    )
    for name in args.family or list(FAMILIES):
        model, reasoning, tool, eos_name = FAMILIES[name]
        model_dir = args.models / model
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        eos_id = tok.convert_tokens_to_ids(eos_name)
        gen = json.loads((model_dir / "generation_config.json").read_text())
        model_eos = gen.get("eos_token_id", eos_id)  # the DeepSeek folder names it in config.json only
        eos = (eos_id, frozenset(model_eos if isinstance(model_eos, list) else [model_eos]))
        if not args.ours_only:
            from tests.parity.compare_parsers import Oracle

            oracle = Oracle(model_dir, eos)
        req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        prompt = tok.encode("hi", add_special_tokens=False)
        for n in sizes:
            ids = [*output_ids(name, tok, n), eos_id]
            chunks = [[t] for t in ids]
            mine, ours_cpu = run_ours(tok, reasoning, tool, req, prompt, chunks, eos)
            if args.ours_only:
                theirs, vllm_cpu = mine, []
            else:
                theirs, vllm_cpu = run_vllm(oracle, reasoning, tool, req, prompt, chunks)
            if tool in WHOLE_CALLS and not args.ours_only:
                # our stream sends the call whole (tests/parsers/deliberate.py WHOLE_CALLS): it
                # must add up to vLLM's batch answer (vLLM's own stream does not where a
                # parameter is cut off by the size)
                from tests.parsers.deliberate import accumulate, batch_view

                whole = batch_view(oracle.batch(reasoning, tool, req, prompt, [t for c in chunks for t in c], "stop"))
                if accumulate([list(r) for r in mine]) != whole:
                    print(f"{name} {n}: ours does not add up to vLLM's batch: {accumulate([list(r) for r in mine])}")
                    return 1
            elif mine != theirs:
                first = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)
                print(f"{name} {n}: outputs differ at chunk {first}: ours {mine[first]} vLLM {theirs[first]}")
                return 1
            w = args.window
            start = statistics.median(ours_cpu[:w]) / 1e3
            end = statistics.median(ours_cpu[-w:]) / 1e3
            ours_total = sum(ours_cpu) / 1e9
            running, vllm_total = 0, 0
            for c in vllm_cpu:  # the replay of chunk k costs C(k)
                running += c
                vllm_total += running
            vllm_s = vllm_total / 1e9
            side = f"{vllm_s:>12.1f}  {vllm_s / ours_total:>9.0f}" if vllm_cpu else f"{'-':>12}  {'-':>9}"
            print(
                f"{name:<16} {len(ids):>6}  {start:>20.1f}  {end:>17.1f}  {end / start:>9.2f}  "
                f"{out_state_bytes[-1] / 1024:>12.1f}  {ours_total:>12.3f}  {side}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
