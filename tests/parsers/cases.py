"""The parser test cases shared by `test_parsers.py` and `tests/parity/compare_parsers.py`
(which runs them through vLLM's own parser classes and rewrites the GOLDEN block of
`test_parsers.py`): requests, prompts, outputs as token segments, chunkings, and the two ways
derender drives a parser (streaming chunk by chunk, and batch).

No pytest here: the comparison script runs in the vLLM oracle's environment.
"""

from __future__ import annotations

import json
import re
from typing import Any

from render_service.derender import detokenize as dt
from render_service.parsers import (
    ChatParser,
    RequestOptions,
    advance,
    get_parser,
    load_parsed_stream,
    new_parsed_stream,
    resolve_finish_reason,
    tool_ids,
)

EOS, EOT = 151645, 151643
MODEL_EOS = frozenset({EOS, EOT})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}},
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
]
REQ = {
    "auto": {"tools": TOOLS},
    "none": {"tools": TOOLS, "tool_choice": "none"},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "noparallel": {"tools": TOOLS, "parallel_tool_calls": False},
    "noreason": {"tools": TOOLS, "include_reasoning": False},
    "notools": {},
    "nothink": {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
}
TC = '\n{"name": "get_weather", "arguments": {"city": "Paris", "n": 3}}\n'
TC2 = '\n{"name": "search", "arguments": {"q": "ünï 😀 \\"q\\" {b}", "deep": {"a": [1, 2.5, null, true]}}}\n'


def encode(tok: Any, segments: list[Any]) -> list[int]:
    """Segments: text; "@<name>" for one added token by id; ("chars", text) for text encoded
    one character at a time (so tags are spelled by ordinary tokens)."""
    ids: list[int] = []
    for seg in segments:
        if isinstance(seg, tuple):
            for ch in seg[1]:
                ids.extend(tok.encode(ch, add_special_tokens=False))
        elif seg.startswith("@<"):
            ids.append(tok.convert_tokens_to_ids(seg[1:]))
        else:
            ids.extend(tok.encode(seg, add_special_tokens=False))
    return ids


PROMPTS = {
    "open": ["@<|im_start|>", "user\nWhat is the weather?", "@<|im_end|>", "\n", "@<|im_start|>", "assistant\n"],
    "nothink": [
        "@<|im_start|>",
        "user\nhi",
        "@<|im_end|>",
        "\n",
        "@<|im_start|>",
        "assistant\n",
        "@<think>",
        "\n\n",
        "@</think>",
        "\n\n",
    ],
    "closed": ["@<|im_start|>", "assistant\n", "@<think>", "x", "@</think>", "\n\n"],
}


def chunk(ids: list[int], how: str | list[int]) -> list[list[int]]:
    if how == "one":
        return [[t] for t in ids]
    if how == "all":
        return [list(ids)]
    sizes = list(how)
    out, i, k = [], 0, 0
    while i < len(ids):
        out.append(ids[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
    return out


def run_stream(
    tok: Any,
    parser: ChatParser,
    req: dict,
    prompt: list[int],
    chunks: list[list[int]],
    finish: str,
    *,
    roundtrip_every: int = 0,
    eos: tuple[int, frozenset[int]] = (EOS, MODEL_EOS),
) -> list[tuple[Any, str | None]]:
    """The streaming parser path of derender (drop stop token, detok with specials, step)."""
    opts = RequestOptions.from_request(req)
    ids_fn = tool_ids("req-1")
    state = new_parsed_stream(parser, prompt)
    out = []
    for i, ids in enumerate(chunks):
        last = i == len(chunks) - 1
        fr = finish if last else None
        text_ids, _ = dt.drop_stop_token(ids, fr, None, eos_token_id=eos[0], model_eos_token_ids=eos[1])
        if roundtrip_every and i % roundtrip_every == 0:
            state = load_parsed_stream(parser, json.loads(json.dumps(state.to_obj())))
        if ids or fr is not None:
            out.append(advance(parser, state, text_ids, ids, fr, opts, ids_fn))
        else:
            out.append((None, None))
    return out


def run_batch(
    tok: Any,
    parser: ChatParser,
    req: dict,
    prompt: list[int] | None,
    ids: list[int],
    finish: str,
    eos: tuple[int, frozenset[int]] = (EOS, MODEL_EOS),
) -> dict:
    opts = RequestOptions.from_request(req)
    seed = dt.seed_state(tok, prompt, skip_special_tokens=False)
    text, stop_reason = dt.decode_output(
        tok, ids, finish, None, seed, eos_token_id=eos[0], model_eos_token_ids=eos[1], skip_special_tokens=False
    )
    reasoning, content, calls = parser.parse_batch(text, opts, prompt, (), prompt)
    reasoning, content, pairs = parser.assemble(reasoning, content, calls, opts, tool_ids("req-1"))
    return {
        "text": text,
        "stop_reason": stop_reason,
        "reasoning": reasoning,
        "content": content,
        "tool_calls": [batch_call(c.name, c.arguments, call_id) for call_id, c in pairs],
        "finish_reason": resolve_finish_reason(finish, opts, bool(pairs)),
    }


def stream_sizes(parser: Any, prompt: list[int], ids: list[int], opts: Any) -> tuple[list[int], str]:
    """Stream `ids` one token per chunk through `parsers.advance`, the state JSON round-tripped
    after every chunk: the state's JSON size after each chunk, and the streamed arguments."""
    state = new_parsed_stream(parser, prompt)
    sizes, args = [], ""
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        delta, _ = advance(parser, state, [] if last else [t], [t], "stop" if last else None, opts, tool_ids("r"))
        state = load_parsed_stream(parser, json.loads(json.dumps(state.to_obj())))
        sizes.append(len(json.dumps(state.to_obj(), ensure_ascii=False)))
        for call in delta.tool_calls if delta is not None else []:
            args += call.arguments or ""
    return sizes, args


def stream_through_snapshots(
    parser: Any, prompt: list[int], ids: list[int], opts: Any
) -> tuple[list[Any], list[int], list[int]]:
    """Stream `ids` one token per chunk, storing the state after every chunk as compact mode does
    (held text in a segment beside the snapshot, `parsers/held.py`) and loading it back from there:
    the deltas, each snapshot's JSON size, and the bytes each chunk wrote to its segment."""
    from render_service.derender.snapshots import LocalStore, SnapshotCodec, SnapshotStore
    from render_service.server.metrics import Metrics

    store = SnapshotStore(SnapshotCodec(b"k" * 32), Metrics(), local=LocalStore())
    assert store.local is not None
    state = new_parsed_stream(parser, prompt)
    deltas, sizes, writes = [], [], []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        delta, _ = advance(parser, state, [] if last else [t], [t], "stop" if last else None, opts, tool_ids("r"))
        deltas.append(delta)
        writer = store.segment_writer("f" * 16, "s", i + 1)
        obj = json.loads(json.dumps(state.to_obj(writer)))
        sizes.append(len(json.dumps(obj, ensure_ascii=False)))
        writes.append(sum(len(w.data) for w in writer.writes))
        stored = [store.local.segments.text(*ref) for ref in writer.refs]
        assert all(text is not None for text in stored)
        state = load_parsed_stream(parser, obj, stored)  # type: ignore[arg-type]
    return deltas, sizes, writes


# Random ids in a family's own shape: Hunyuan A13B's batch `call_HEX` is compared by its shape; a
# `call_{index}_HEX` id (xlam's, where ours are `chatcmpl-tool-...`, and Hunyuan A13B's streamed ones)
# counts as random, like `chatcmpl-tool-...`.
_CALL_HEX_ID = re.compile(r"call_[0-9a-f]{16}")
_INDEXED_RANDOM_ID = re.compile(r"call_\d+_[0-9a-f]{16}")


def _random_id(tool_call_id: str) -> bool:
    return tool_call_id.startswith("chatcmpl-tool-") or _INDEXED_RANDOM_ID.fullmatch(tool_call_id) is not None


def shown_id(tool_call_id: str) -> str:
    """Random-style ids differ by design; a family's native ids must match (`call_HEX` by its shape)."""
    if _random_id(tool_call_id):
        return "ID"
    return "call_ID" if _CALL_HEX_ID.fullmatch(tool_call_id) else tool_call_id


def batch_call(name: str, arguments: str, tool_call_id: str) -> list[str]:
    return [name, arguments] if _random_id(tool_call_id) else [name, arguments, shown_id(tool_call_id)]


def wire(delta: Any) -> dict | None:
    """A delta as vLLM's `model_dump(exclude_none=True)`, ids normalised."""
    if delta is None:
        return None
    d = {k: v for k, v in (("content", delta.content), ("reasoning", delta.reasoning)) if v is not None}
    calls = []
    for tc in delta.tool_calls:
        c: dict[str, Any] = {}
        if tc.id is not None:
            c["id"] = shown_id(tc.id)
        if tc.type is not None:
            c["type"] = tc.type
        c["index"] = tc.index
        c["function"] = {k: v for k, v in (("name", tc.name), ("arguments", tc.arguments)) if v is not None}
        calls.append(c)
    if calls:
        d["tool_calls"] = calls
    return d


def concat(steps: list[tuple[Any, str | None]]) -> dict:
    reasoning, content, names, args = "", "", {}, {}
    for delta, _ in steps:
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for tc in delta.tool_calls:
            if tc.name is not None:
                names[tc.index] = tc.name
            args[tc.index] = args.get(tc.index, "") + (tc.arguments or "")
    return {"reasoning": reasoning, "content": content, "names": names, "args": args, "finish": steps[-1][1]}


# -- parity with vLLM 0.33: goldens ----------------------------------------------------------------

# name -> (reasoning, tool, request, prompt, output segments, chunking, finish_reason)
GOLDEN_CASES: dict[str, tuple[Any, ...]] = {
    "think_content/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@<think>", "\nLet me think. é 😀 中文\n", "@</think>", "\n\nThe answer is 42.", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "think_tool/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@<think>", "\nneed weather\n", "@</think>", "\n\n", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "think_tool/all": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@<think>", "\nneed weather\n", "@</think>", "\n\n", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "all",
        "stop",
    ),
    "two_tools/mixed": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        [
            "@<think>",
            "r",
            "@</think>",
            "\n\n",
            "@<tool_call>",
            TC,
            "@</tool_call>",
            "\n",
            "@<tool_call>",
            TC2,
            "@</tool_call>",
            "@<|im_end|>",
        ],
        [1, 3, 2, 5],
        "stop",
    ),
    "content_then_tool/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        [
            "@<think>",
            "r",
            "@</think>",
            "\n\nSure, checking. ",
            "@<tool_call>",
            TC,
            "@</tool_call>",
            " after",
            "@<|im_end|>",
        ],
        "one",
        "stop",
    ),
    "tool_in_reasoning/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@<think>", "\nthinking", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "malformed_brace/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        [
            "@</think>",
            "@<tool_call>",
            '\n{"name": "get_weather", "arguments": {"city": "Paris"}\n',
            "@</tool_call>",
            "@<|im_end|>",
        ],
        "one",
        "stop",
    ),
    "malformed_blocks_later/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        [
            "@</think>",
            "\n\n",
            "@<tool_call>",
            "\nnot json\n",
            "@</tool_call>",
            "\n",
            "@<tool_call>",
            TC,
            "@</tool_call>",
            "@<|im_end|>",
        ],
        "one",
        "stop",
    ),
    "no_arguments/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@</think>", "@<tool_call>", '{"name": "search"}', "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "no_arguments/all": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@</think>", "@<tool_call>", '{"name": "search"}', "@</tool_call>", "@<|im_end|>"],
        "all",
        "stop",
    ),
    "args_before_name/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@</think>", "@<tool_call>", '{"arguments": {"x": [1, 2]}, "name": "search"}', "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "text_tags/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        [
            ("chars", "<think>"),
            "a < b and <tool",
            ("chars", "</think>"),
            "x",
            "@</think>",
            "c <tool_ ",
            ("chars", "<tool_call>"),
            "d",
            "@<|im_end|>",
        ],
        "one",
        "stop",
    ),
    "truncated_args/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@<think>", "r", "@</think>", "@<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Par'],
        "one",
        "length",
    ),
    "truncated_reasoning/one": ("qwen3", None, "auto", "open", ["@<think>", "still thinking <thi"], "one", "length"),
    "no_start/one": (
        "qwen3",
        None,
        "auto",
        "open",
        ["Reasoning without start", "@</think>", "content", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "content_before_think/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["Hello ", "@<think>", "inner", "@</think>", " after", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "im_end_inside/one": (
        "qwen3",
        None,
        "auto",
        "open",
        ["@<think>", "a", "@<|im_end|>", "b", "@</think>", "c", "@<|endoftext|>", "d", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "multibyte/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@<think>", "😀😀é", "@</think>", "🎉中文 content 👩‍👩‍👧", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "whitespace_then_tool/one": (
        "qwen3",
        "hermes",
        "auto",
        "open",
        ["@</think>", "\n\n  \n", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "prompt_closed/one": (
        "qwen3",
        "hermes",
        "auto",
        "closed",
        ["Answer", "@</think>", " more ", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "nothink/one": (
        "qwen3",
        "hermes",
        "nothink",
        "nothink",
        ["Plain answer ", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "noreason/one": (
        "qwen3",
        "hermes",
        "noreason",
        "open",
        ["@<think>", "hidden", "@</think>", "\n\nshown", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "tool_choice_none/one": (
        "qwen3",
        "hermes",
        "none",
        "open",
        ["@<think>", "r", "@</think>", "x ", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "required/one": (
        "qwen3",
        "hermes",
        "required",
        "open",
        ["@</think>", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "named/one": (
        "qwen3",
        "hermes",
        "named",
        "open",
        ["@</think>", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "noparallel/mixed": (
        "qwen3",
        "hermes",
        "noparallel",
        "open",
        ["@</think>", "@<tool_call>", TC, "@</tool_call>", "@<tool_call>", TC2, "@</tool_call>", "@<|im_end|>"],
        [2, 7, 1],
        "stop",
    ),
    "notools/one": (
        "qwen3",
        "hermes",
        "notools",
        "open",
        ["@</think>", "pre ", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "hermes_only/one": (
        None,
        "hermes",
        "auto",
        "open",
        ["pre <tool", " text ", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "qwen3_json/all": (
        "qwen3",
        "qwen3_json",
        "auto",
        "open",
        ["@<think>", "r", "@</think>", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "all",
        "stop",
    ),
    "ds_think/one": (
        "deepseek_r1",
        "hermes",
        "auto",
        "open",
        ["@<think>", "reason é😀", "@</think>", "answer ", "@<tool_call>", TC, "@</tool_call>", "@<|im_end|>"],
        "one",
        "stop",
    ),
    "ds_think/mixed": (
        "deepseek_r1",
        None,
        "auto",
        "open",
        ["@<think>", "reason é😀", "@</think>", "answer", "@<|im_end|>"],
        [2, 3],
        "stop",
    ),
    "ds_nostart/all": (
        "deepseek_r1",
        None,
        "auto",
        "open",
        ["reason", "@</think>", "answer", "@<|im_end|>"],
        "all",
        "stop",
    ),
    "ds_prompt_closed/one": ("deepseek_r1", "hermes", "nothink", "nothink", ["Answer", "@<|im_end|>"], "one", "stop"),
}


def golden_case_inputs(tok: Any, name: str) -> dict:
    reasoning, tool, req_name, prompt_name, segments, how, finish = GOLDEN_CASES[name]
    ids = encode(tok, segments)
    return {
        "reasoning": reasoning,
        "tool": tool,
        "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}], **REQ[req_name]},
        "prompt_ids": encode(tok, PROMPTS[prompt_name]),
        "chunks": chunk(ids, how),
        "finish_reason": finish,
    }


def golden_result(tok: Any, name: str) -> dict:
    case = golden_case_inputs(tok, name)
    req = case["request"]
    parser = get_parser(
        tok,
        case["reasoning"],
        case["tool"],
        enable_auto_tools=True,
        thinking_enabled=(req.get("chat_template_kwargs") or {}).get("enable_thinking", True),
    )
    steps = run_stream(tok, parser, req, case["prompt_ids"], case["chunks"], case["finish_reason"])
    stream = [[i, wire(d), fr] for i, (d, fr) in enumerate(steps) if d is not None or fr is not None]
    ids = [t for c in case["chunks"] for t in c]
    return {"stream": stream, "batch": run_batch(tok, parser, req, case["prompt_ids"], ids, case["finish_reason"])}
