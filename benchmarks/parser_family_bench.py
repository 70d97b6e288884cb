#!/usr/bin/env python3
"""Streaming parser path, ours vs vLLM 0.33's, per family, side by side in one process (no HTTP).

A benchmark script, not a timed test. Run it with the vLLM oracle's Python (it imports vLLM for the
side-by-side and our package from the repository root):

    python -m tests.parsers.families.kimi MODELS/kimi; python -m tests.parsers.families.deepseek MODELS/deepseek
    ORACLE_PYTHON benchmarks/parser_family_bench.py --models MODELS [--family kimi deepseek_v3 deepseek_v31]
                                                    [--sizes 2000,4000] [--vllm-size 2000]

For each family: an N-token output (reasoning ~35%, content ~15%, one tool call whose JSON arguments
carry a long description, the end-of-turn token) on the family's fixture tokenizer
(tests/parsers/families/), streamed one token per chunk.

- ours: `parsers.advance` per chunk (detokenize with special tokens kept, parse) plus the snapshot
  of the state (load the previous msgpack snapshot, `to_obj()` with held text to a segment, encode), i.e. what compact mode does per chunk minus
  HTTP; per-chunk CPU of the first and the last 50 chunks, and their ratio (flat = 1.0);
- vLLM: what its derender does per chunk, minus HTTP and JSON: a fresh parser and stream processor,
  the whole output so far replayed chunk by chunk (detokenizer included), then the new chunk;
  measured on the whole stream at `--vllm-size`.

Both must produce the same concatenated reasoning, content, tool names and arguments (checked).
CPU is `time.process_time()` (this process only).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from render_service import parsers
from render_service.derender import detokenize as dt
from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
from render_service.model.example import build_example_model
from render_service.server.metrics import Metrics
from tests.parsers.families import deepseek as ds_fixture
from tests.parsers.families import ernie45 as ernie45_fixture
from tests.parsers.families import gemma4 as gemma4_fixture
from tests.parsers.families import hunyuan as hunyuan_fixture
from tests.parsers.families import json_tools
from tests.parsers.families import kimi as kimi_fixture
from tests.parsers.families import kimi_k3 as kimi_k3_fixture
from tests.parsers.families import minimax_m3 as mm3_fixture
from tests.parsers.families import olmo3step as olmo3step_fixture

WORDS = (
    "the retry storm began after the deploy and every worker kept hammering the settlement "
    "queue while the scheduler backed off too slowly so invoices were settled twice "
).split()

FAMILIES: dict[str, dict[str, Any]] = {
    "kimi": {"builder": kimi_fixture.build, "reasoning": "kimi_k2", "tool": "kimi_k2"},
    "deepseek_v3": {"builder": ds_fixture.build, "reasoning": "deepseek_v3", "tool": "deepseek_v3"},
    "deepseek_v31": {"builder": ds_fixture.build, "reasoning": "deepseek_v3", "tool": "deepseek_v31"},
    "deepseek_v32": {"builder": ds_fixture.build, "reasoning": "deepseek_v3", "tool": "deepseek_v32"},
    "gemma4": {"builder": gemma4_fixture.build, "reasoning": "gemma4", "tool": "gemma4", "folder": "gemma4"},
    "kimi_k3": {"builder": kimi_k3_fixture.build, "reasoning": "kimi_k3", "tool": "kimi_k3", "folder": "kimi_k3"},
    "ernie45": {
        "builder": ernie45_fixture.build,
        "reasoning": "ernie45",
        "tool": "ernie45",
        "folder": "ernie45",
        "eos": "<|end_of_sentence|>",
    },
    "minimax_m3": {
        "builder": mm3_fixture.build,
        "reasoning": "minimax_m3",
        "tool": "minimax_m3",
        "folder": "minimax_m3",
        "eos": "[e~[",
    },
}
# The JSON-shaped tool families (no reasoning parser): content, then one call in the family's wrapper.
# (fixture folder, text before the call object, text after it, eos token; "@<tok>" is one token by id)
JSON_WRAPPERS: dict[str, tuple[str, list[str], list[str], str]] = {
    "phi4_mini_json": ("phi4_mini", ["functools["], ["]"], "<|end|>"),
    "xlam": ("xlam", ["\n```json\n["], ["]\n```"], "<|im_end|>"),
    "internlm": ("internlm", ["@<|action_start|>", "@<|plugin|>", "\n"], ["@<|action_end|>"], "<|im_end|>"),
    "jamba": ("jamba", ["@<tool_calls>", "["], ["]", "@</tool_calls>"], "<|eom|>"),
}
for _name, (_folder, _, _, _eos) in JSON_WRAPPERS.items():
    FAMILIES[_name] = {
        "builder": json_tools.builder(_folder),
        "reasoning": None,
        "tool": _name,
        "folder": _folder,
        "eos": _eos,
    }

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "create_ticket",
            "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
        },
    }
]


# Gemma 4's engine streams a value only when the schema types it as a string (as vLLM does):
# declared, the long description streams instead of waiting for its end.
FAMILIES["gemma4"]["tools"] = [json.loads(json.dumps(TOOLS[0]))]
FAMILIES["gemma4"]["tools"][0]["function"]["parameters"]["properties"]["description"] = {"type": "string"}
FAMILIES["deepseek_v32"]["tools"] = FAMILIES["gemma4"]["tools"]

# Hunyuan: A13B with reasoning and tools on a whole turn (vLLM's reasoning stream keys on Hunyuan's own
# token ids, which the fixture does not have: it streams all of it as content and its tool parser never
# runs, so the outputs differ); V3 with reasoning on (`reasoning_effort`) and the description typed as a
# string.
FAMILIES["hunyuan_a13b"] = {
    "builder": hunyuan_fixture.build_a13b,
    "reasoning": "hunyuan_a13b",
    "tool": "hunyuan_a13b",
    "folder": "hunyuan_a13b",
    "eos": "<|eos|>",
}
FAMILIES["hy_v3"] = {
    "builder": hunyuan_fixture.build_hy,
    "reasoning": "hy_v3",
    "tool": "hy_v3",
    "folder": "hy",
    "eos": "<|hy_end|>",
    "tools": FAMILIES["gemma4"]["tools"],
    "kwargs": {"reasoning_effort": "high"},
}
# Step3 / Step 3.5 / Olmo 3 (tests/parsers/families/olmo3step.py; Step 3.5 on the Qwen3 folder).
FAMILIES["step3"] = {"builder": olmo3step_fixture.build_step3, "reasoning": "step3", "tool": "step3", "folder": "step3"}
FAMILIES["step3p5"] = {
    "builder": lambda path: build_example_model(path, "qwen3"),
    "reasoning": "step3p5",
    "tool": "step3p5",
    "folder": "qwen3",
    "tools": FAMILIES["gemma4"]["tools"],
}
FAMILIES["olmo3"] = {"builder": olmo3step_fixture.build_olmo3, "reasoning": "olmo3", "tool": "olmo3", "folder": "olmo3"}
for _name, _eos in {"step3": "<|EOT|>", "step3p5": "<|im_end|>", "olmo3": "<|im_end|>"}.items():
    FAMILIES[_name]["eos"] = _eos


def prose(tok: Any, n: int, seed: int) -> list[int]:
    words = [WORDS[(seed + i * 7) % len(WORDS)] for i in range(n * 2)]
    return tok.encode(" ".join(words), add_special_tokens=False)[:n]


def _segments(tok: Any, segments: list[str]) -> list[int]:
    vocab = tok.get_vocab()
    return [
        t
        for seg in segments
        for t in ([vocab[seg[1:]]] if seg.startswith("@<") else tok.encode(seg, add_special_tokens=False))
    ]


def json_tool_output(family: str, tok: Any, n: int) -> list[int]:
    """Content (~15%), then one call whose JSON arguments carry a long description."""
    _, before, after, eos = JSON_WRAPPERS[family]
    key = "parameters" if family == "internlm" else "arguments"
    content = prose(tok, round(0.15 * n), 2)
    head = [
        *_segments(tok, before),
        *tok.encode('{"name": "create_ticket", "' + key + '": {"title": "Retry storm", ', add_special_tokens=False),
    ]
    head += tok.encode('"description": "', add_special_tokens=False)
    tail = [*tok.encode('", "priority": "P1"}}', add_special_tokens=False), *_segments(tok, after)]
    desc = prose(tok, n - len(content) - len(head) - len(tail) - 1, 3)
    return [*content, *head, *desc, *tail, tok.get_vocab()[eos]]


def output(family: str, tok: Any, n: int) -> list[int]:
    if family in JSON_WRAPPERS:
        return json_tool_output(family, tok, n)
    vocab = tok.get_vocab()
    reasoning = prose(tok, round(0.35 * n), 1)
    content = prose(tok, round(0.15 * n), 2)
    head = tok.encode('{"title": "Retry storm", "description": "', add_special_tokens=False)
    tail = tok.encode('", "priority": "P1"}', add_special_tokens=False)
    if family == "gemma4":
        channel, end_channel, call, end_call, q, eos = (
            vocab[m] for m in ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<turn|>")
        )
        name = tok.encode("call:create_ticket{title:", add_special_tokens=False)
        mid = tok.encode(",description:", add_special_tokens=False)
        title = tok.encode("Retry storm", add_special_tokens=False)
        thought = tok.encode("thought\n", add_special_tokens=False)
        fixed = 10 + len(name) + len(mid) + len(title) + len(thought)
        desc = prose(tok, n - len(reasoning) - len(content) - fixed, 3)
        args = [*name, q, *title, q, *mid, q, *desc, q, *tok.encode("}", add_special_tokens=False)]
        return [channel, *thought, *reasoning, end_channel, *content, call, *args, end_call, eos]
    if family in ("step3", "step3p5", "olmo3"):
        return _step_olmo_output(family, tok, n, reasoning, content)
    if family == "deepseek_v32":
        head = tok.encode(
            '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="create_ticket">\n'
            '<｜DSML｜parameter name="title" string="true">Retry storm</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="description" string="true">',
            add_special_tokens=False,
        )
        tail = tok.encode(
            "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", add_special_tokens=False
        )
        think, end_think = vocab["<think>"], vocab["</think>"]
        desc = prose(tok, n - len(reasoning) - len(content) - len(head) - len(tail) - 3, 3)
        ids = [think, *reasoning, end_think, *content, *head, *desc, *tail]
        return [*ids, vocab[ds_fixture.EOS]]
    if family == "kimi_k3":
        opening, closing, sep = vocab["<|open|>"], vocab["<|close|>"], vocab["<|sep|>"]

        def marker(head: int, word: str) -> list[int]:
            return [head, *tok.encode(word, add_special_tokens=False), sep]

        title = [
            *marker(opening, 'argument key="title" type="string"'),
            *tok.encode("Retry storm", add_special_tokens=False),
            *marker(closing, "argument"),
        ]
        call = [*marker(opening, 'call tool="create_ticket" index="1"'), *title]
        call += marker(opening, 'argument key="description" type="string"')
        end = [*marker(closing, "argument"), *marker(closing, "call"), *marker(closing, "tools")]
        end += [*marker(closing, "message"), vocab["[EOS]"]]
        head3 = [*marker(closing, "think"), *marker(opening, "response")]
        mid = [*marker(closing, "response"), *marker(opening, "tools")]
        desc = prose(tok, n - len(reasoning) - len(content) - len(head3) - len(mid) - len(call) - len(end), 3)
        return [*reasoning, *head3, *content, *mid, *call, *desc, *end]
    if family == "hunyuan_a13b":
        call = '[{"name": "create_ticket", "arguments": {"title": "Retry storm", "description": "'
        think, end_think, answer, end_answer = (vocab[m] for m in ("<think>", "</think>", "<answer>", "</answer>"))
        nl = tok.encode("\n", add_special_tokens=False)
        head3 = [*nl, end_think, *nl, answer, *nl]
        head, tail = tok.encode(call, add_special_tokens=False), tok.encode('"}}]', add_special_tokens=False)
        fixed = len(head3) + len(head) + len(tail) + 2 * len(nl) + 6
        desc = prose(tok, n - len(reasoning) - len(content) - fixed, 3)
        calls = [vocab["<tool_calls>"], *head, *desc, *tail, vocab["</tool_calls>"]]
        return [think, *nl, *reasoning, *head3, *content, *calls, *nl, end_answer, vocab["<|eos|>"]]
    if family == "hy_v3":
        suffix = hunyuan_fixture.SUFFIX

        def m(name: str) -> int:
            return vocab[f"<{name}{suffix}>"]

        def arg(key: str) -> list[int]:
            return [m("arg_key"), *tok.encode(key, add_special_tokens=False), m("/arg_key"), m("arg_value")]

        call = [m("tool_calls"), m("tool_call"), *tok.encode("create_ticket", add_special_tokens=False), m("tool_sep")]
        call += [
            *arg("title"),
            *tok.encode("Retry storm", add_special_tokens=False),
            m("/arg_value"),
            *arg("description"),
        ]
        end = [m("/arg_value"), m("/tool_call"), m("/tool_calls"), vocab["<|hy_end|>"]]
        desc = prose(tok, n - len(reasoning) - len(content) - len(call) - len(end) - 1, 3)
        return [*reasoning, m("/think"), *content, *call, *desc, *end]
    if family == "ernie45":
        # reasoning</think>content<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
        end_think, call, end_call = (vocab[m] for m in ("</think>", "<tool_call>", "</tool_call>"))
        call_head = tok.encode('\n{"name": "create_ticket", "arguments": ', add_special_tokens=False)
        call_tail = tok.encode("}\n", add_special_tokens=False)
        fixed = 4 + len(call_head) + len(head) + len(tail) + len(call_tail)
        desc = prose(tok, n - len(reasoning) - len(content) - fixed, 3)
        args = [*call_head, *head, *desc, *tail, *call_tail]
        return [*reasoning, end_think, *content, call, *args, end_call, vocab["<|end_of_sentence|>"]]
    if family == "minimax_m3":
        # <mm:think>reasoning</mm:think>content, then the namespaced call block
        ns = mm3_fixture.NS
        think, end_think = vocab["<mm:think>"], vocab["</mm:think>"]
        call_head = tok.encode(
            f'{ns}<tool_call>\n{ns}<invoke name="create_ticket">\n{ns}<title>Retry storm{ns}</title>\n{ns}<description>',
            add_special_tokens=False,
        )
        call_tail = tok.encode(f"{ns}</description>\n{ns}</invoke>\n{ns}</tool_call>", add_special_tokens=False)
        fixed = 3 + len(call_head) + len(call_tail)
        desc = prose(tok, n - len(reasoning) - len(content) - fixed, 3)
        return [think, *reasoning, end_think, *content, *call_head, *desc, *call_tail, vocab["[e~["]]
    if family == "kimi":
        marks = ["<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>"]
        think, end_think, sec, call = (vocab[m] for m in marks)
        arg, call_end, sec_end = (
            vocab[m] for m in ("<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>")
        )
        header = tok.encode("functions.create_ticket:0", add_special_tokens=False)
        fixed = 8 + len(header) + len(head) + len(tail)
        desc = prose(tok, n - len(reasoning) - len(content) - fixed, 3)
        eos = vocab["<|im_end|>"]
        ids = [think, *reasoning, end_think, *content, sec, call, *header, arg, *head, *desc, *tail, call_end, sec_end]
        return [*ids, eos]
    think, end_think = vocab["<think>"], vocab["</think>"]
    cb, ce, b, e, sep = (
        vocab[m]
        for m in (
            ds_fixture.TOOL_CALLS_BEGIN,
            ds_fixture.TOOL_CALLS_END,
            ds_fixture.TOOL_CALL_BEGIN,
            ds_fixture.TOOL_CALL_END,
            ds_fixture.TOOL_SEP,
        )
    )
    if family == "deepseek_v31":
        pre = [*tok.encode("create_ticket", add_special_tokens=False), sep]
        post: list[int] = []
    else:
        pre = [
            *tok.encode("function", add_special_tokens=False),
            sep,
            *tok.encode("create_ticket\n```json\n", add_special_tokens=False),
        ]
        post = tok.encode("\n```", add_special_tokens=False)
    fixed = 7 + len(pre) + len(post) + len(head) + len(tail)
    desc = prose(tok, n - len(reasoning) - len(content) - fixed, 3)
    ids = [think, *reasoning, end_think, *content, cb, b, *pre, *head, *desc, *tail, *post, e, ce]
    return [*ids, vocab[ds_fixture.EOS]]


def _step_olmo_output(family: str, tok: Any, n: int, reasoning: list[int], content: list[int]) -> list[int]:
    vocab = tok.get_vocab()

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    if family == "step3":
        begin, end = vocab["<｜tool_calls_begin｜>"], vocab["<｜tool_calls_end｜>"]
        call, call_end, sep = vocab["<｜tool_call_begin｜>"], vocab["<｜tool_call_end｜>"], vocab["<｜tool_sep｜>"]
        head = [begin, call, *enc("function"), sep, *enc('<steptml:invoke name="create_ticket">')]
        head += enc(
            '<steptml:parameter name="title">Retry storm</steptml:parameter><steptml:parameter name="description">'
        )
        tail = [*enc("</steptml:parameter></steptml:invoke>"), call_end, end, vocab["<|EOT|>"]]
        prefix = [*reasoning, vocab["</think>"], *content]
    elif family == "step3p5":
        head = [
            vocab["<tool_call>"],
            *enc("\n<function=create_ticket>\n<parameter=title>\nRetry storm\n</parameter>\n"),
        ]
        head += enc("<parameter=description>\n")
        tail = [*enc("\n</parameter>\n</function>\n"), vocab["</tool_call>"], vocab["<|im_end|>"]]
        prefix = [*reasoning, *enc("\n"), vocab["</think>"], *enc("\n\n"), *content]
    else:  # olmo3: markers are text; the calls open the tool phase (else they would be content)
        head = enc("</think><function_calls>create_ticket(title='Retry storm', description='")
        tail = [*enc("')</function_calls>"), vocab["<|im_end|>"]]
        prefix = reasoning
    desc = prose(tok, n - len(prefix) - len(head) - len(tail), 3)
    return [*prefix, *head, *desc, *tail]


def summary(deltas: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"reasoning": "", "content": "", "calls": {}}
    for d in deltas:
        if d is None:
            continue
        out["reasoning"] += d.get("reasoning") or ""
        out["content"] += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            call = out["calls"].setdefault(tc["index"], ["", ""])
            call[0] += tc.get("name") or ""
            call[1] += tc.get("arguments") or ""
    return out


def ours(tok: Any, cfg: dict[str, Any], req: dict[str, Any], prompt: list[int], ids: list[int], eos: int):
    kwargs = req.get("chat_template_kwargs") or {}
    parser = parsers.get_parser(
        tok,
        cfg["reasoning"],
        cfg["tool"],
        enable_auto_tools=True,
        thinking_enabled=parsers.thinking_enabled(cfg["reasoning"], kwargs, cfg["tool"]),
    )
    opts = parsers.RequestOptions.from_request(req)
    ids_fn = parsers.tool_ids("bench")
    per_chunk: list[float] = []
    deltas = []
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    # Each chunk loads the previous snapshot and stores a new one, as compact mode does; held
    # text (a call held until it is decided) goes to a segment beside the snapshot
    # (derender/segments.py, in-process store), so a chunk writes only the new bytes.
    store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())

    def encode(state: Any, position: int) -> bytes:
        held = store.segment_writer("f" * 16, "bench", position)
        return encoder.encode([state.to_obj(held), held.refs])

    blob = encode(parsers.new_parsed_stream(parser, prompt), 0)
    for i, tid in enumerate(ids):
        fr = "stop" if i == len(ids) - 1 else None
        t0 = time.process_time()
        obj, refs = decoder.decode(blob)
        stored = store.local_held_texts(refs) if refs else []
        assert stored is not None, "a held-text segment is missing"
        state = parsers.load_parsed_stream(parser, obj, stored)
        text_ids, _ = dt.drop_stop_token([tid], fr, None, eos_token_id=eos, model_eos_token_ids=frozenset({eos}))
        delta, _ = parsers.advance(parser, state, text_ids, [tid], fr, opts, ids_fn)
        blob = encode(state, i + 1)  # the snapshot
        per_chunk.append(time.process_time() - t0)
        deltas.append(_wire(delta))
    return per_chunk, deltas


def _wire(delta: Any) -> dict[str, Any] | None:
    if delta is None:
        return None
    return {
        "content": delta.content,
        "reasoning": delta.reasoning,
        "tool_calls": [{"index": t.index, "name": t.name, "arguments": t.arguments} for t in delta.tool_calls],
    }


def vllm(model_dir: Path, cfg: dict[str, Any], req: dict[str, Any], prompt: list[int], ids: list[int], eos: int):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
    from vllm.parser import ParserManager
    from vllm.renderers.online_derenderer import OnlineDerenderer, _seed_stream_state
    from vllm.tokenizers import get_tokenizer

    logging.getLogger("vllm").setLevel(logging.CRITICAL)
    tokenizer = get_tokenizer(str(model_dir))
    derenderer = object.__new__(OnlineDerenderer)
    derenderer._eos_token_id = eos
    derenderer._model_eos_token_ids = frozenset({eos})
    parser_cls = ParserManager.get_parser(
        tool_parser_name=cfg["tool"],
        reasoning_parser_name=cfg["reasoning"],
        enable_auto_tools=True,
        tokenizer=tokenizer,
    )
    request = ChatCompletionRequest.model_validate(req)
    kwargs = dict(req.get("chat_template_kwargs") or {})
    deltas = []
    t0 = time.process_time()
    for k in range(len(ids)):
        # vLLM's derender: a fresh processor, replay of ids[:k] chunk by chunk, then chunk k
        processor = ChatStreamProcessor(
            request,
            parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=None),
            enable_auto_tools=True,
            parser_cls=parser_cls,
        )
        detok = _seed_stream_state(tokenizer, prompt, skip_special_tokens=False)
        for j in range(k + 1):
            fr = "stop" if j == len(ids) - 1 else None
            text_ids, _ = derenderer._drop_stop_token([ids[j]], fr, None, request)
            text, detok = derenderer._detokenize_delta(
                tokenizer, text_ids, detok, skip_special_tokens=False, spaces_between_special_tokens=True
            )
            delta, _ = processor.step(text, [ids[j]], fr, prompt)
        deltas.append(
            None
            if delta is None
            else {
                "content": delta.content,
                "reasoning": delta.reasoning,
                "tool_calls": [
                    {
                        "index": t.index,
                        "name": t.function.name if t.function else None,
                        "arguments": t.function.arguments if t.function else None,
                    }
                    for t in (delta.tool_calls or [])
                ],
            }
        )
    return time.process_time() - t0, deltas


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--sizes", default="2000,4000")
    ap.add_argument("--vllm-size", type=int, default=2000, help="0: skip vLLM")
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument(
        "--models", type=Path, help="reuse fixture folders DIR/kimi and DIR/deepseek (built by the service venv)"
    )
    args = ap.parse_args()
    from transformers import AutoTokenizer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.family:
            cfg = FAMILIES[family]
            folder = cfg.get("folder") or ("kimi" if family == "kimi" else "deepseek")
            model_dir = (args.models or Path(tmp)) / folder
            if not (model_dir / "tokenizer.json").exists():
                cfg["builder"](model_dir)
            tok = AutoTokenizer.from_pretrained(str(model_dir))
            eos_token = cfg.get("eos") or {"kimi": "<|im_end|>", "gemma4": "<turn|>", "kimi_k3": "[EOS]"}.get(
                family, ds_fixture.EOS
            )
            eos = tok.convert_tokens_to_ids(eos_token)
            req = {
                "model": "m",
                "messages": [{"role": "user", "content": "file a ticket"}],
                "tools": cfg.get("tools", TOOLS),
                "chat_template_kwargs": cfg.get("kwargs", {"thinking": True, "enable_thinking": True}),
            }
            prompt = tok.encode("file a ticket", add_special_tokens=False)
            for n in [int(s) for s in args.sizes.split(",")]:
                ids = output(family, tok, n)
                per_chunk, our_deltas = ours(tok, cfg, req, prompt, ids, eos)
                w = args.window
                start, end = sum(per_chunk[1 : w + 1]) / w, sum(per_chunk[-w:]) / w
                row = {
                    "family": family,
                    "tokens": len(ids),
                    "ours_cpu_s": round(sum(per_chunk), 4),
                    "ours_chunk_us_start": round(start * 1e6, 1),
                    "ours_chunk_us_end": round(end * 1e6, 1),
                    "end_over_start": round(end / start, 2),
                }
                if n == args.vllm_size:
                    vllm_cpu, vllm_deltas = vllm(model_dir, cfg, req, prompt, ids, eos)
                    same = summary(vllm_deltas) == summary(our_deltas)
                    row |= {
                        "vllm_cpu_s": round(vllm_cpu, 2),
                        "vllm_over_ours": round(vllm_cpu / sum(per_chunk), 1),
                        "same_output": same,
                    }
                rows.append(row)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
