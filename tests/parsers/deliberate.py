"""Where our stream deliberately differs from vLLM 0.33's: vLLM's streamed deltas do not
accumulate to its own batch answer there, ours do (the batch answer stays vLLM's, byte for byte).

The golden tests compare every streamed delta with vLLM's wherever vLLM's stream accumulates to
its batch answer; where it does not, the case must be named here (by golden case name, or by
family and parser configuration for the fuzzed family goldens) and our stream must accumulate to
the batch golden. A stream that differs from vLLM's anywhere else fails.
"""

from __future__ import annotations

from typing import Any

# The causes (docs/parsers.md, "Where vLLM's streaming and batch answers disagree").
QWEN3_CONTENT_AFTER_END = (
    "qwen3 reasoning: batch keeps running the reasoning engine over the content (from the start when "
    "the prompt closes reasoning): a stray </think> token leaves the content"
)

# test_parsers.py GOLDEN case -> cause
CASES: dict[str, str] = {
    "prompt_closed/one": QWEN3_CONTENT_AFTER_END,
}

# (family golden file, "reasoning+tool") -> cause, for golden_families/*.jsonl
CONFIGS: dict[tuple[str, str], str] = {}


def accumulate(stream: list[list[Any]]) -> dict[str, Any]:
    """What a client accumulates from recorded wire deltas (`[delta, finish]` or
    `[chunk, delta, finish]` rows): reasoning, content, each call's name and arguments, and the
    last finish reason."""
    reasoning, content = "", ""
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    finish = None
    for row in stream:
        delta, fr = row[-2], row[-1]
        finish = fr if fr is not None else finish
        if not delta:
            continue
        reasoning += delta.get("reasoning") or ""
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            if fn.get("name") is not None:
                names[call["index"]] = fn["name"]
            args[call["index"]] = args.get(call["index"], "") + (fn.get("arguments") or "")
    indexes = sorted(set(names) | set(args))
    calls = [[names.get(i, ""), args.get(i, "")] for i in indexes]
    return {"reasoning": reasoning, "content": content, "tool_calls": calls, "finish_reason": finish}


def batch_view(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        "reasoning": batch["reasoning"] or "",
        "content": batch["content"] or "",
        "tool_calls": [[call[0], call[1]] for call in batch["tool_calls"]],
        "finish_reason": batch["finish_reason"],
    }


def check_stream(
    ours: list[Any], vllm: list[Any], batch: dict[str, Any], cause: str | None, still_open: str | None = None
) -> str | None:
    """None when our stream is right for this golden, else why not: equal to vLLM's delta by
    delta, or, only where `cause` names why vLLM's stream does not accumulate to its batch
    answer, accumulating to that batch answer. `still_open` is the configuration's entry in
    `stream_vs_batch.NOT_ACCUMULATING` (another part of it does not accumulate yet: e.g. the
    tool parser behind a reasoning parser that now does), which waives the last check."""
    if ours == vllm:
        return None
    whole = batch_view(batch)
    if accumulate(vllm) == whole:
        return "vLLM's stream accumulates to its batch answer here: ours must equal it delta by delta"
    if cause is None:
        return "differs from vLLM's stream in a case not listed in tests/parsers/deliberate.py"
    if accumulate(ours) != whole and still_open is None:
        return f"{cause}: our stream must accumulate to the batch answer: {accumulate(ours)} != {whole}"
    return None
