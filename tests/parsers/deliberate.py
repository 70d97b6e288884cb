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
ENGINE_REASONING_WHOLE_OUTPUT = (
    "engine reasoning parsers (GLM, MiniMax M2, Seed-OSS, Kimi K2, DeepSeek V4, Gemma 4): batch runs the "
    "engine over the whole output, ignoring a prompt that closes reasoning unless the tokenizer has turn "
    "boundaries, and matching markers after reasoning by text (a stray end marker leaves the content)"
)
STEP3_PROMPT_IGNORED = (
    "step3: batch is reasoning until </think> whatever the prompt holds: the stream ignores a prompt "
    "that closes reasoning too (vLLM's stream sends the whole output as content there)"
)

ENGINE_CALLS_WHOLE = (
    "engine tool parsers (Qwen3-Coder/XML, GLM 4.5/4.7, MiniMax M2, Seed-OSS, DeepSeek V3.2/V4/V4.1 DSML): batch converts each call's whole "
    "argument text once, strips the content's whitespace when a call is accepted and drops the text after the "
    "first tool event once a call is named: the stream sends each call whole once it is decided, and holds the "
    "content's trailing whitespace and the text after the first tool event until batch's decision is known"
)
# Rule 2 (batch follows the stream): whether batch strips the content's leading whitespace depends
# on a call that may come last, and holding it would delay the whole content.
ENGINE_LEADING_WS = (
    "engine tool parsers (Qwen3-Coder/XML, GLM 4.5/4.7, MiniMax M2, Seed-OSS): with a call, batch keeps the "
    "content's leading whitespace (vLLM strips it), as the stream sends it before any call is known"
)

# tool parser -> cause: streams of these parsers regroup vLLM's deltas (calls whole, whitespace
# and text after calls held) wherever a call may follow, so they are checked by what they
# accumulate to (our batch answer), not delta by delta.
WHOLE_CALLS: dict[str, str] = {
    name: ENGINE_CALLS_WHOLE
    for name in (
        *("qwen3_coder", "qwen3_xml", "glm45", "glm47", "minimax_m2", "seed_oss"),
        *("deepseek_v32", "deepseek_v4", "deepseek_v41"),
    )
}
# tool parser -> cause: our batch answer differs from vLLM's (only as `check_batch` allows). The
# DSML parsers do not strip content whitespace (their batch is vLLM's).
BATCH_TOOLS: dict[str, str] = {
    name: ENGINE_LEADING_WS for name in ("qwen3_coder", "qwen3_xml", "glm45", "glm47", "minimax_m2", "seed_oss")
}

MINIMAX_APPEND_THINK = (
    "minimax_m2_append_think: batch prepends <think> to the output and hands all of it to the tool parser "
    "whatever the prompt holds; the stream does too (vLLM's skips the prefix after a prompt that closed "
    "reasoning, and feeds the tool parser only after a </think> id)"
)

# test_parsers.py GOLDEN case -> cause
CASES: dict[str, str] = {
    "prompt_closed/one": QWEN3_CONTENT_AFTER_END,
}

# (family golden file, "reasoning+tool") -> cause, for golden_families/*.jsonl
CONFIGS: dict[tuple[str, str], str] = {
    ("deepseek_v4", "deepseek_v4+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("deepseek_v4", "deepseek_v4+deepseek_v4"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("deepseek_v41", "deepseek_v41+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("deepseek_v41", "deepseek_v41+deepseek_v41"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("gemma4", "gemma4+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("gemma4", "gemma4+hermes"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("glm", "glm45+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("minimax_m2", "minimax_m2+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("minimax_m2", "minimax_m2_append_think+None"): MINIMAX_APPEND_THINK,
    ("minimax_m2", "minimax_m2_append_think+minimax_m2"): MINIMAX_APPEND_THINK,
    ("minimax_m2", "minimax_m2+hermes"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("minimax_m2", "minimax_m2+minimax_m2"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("seed_oss", "seed_oss+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("seed_oss", "seed_oss+hermes"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("step3", "step3+None"): STEP3_PROMPT_IGNORED,
    ("step3", "step3+hermes"): STEP3_PROMPT_IGNORED,
    ("step3", "step3+qwen3_coder"): STEP3_PROMPT_IGNORED,
}


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


def check_whole(ours: list[Any], batch: dict[str, Any]) -> str | None:
    """For a `WHOLE_CALLS` stream: None when it accumulates to our batch answer `batch`."""
    if accumulate(ours) == batch_view(batch):
        return None
    return f"{ENGINE_CALLS_WHOLE}: our stream must accumulate to the batch answer: {accumulate(ours)} != {batch_view(batch)}"


def check_batch(ours: dict[str, Any], vllm: dict[str, Any], cause: str | None) -> str | None:
    """None when our batch answer is vLLM's, or differs from it only as `cause` allows: the
    content's leading whitespace kept (`ENGINE_LEADING_WS`), everything else equal."""
    if ours == vllm:
        return None
    if cause == ENGINE_LEADING_WS:
        mine, theirs = ours.get("content") or "", vllm.get("content") or ""
        if mine != theirs and mine.lstrip() == theirs and {**ours, "content": None} == {**vllm, "content": None}:
            return None
    return "batch differs from vLLM's" + (f" beyond the deliberate difference ({cause})" if cause else "")


# -- end-to-end goldens (tests/parity): /derender streams against their `_batch` twin ----------------

# stream golden case -> cause (its `<name>_batch` golden is the batch answer)
E2E_CASES: dict[str, str] = {
    "kimi_history_calls_stream1": ENGINE_REASONING_WHOLE_OUTPUT,
    "kimi_history_calls_streamr": ENGINE_REASONING_WHOLE_OUTPUT,
}


def batch_twin(case: str) -> str:
    """`x_stream1` / `x_streamr` -> `x_batch`."""
    return case.rsplit("_stream", 1)[0] + "_batch"


def accumulate_chunks(bodies: list[Any]) -> dict[str, Any]:
    """What a client accumulates from /derender stream responses (choice 0)."""
    rows: list[list[Any]] = []
    for body in bodies:
        chunk = body.get("chunk") if isinstance(body, dict) else None
        for choice in (chunk or {}).get("choices") or ():
            if choice.get("index", 0) == 0:
                rows.append([choice.get("delta"), choice.get("finish_reason")])
    return accumulate(rows)


def message_view(response: dict[str, Any]) -> dict[str, Any]:
    """A batch /derender response (choice 0) in `accumulate`'s shape."""
    choice = response["choices"][0]
    message = choice["message"]
    calls = [[c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls") or ()]
    return {
        "reasoning": message.get("reasoning") or "",
        "content": message.get("content") or "",
        "tool_calls": calls,
        "finish_reason": choice["finish_reason"],
    }


def check_e2e_stream(
    case: str, ours: list[Any], vllm: list[Any], batch_response: dict[str, Any] | None, tool_parser: str | None = None
) -> str | None:
    """For a stream golden whose responses differ from ours: None when the difference is a
    listed deliberate one (vLLM's stream does not accumulate to its batch twin, ours does), or
    the stream's tool parser sends calls whole (`WHOLE_CALLS`) and ours accumulates to the twin."""
    if tool_parser in WHOLE_CALLS:
        # Each field adds up to vLLM's stream or to the batch twin (the reasoning side may still
        # reproduce vLLM's stream, see stream_vs_batch.NOT_ACCUMULATING); the calls to the twin.
        mine, theirs = accumulate_chunks(ours), accumulate_chunks(vllm)
        whole = message_view(batch_response) if batch_response is not None else theirs
        bad = [f for f in mine if mine[f] != theirs[f] and mine[f] != whole[f]]
        if mine["tool_calls"] != whole["tool_calls"]:
            bad.append("tool_calls")
        if not bad:
            return None
        return f"{WHOLE_CALLS[tool_parser]}: {bad}: {mine} != {whole}"
    cause = E2E_CASES.get(case)
    if cause is None or batch_response is None:
        return "differs from vLLM's stream in a case not listed in tests/parsers/deliberate.py E2E_CASES"
    whole = message_view(batch_response)
    if accumulate_chunks(vllm) == whole:
        return "vLLM's stream accumulates to its batch answer here: ours must equal it chunk by chunk"
    if accumulate_chunks(ours) != whole:
        return f"{cause}: our stream must accumulate to the batch answer: {accumulate_chunks(ours)} != {whole}"
    return None
