"""Where we deliberately differ from vLLM 0.33 so that a stream accumulates to its batch answer.

Streams (`CASES`, `CONFIGS`, `E2E_CASES`): vLLM's streamed deltas do not accumulate to its own
batch answer there, ours do (the batch answer stays vLLM's, byte for byte). The golden tests
compare every streamed delta with vLLM's wherever vLLM's stream accumulates to its batch answer;
where it does not, the case must be named here (by golden case name, or by family and parser
configuration for the fuzzed family goldens) and our stream must accumulate to the batch golden.
A stream that differs from vLLM's anywhere else fails.

Batch answers (`BATCH_CASES`, `BATCH_CONFIGS`, `E2E_BATCH_CASES`; ACC.md rule 2): where vLLM's
batch decision depends on text that may come at the very end of the output and a stream could
only match it by holding the whole response, our batch follows the rule the stream keeps
instead. Such a batch golden must be named here; our batch answer must then be what our stream
accumulates to (`check_batch`). A batch answer that differs from vLLM's anywhere else fails.
"""

from __future__ import annotations

import re
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

# olmo3 tools hold calls too (`held_calls.LeadingCallsHolder`), but are listed by configuration
# (`CONFIGS`), not in `HELD_CALLS`: behind the olmo3 reasoning parser our stream sends reasoning
# before vLLM's buffered stream does, so it does not only hold back vLLM's stream (`lags_behind`).
OLMO3_TOOL_HELD = (
    "olmo3 tools: batch needs the whole tool phase (or its first <function_calls> block) to be one call list, "
    "else it is all content (vLLM's stream re-parses the text each chunk and streams calls batch may reject): "
    "a tool phase that opens with <function_calls> is held to the end of the stream, its calls arrive whole"
)
OLMO3_REASONING_TEXT = (
    "olmo3 reasoning: vLLM's stream buffers text around partial markers with chunk-dependent quirks (a <think> or "
    "</think> not at the start switches its mode, text after the last </think> of a chunk is content) and sends the "
    "whole output as content after a prompt spelling </think>; its batch splits at the first </think> (a leading "
    "<think> removed) whatever the prompt: ours streams the batch rule, holding back only a possible marker prefix"
)
DEEPSEEK_R1_THINK_TEXT = (
    "deepseek_r1 / deepseek_v3 (thinking on): vLLM's stream splits at the marker token ids with chunk-dependent "
    "quirks (a multi-token chunk holding <think> but not </think> streams its whole text, marker included), its "
    "batch at the marker text: ours splits at the marker text too, found across chunks by holding back only a "
    "possible marker prefix"
)

# Batch causes (ACC.md rule 2: our batch answer deliberately differs from vLLM's).
PROMPT_END_BATCH = (
    "deepseek_r1 / deepseek_v3 (thinking on): when the prompt closes reasoning, vLLM's stream sends the whole "
    "output as content but its batch still reads reasoning out of it up to a </think> that may come last "
    "(without one, all of it); and vLLM's batch drops the text before the first <think>, looked for anywhere "
    "(after </think> too). All are known only at the end, so our batch follows the stream's rule: content when "
    "the prompt closed reasoning, else reasoning up to the first </think> with the first <think> in it removed"
)

# Tool parsers whose calls arrive whole at the end of the stream (`parsers/held_calls.py`): their
# batch answer is all or nothing over the whole output, so the stream holds everything from the
# first call marker on and the batch extractor decides when the stream ends. Such a stream differs
# from vLLM's wherever there are calls, but only by holding back: where vLLM's stream accumulates
# to its batch answer ours must, at every chunk, be behind it (`lags_behind`); everywhere ours must
# accumulate to the batch answer.
HERMES_ALL_OR_NOTHING = (
    "hermes/qwen3_json: batch rejects every call when one region is malformed or unclosed, and dumps "
    "the arguments with json.dumps: calls are held to the end of the stream and arrive whole"
)
GRANITE4_ALL_OR_NOTHING = (
    "granite4: batch makes the whole text content when one block fails or never closes (vLLM's stream "
    "never flushes an unterminated block): calls are held to the end of the stream and arrive whole"
)
PYTHONIC_WHOLE_LIST = (
    "pythonic/llama4_pythonic: batch needs the whole tool phase to be one call list, else it is all "
    "content: a tool phase that starts a list is held to the end of the stream, its calls arrive whole"
)
DEEPSEEK_V3_HELD = (
    "deepseek_v3/deepseek_v31: batch matches calls by regex over the whole output (V3: one call whose type is "
    "not function makes it all content; content after the last calls-end marker is kept), vLLM's stream "
    "cuts a closing chunk's arguments at the last '\"}' and streams text after the calls: everything from "
    "the first call marker is held to the end of the stream, calls arrive whole"
)
K3_CHANNELS = (
    "Kimi K3: vLLM's stream re-reads the whole text each chunk and ends content at a "
    "`<|close|>response<|sep|>` that batch only removes (no opening one), keeps `<|close|>message<|sep|>` "
    "that batch removes, and without a tool parser strips the response wrapper that batch keeps when the "
    "request has tools: ours holds leading whitespace and a possible marker, and sends what batch keeps"
)
# Rule 2 (batch follows the stream): vLLM's batch looks for K3's channel markers anywhere in the
# output and re-reads it from there; a stream has sent the text before such a marker already.
K3_LATE_CHANNEL_BATCH = (
    "Kimi K3: a channel marker after text already streamed is read where the stream meets it: a response "
    "opener after content keeps the content before it (vLLM's batch keeps only the response body; with the "
    "reasoning parser in front it unwraps twice, so a second opener inside the body restarts it); inside "
    "reasoning that never closes it is reasoning text (vLLM's batch: all of the output content); a think "
    "opener after other text, or a think close after a leading response opener, is text (vLLM's batch "
    "starts or ends the reasoning there)"
)
_K3_THINK_OPEN = re.compile(r"<\|open\|>\s*think\s*<\|sep\|>")
_K3_THINK_CLOSE = re.compile(r"<\|close\|>\s*think\s*<\|sep\|>")
_K3_RESPONSE_OPEN = re.compile(r"<\|open\|>\s*response\s*<\|sep\|>")


def k3_late_channel(text: str, reads_reasoning: bool) -> bool:
    """Whether a K3 output has a channel marker after text (markers included, not whitespace)
    that vLLM's batch re-reads it from: where `K3_LATE_CHANNEL_BATCH` lets our batch answer
    differ. `reads_reasoning`: a reasoning parser runs with thinking on (its content starts after
    the first think close)."""
    think_open, close = _K3_THINK_OPEN.search(text), _K3_THINK_CLOSE.search(text)
    if reads_reasoning:
        if think_open is not None and text[: think_open.start()].strip():
            return True
        if close is not None and _K3_RESPONSE_OPEN.match(text.lstrip()):
            return True
    region = text[close.end() :] if reads_reasoning and close is not None else text
    openers = list(_K3_RESPONSE_OPEN.finditer(region))
    return bool(openers) and region[: openers[-1].start()].strip() != ""


LLAMA_JSON_WHOLE_LIST = (
    "llama3_json/llama4_json: batch rejects every call when one '{' does not start a valid call object, and "
    "dumps the arguments with json.dumps: a tool phase that starts a call list is held to the end of the "
    "stream, its calls arrive whole"
)
HUNYUAN_CALLS_HELD = (
    "hunyuan_a13b tools: batch takes the first <tool_calls> region outside a <think> span whose text loads as "
    "JSON and makes the whole text content unless it is a list with a valid call (vLLM's stream re-reads the "
    "text with regexes, keyed on a '[' right after the marker): calls are held to the end of the stream and "
    "arrive whole"
)
HY_V3_CALLS_HELD = (
    "hy_v3 tools: batch types each value once its region closes and keeps the last of two equal keys, vLLM's "
    "stream keeps the first and escapes partial strings its own way: everything from the <tool_calls> marker is "
    "held to the end of the stream, calls arrive whole"
)
ERNIE45_ALL_OR_NOTHING = (
    "ernie45 tools: batch rejects every call when one closed <tool_call> region does not load, and dumps the "
    "arguments with json.dumps (vLLM's stream sends each call when it closes, and strips newlines and the response "
    "wrapper chunk by chunk): calls are held to the end of the stream and arrive whole"
)
ERNIE45_BY_TEXT = (
    "ernie45 reasoning: vLLM's stream splits at the marker ids, drops single <response>/</response> tokens and strips "
    "newlines chunk by chunk, and without a tool parser never removes the response wrapper that batch removes: ours "
    "streams batch's pass over the whole output by text, holding back only a possible marker prefix, leading "
    "whitespace while <response> may open the content and the text after a </response> another may close"
)
# Rule 2: batch's <think> (looked for anywhere, the text before it dropped) and <response> ... </response>
# (a pair anywhere in the content; an unclosed <response> kept) decisions depend on text that may come last.
ERNIE45_BATCH = (
    "ernie45 reasoning: batch drops the text before the first <think> looked for anywhere, unwraps a "
    "<response>...</response> pair anywhere in the content and keeps an unclosed one, all known only at the end: ours "
    "removes a <think> only before </think> (keeping the text before it), and unwraps only content that opens "
    "with <response> (after whitespace), up to the last </response> (all of it when none comes)"
)
MINIMAX_M3_BY_TEXT = (
    "minimax_m3 reasoning: vLLM's stream re-reads the whole text every chunk and decides the reasoning end by "
    "token-id sequences: ours streams batch's pass over the output once, by text, holding back only a possible "
    "marker prefix"
)
# Rule 2: with thinking_mode enabled, a <mm:think> anywhere makes batch re-read the output from it.
MINIMAX_M3_BATCH = (
    "minimax_m3 reasoning (thinking_mode enabled): batch makes the text before a <mm:think> that may come last "
    "content (and a </mm:think> before it part of that content): ours is reasoning up to the first </mm:think>, "
    "a <mm:think> before it removed, as the stream sends it"
)
PHI4_MINI_HELD = (
    "phi4_mini_json: vLLM's stream sends nothing; its batch reads the first functools[ up to the first ']' as a "
    "JSON list and drops all other text: content streams up to the marker, the rest is held to the end of the "
    "stream, where the calls arrive whole (or the held text as content)"
)
XLAM_HELD = (
    "xlam: batch looks for code fences, [TOOL_CALLS], <tool_call> and </think> anywhere (or a whole output "
    "that starts with '['), strips the content and drops the blocks it read; vLLM's stream re-parses the text "
    "with chunk-dependent results: content streams up to the first marker (whitespace at either end held), "
    "the rest is held to the end of the stream, where the calls arrive whole"
)
INTERNLM_HELD = (
    "internlm: vLLM's stream re-dumps the partial JSON object after <|action_start|><|plugin|> and stops at a "
    "bare <|action_start|> (batch: content); its batch raises where the object does not load (ours: content): "
    "content streams up to the marker, the rest is held to the end of the stream, the call arrives whole"
)
JAMBA_HELD = (
    "jamba: vLLM's stream drops the text before <tool_calls> in the chunk that brings it and streams partial-JSON "
    "argument diffs; its batch makes the whole text content when the region does not load or never closes: "
    "content streams up to the marker, the rest is held to the end of the stream, the calls arrive whole"
)
HELD_CALLS: dict[str, str] = {
    "hunyuan_a13b": HUNYUAN_CALLS_HELD,
    "hy_v3": HY_V3_CALLS_HELD,
    "ernie45": ERNIE45_ALL_OR_NOTHING,
    "hermes": HERMES_ALL_OR_NOTHING,
    "qwen3_json": HERMES_ALL_OR_NOTHING,
    "granite4": GRANITE4_ALL_OR_NOTHING,
    "pythonic": PYTHONIC_WHOLE_LIST,
    "llama4_pythonic": PYTHONIC_WHOLE_LIST,
    "deepseek_v3": DEEPSEEK_V3_HELD,
    "deepseek_v31": DEEPSEEK_V3_HELD,
    "kimi_k3": K3_CHANNELS,
    "llama3_json": LLAMA_JSON_WHOLE_LIST,
    "llama4_json": LLAMA_JSON_WHOLE_LIST,
    "phi4_mini_json": PHI4_MINI_HELD,
    "xlam": XLAM_HELD,
    "internlm": INTERNLM_HELD,
    "jamba": JAMBA_HELD,
}
STEP3_TOOL_HELD = (
    "step3 tools: batch needs the calls block closed by <｜tool_calls_end｜> and one part that is a function call, "
    "else it is all content, and strips the content around the block: everything from <｜tool_calls_begin｜> is "
    "held to the end of the stream (and the content's trailing whitespace while it may precede calls), calls "
    "arrive whole"
)
HELD_CALLS["step3"] = STEP3_TOOL_HELD


def held(tool: str | None) -> str | None:
    """The held-calls cause of a tool parser name (None when its calls stream as vLLM's do)."""
    return HELD_CALLS.get(tool or "")


ENGINE_CALLS_WHOLE = (
    "engine tool parsers (Qwen3-Coder/XML, GLM 4.5/4.7, MiniMax M2, Seed-OSS, DeepSeek V3.2/V4/V4.1 DSML): batch converts each call's whole "
    "argument text once, strips the content's whitespace when a call is accepted and drops the text after the "
    "first tool event once a call is named: the stream sends each call whole once it is decided, and holds the "
    "content's trailing whitespace and the text after the first tool event until batch's decision is known"
)
# Rule 2 (batch follows the stream): whether batch strips the content's leading whitespace depends
# on a call that may come last, and holding it would delay the whole content.
ENGINE_LEADING_WS = (
    "engine tool parsers (Qwen3-Coder/XML, GLM 4.5/4.7, MiniMax M2, Seed-OSS, Granite): with a call, batch keeps the "
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
GRANITE_CALLS_WHOLE = (
    "granite tools (engine over a JSON array): batch converts each element's whole arguments once (argument types "
    "fixed, escapes decoded where a type changes), strips the content when a call is accepted, drops the text "
    "after the array and, behind the granite reasoning parser, returns the raw content when no call is accepted: "
    "the stream sends each call whole once its element closes (or the output ends), holds the content's trailing "
    "whitespace and the text after the array, and keeps the raw content until a call is accepted; with a call, "
    "batch keeps the content's leading whitespace (vLLM strips it), as the stream sends it before any call is known"
)
WHOLE_CALLS["granite"] = GRANITE_CALLS_WHOLE
KIMI_CALLS_WHOLE = (
    "kimi_k2 tools: batch reads each call whole (its header as Kimi's id and name, '{}' for a call without "
    "argument text, a call after a malformed header kept) and matches the markers by text: the stream sends "
    "each call whole once decided, with Kimi's native id, and matches the markers by text too"
)
WHOLE_CALLS["kimi_k2"] = KIMI_CALLS_WHOLE
GEMMA4_CALLS_WHOLE = (
    "gemma4 tools: batch converts each call's whole argument text once, matches the markers by text, strips "
    "the content's whitespace when a call is accepted, drops the text after the first tool event once a call "
    "is named, and opens the thought channel on a content that starts with thought\\n: the stream sends each "
    "call whole once decided, matches the markers by text and holds the content's start while it may still "
    "become thought\\n"
)
WHOLE_CALLS["gemma4"] = GEMMA4_CALLS_WHOLE
WHOLE_CALLS["step3p5"] = ENGINE_CALLS_WHOLE  # Qwen3-Coder's engine
MINIMAX_M3_CALLS_WHOLE = (
    "minimax_m3 tools (engine): batch converts each invoke's nested elements once it closes: the stream sends "
    "each call whole once decided (as vLLM's does) and holds the content's trailing whitespace and the text after "
    "the first tool event until batch's decision is known"
)
WHOLE_CALLS["minimax_m3"] = MINIMAX_M3_CALLS_WHOLE

# tool parser -> cause: our batch answer differs from vLLM's (only as `check_batch` allows). The
# DSML parsers do not strip content whitespace (their batch is vLLM's).
BATCH_TOOLS: dict[str, str] = {
    name: ENGINE_LEADING_WS for name in ("qwen3_coder", "qwen3_xml", "glm45", "glm47", "minimax_m2", "seed_oss")
}
BATCH_TOOLS["gemma4"] = ENGINE_LEADING_WS
BATCH_TOOLS["granite"] = ENGINE_LEADING_WS
BATCH_TOOLS["step3p5"] = ENGINE_LEADING_WS

MINIMAX_APPEND_THINK = (
    "minimax_m2_append_think: batch prepends <think> to the output and hands all of it to the tool parser "
    "whatever the prompt holds; the stream does too (vLLM's skips the prefix after a prompt that closed "
    "reasoning, and feeds the tool parser only after a </think> id)"
)

QWEN3_MARKERS_BY_TEXT = (
    "qwen3 reasoning: batch's engine has no token ids and matches <think>, </think>, <tool_call> and the special "
    "tokens it drops (<|im_end|>, <|endoftext|> with ignore_eos) by text, anywhere; vLLM's stream matches them by "
    "id (as text only before the first id) and keeps a dropped special token in the content: ours matches by "
    "text throughout and drops what batch drops, holding back only a possible marker prefix at a chunk end"
)

# test_parsers.py GOLDEN case -> cause
CASES: dict[str, str] = {
    "prompt_closed/one": QWEN3_CONTENT_AFTER_END,
    "ds_think/mixed": DEEPSEEK_R1_THINK_TEXT,
    "im_end_inside/one": QWEN3_MARKERS_BY_TEXT,
}

# test_parsers.py GOLDEN case -> cause, where our batch answer is not vLLM's
BATCH_CASES: dict[str, str] = {
    "ds_prompt_closed/one": PROMPT_END_BATCH,
}

HUNYUAN_MARKERS_TEXT = (
    "hunyuan_a13b reasoning: vLLM's stream walks Hunyuan's own token ids for '<think>\\n', "
    "'\\n</think>\\n<answer>\\n' and '\\n</answer>' (one token per chunk), its batch the marker text: ours "
    "matches the text in both, holding back only a possible marker prefix"
)
# Rule 2: whether vLLM's batch reads reasoning depends on an answer marker that may come last.
HUNYUAN_REASONING_BATCH = (
    "hunyuan_a13b reasoning: an output that opens with '<think>\\n' is reasoning up to the first answer marker "
    "even when no answer marker (or no '\\n</answer>' after it) follows (vLLM: content, up to a '\\n</answer>'), "
    "and a '<think>\\n' later in the output opens nothing (vLLM, without '\\n</answer>': drops the text before it)"
)

# (family golden file, "reasoning+tool") -> cause, for golden_families/*.jsonl
CONFIGS: dict[tuple[str, str], str] = {
    ("hunyuan_a13b", "hunyuan_a13b+hunyuan_a13b"): HUNYUAN_MARKERS_TEXT,
    ("hunyuan_a13b", "hunyuan_a13b+None"): HUNYUAN_MARKERS_TEXT,
    **{("hy", f"{r}+{t}"): DEEPSEEK_R1_THINK_TEXT for r in ("hy_v3", "hy_v4") for t in ("hy_v3", "None")},
    ("kimi_k3", "kimi_k3+None"): K3_CHANNELS,
    ("deepseek_v32", "deepseek_r1+deepseek_v32"): DEEPSEEK_R1_THINK_TEXT,
    ("deepseek_v32", "deepseek_v3+deepseek_v32"): DEEPSEEK_R1_THINK_TEXT,
    ("deepseek_v4", "deepseek_r1+deepseek_v4"): DEEPSEEK_R1_THINK_TEXT,
    ("deepseek_v41", "deepseek_r1+deepseek_v41"): DEEPSEEK_R1_THINK_TEXT,
    ("qwen3_coder", "deepseek_r1+qwen3_coder"): DEEPSEEK_R1_THINK_TEXT,
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
    ("olmo3", "olmo3+None"): OLMO3_REASONING_TEXT,
    ("olmo3", "olmo3+olmo3"): OLMO3_REASONING_TEXT + "; " + OLMO3_TOOL_HELD,
    ("olmo3", "None+olmo3"): OLMO3_TOOL_HELD,
    ("step3p5", "step3p5+None"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("step3p5", "step3p5+hermes"): ENGINE_REASONING_WHOLE_OUTPUT,
    ("ernie45", "ernie45+None"): ERNIE45_BY_TEXT,
    ("ernie45", "ernie45+ernie45"): ERNIE45_BY_TEXT,
    ("ernie45", "None+ernie45"): ERNIE45_ALL_OR_NOTHING,
    ("minimax_m3", "minimax_m3+None"): MINIMAX_M3_BY_TEXT,
    ("minimax_m3", "minimax_m3+minimax_m3"): MINIMAX_M3_BY_TEXT,
}


# Rule 2 (batch follows the stream): vLLM's batch opens Gemma 4's thought channel on a <channel|>
# anywhere in the output (and ignores the prompt), which a stream could only meet by holding it all.
GEMMA4_CHANNEL_BATCH = (
    "gemma4: batch opens the thought channel as the stream does (with the prompt: the prompt ends inside an open "
    "<|channel>, or the output starts with thought\\n or is thought; the tool parser alone, which never sees the "
    "prompt: the output's start, always); vLLM's batch opens it on a <channel|> anywhere in the output unless a "
    "<|channel> is, and ignores the prompt"
)

# Rule 2: with calls, vLLM's step3 batch strips the content's leading whitespace; the stream sent it
# before any call was known (holding it would delay the whole content), so our batch keeps it.
STEP3_TOOL_LEADING_WS = (
    "step3 tools: with calls, batch keeps the leading whitespace of content that has other text before the "
    "calls block (vLLM strips it), as the stream sends it before any call is known"
)
# Rule 2 (Olmo 3): whether vLLM's batch has reasoning, or calls, depends on text that may come last.
OLMO3_NO_THINK_END = (
    "olmo3 reasoning: without </think> batch is all reasoning, as the stream sends it (vLLM's batch: all content)"
)
OLMO3_CALLS_FIRST = (
    "olmo3 tools: a tool phase that does not open with <function_calls> (after whitespace) is content in batch too, "
    "as the stream sends it (vLLM's batch also reads bare call lines, or a tag pair later in the text, dropping "
    "the text around it)"
)
OLMO3_BATCH = OLMO3_NO_THINK_END + "; " + OLMO3_CALLS_FIRST
# (family golden file, "reasoning+tool") -> cause, where a record's batch answer may not be vLLM's
# Rule 2: vLLM's phi4_mini_json batch drops the content before functools[ (even when the list does
# not load), which only the end of the output decides; the stream has sent it by then.
PHI4_MINI_CONTENT_KEPT = (
    "phi4_mini_json: when functools[ is found, non-blank content before it stays content in batch too "
    "(vLLM's batch drops it: content None)"
)
# (family golden file, "reasoning+tool") -> cause, where a record's batch answer may not be vLLM's
XLAM_LEADING_WS = (
    "xlam: when batch strips the content around the blocks it read, the content's leading whitespace stays "
    "(the stream sent it before any marker; vLLM strips it)"
)
BATCH_CONFIGS: dict[tuple[str, str], str] = {
    ("hunyuan_a13b", "hunyuan_a13b+hunyuan_a13b"): HUNYUAN_REASONING_BATCH,
    ("hunyuan_a13b", "hunyuan_a13b+None"): HUNYUAN_REASONING_BATCH,
    **{("hy", f"{r}+{t}"): PROMPT_END_BATCH for r in ("hy_v3", "hy_v4") for t in ("hy_v3", "None")},
    ("step3_tool", "step3+step3"): STEP3_TOOL_LEADING_WS,
    ("step3_tool", "None+step3"): STEP3_TOOL_LEADING_WS,
    ("olmo3", "olmo3+None"): OLMO3_NO_THINK_END,
    ("olmo3", "olmo3+olmo3"): OLMO3_BATCH,
    ("olmo3", "None+olmo3"): OLMO3_CALLS_FIRST,
    ("phi4_mini_json", "None+phi4_mini_json"): PHI4_MINI_CONTENT_KEPT,
    ("xlam", "None+xlam"): XLAM_LEADING_WS,
    ("xlam", "qwen3+xlam"): XLAM_LEADING_WS,
    ("deepseek_v32", "deepseek_r1+deepseek_v32"): PROMPT_END_BATCH,
    ("deepseek_v32", "deepseek_v3+deepseek_v32"): PROMPT_END_BATCH,
    ("deepseek_v4", "deepseek_r1+deepseek_v4"): PROMPT_END_BATCH,
    ("deepseek_v41", "deepseek_r1+deepseek_v41"): PROMPT_END_BATCH,
    ("qwen3_coder", "deepseek_r1+qwen3_coder"): PROMPT_END_BATCH,
    ("kimi_k3", "None+kimi_k3"): K3_LATE_CHANNEL_BATCH,
    ("kimi_k3", "kimi_k3+None"): K3_LATE_CHANNEL_BATCH,
    ("kimi_k3", "kimi_k3+kimi_k3"): K3_LATE_CHANNEL_BATCH,
    ("gemma4", "gemma4+None"): GEMMA4_CHANNEL_BATCH,
    ("gemma4", "gemma4+gemma4"): GEMMA4_CHANNEL_BATCH,
    ("gemma4", "gemma4+hermes"): GEMMA4_CHANNEL_BATCH,
    ("gemma4", "None+gemma4"): GEMMA4_CHANNEL_BATCH,
    ("ernie45", "ernie45+None"): ERNIE45_BATCH,
    ("ernie45", "ernie45+ernie45"): ERNIE45_BATCH,
    ("minimax_m3", "minimax_m3+None"): MINIMAX_M3_BATCH,
    ("minimax_m3", "minimax_m3+minimax_m3"): MINIMAX_M3_BATCH,
}


def check_batch(
    ours: dict[str, Any], vllm: dict[str, Any], ours_stream: list[Any], cause: str | None, still_open: str | None = None
) -> str | None:
    """None when our batch answer is right for this golden: vLLM's, or, only where `cause`
    names why we deliberately follow the stream's rule instead, what our stream accumulates to
    (`ours_stream`: recorded-shape rows). `still_open` (the configuration's entry in
    `stream_vs_batch.NOT_ACCUMULATING`: e.g. its tool parser's stream does not accumulate yet)
    waives the last check."""
    if ours == vllm:
        return None
    if cause is None:
        return "batch answer differs from vLLM's in a case not listed in tests/parsers/deliberate.py"
    if accumulate(ours_stream) != batch_view(ours) and still_open is None:
        return f"{cause}: our batch answer must be what our stream accumulates to: {accumulate(ours_stream)} != {batch_view(ours)}"
    return None


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


def _rows(stream: list[list[Any]]) -> list[tuple[int, Any]]:
    """(chunk index, delta) of recorded rows: `[chunk, delta, finish]` rows name their chunk,
    `[delta, finish]` rows are one per chunk."""
    return [(row[0] if len(row) == 3 else n, row[-2]) for n, row in enumerate(stream)]


def lags_behind(ours: list[list[Any]], vllm: list[list[Any]]) -> str | None:
    """None when, after every chunk, what a client has from our stream is a prefix of what it has
    from vLLM's (reasoning, content, each call's arguments; a call's name, once ours has it, is
    vLLM's): a stream that only holds back. Else the first chunk where ours is ahead or differs."""
    ours_rows, vllm_rows = _rows(ours), _rows(vllm)
    chunks = sorted({c for c, _ in ours_rows} | {c for c, _ in vllm_rows})
    for chunk in chunks:
        mine = accumulate([[d, None] for c, d in ours_rows if c <= chunk])
        theirs = accumulate([[d, None] for c, d in vllm_rows if c <= chunk])
        problem = _ahead(mine, theirs)
        if problem:
            return f"chunk {chunk}: {problem}"
    return None


def _ahead(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    for field in ("reasoning", "content"):
        if not theirs[field].startswith(mine[field]):
            return f"{field} {mine[field]!r} is not a prefix of vLLM's {theirs[field]!r}"
    if len(mine["tool_calls"]) > len(theirs["tool_calls"]):
        return f"more calls than vLLM's: {mine['tool_calls']} / {theirs['tool_calls']}"
    for (name, args), (their_name, their_args) in zip(mine["tool_calls"], theirs["tool_calls"], strict=False):
        if (name and name != their_name) or not their_args.startswith(args):
            return f"call {[name, args]} is not behind vLLM's {[their_name, their_args]}"
    return None


def batch_view(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        "reasoning": batch["reasoning"] or "",
        "content": batch["content"] or "",
        "tool_calls": [[call[0], call[1]] for call in batch["tool_calls"]],
        "finish_reason": batch["finish_reason"],
    }


def check_stream(
    ours: list[Any],
    vllm: list[Any],
    batch: dict[str, Any],
    cause: str | None,
    still_open: str | None = None,
    held_calls: str | None = None,
) -> str | None:
    """None when our stream is right for this golden, else why not: equal to vLLM's delta by
    delta, or, only where `cause` names why vLLM's stream does not accumulate to its batch
    answer, accumulating to that batch answer (where vLLM's does too, the deltas may be chunked
    differently: a listed cause may hold back a possible marker prefix). `still_open` is the configuration's entry in
    `stream_vs_batch.NOT_ACCUMULATING` (another part of it does not accumulate yet: e.g. the
    tool parser behind a reasoning parser that now does), which waives the last check.
    `held_calls` is the `HELD_CALLS` cause of the configuration's tool parser: ours then differs
    from vLLM's by holding back (`lags_behind` wherever vLLM's accumulates) and accumulates."""
    if ours == vllm:
        return None
    whole = batch_view(batch)
    if held_calls is not None:
        if accumulate(ours) != whole and still_open is None:
            return f"{held_calls}: our stream must accumulate to the batch answer: {accumulate(ours)} != {whole}"
        if accumulate(vllm) == whole:
            lag = lags_behind(ours, vllm)
            return None if lag is None else f"{held_calls}: ours must only hold back vLLM's stream: {lag}"
        return None
    if accumulate(vllm) == whole:
        if cause is not None and accumulate(ours) == whole:
            # A listed cause that holds back a possible marker prefix at a chunk end: the same
            # answer, some text one chunk later.
            return None
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


def check_batch_tool(ours: dict[str, Any], vllm: dict[str, Any], cause: str | None) -> str | None:
    """None when our batch answer is vLLM's, or differs from it only as the tool parser's `cause`
    (`BATCH_TOOLS`) allows: the content's leading whitespace kept (`ENGINE_LEADING_WS`), everything
    else equal."""
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
    **{
        f"{family}_{case}_streamr": DEEPSEEK_R1_THINK_TEXT
        for family in ("v3", "v31", "v32")
        for case in ("calls_think", "length_in_call")
    },
    "kimi_history_calls_stream1": ENGINE_REASONING_WHOLE_OUTPUT,
    "kimi_history_calls_streamr": ENGINE_REASONING_WHOLE_OUTPUT,
    # `<think>` / `</think>` spelled by ordinary tokens: matched by text, as vLLM's batch twin does
    "split_think_text_stream1": QWEN3_MARKERS_BY_TEXT,
    "split_think_text_streamr": QWEN3_MARKERS_BY_TEXT,
}


# stream golden case -> why its tool calls still do not accumulate (a tool-side entry of
# `stream_vs_batch.NOT_ACCUMULATING`): only its reasoning must accumulate to the batch twin
E2E_TOOLS_STILL_OPEN: dict[str, str] = {}


# batch golden case (tests/parity golden_derender) -> cause, where our batch message follows
# the stream's rule: it must then be what vLLM's `<name>_stream1` twin accumulates to
E2E_BATCH_CASES: dict[str, str] = {
    "deepseek_thinking_disabled_batch": PROMPT_END_BATCH,
}

# Rule 2 (batch follows the stream): vLLM's llama3_json batch makes calls of the JSON objects
# anywhere in the text and drops the text before them; which is known only at the end of the
# output, and holding would delay the whole content. vLLM's stream reads a call list only where
# the text starts with <|python_tag|> or "{": so does our batch.
LLAMA_JSON_CONTENT_FIRST = (
    "llama3_json/llama4_json: a tool phase that does not start with <|python_tag|> or '{' is content in "
    "batch too (vLLM's batch drops the text before the first '{' and reads the objects after it as calls)"
)
E2E_BATCH_CASES.update(
    {
        f"p_{family}_{case}_batch": LLAMA_JSON_CONTENT_FIRST
        for family in ("llama3_json", "llama4_json")
        for case in ("content_then_call", "required_json")
    }
)
E2E_BATCH_CASES["p_llama4_json_python_start_batch"] = LLAMA_JSON_CONTENT_FIRST


def stream_twin(case: str) -> str:
    """`x_batch` -> `x_stream1`."""
    return case.rsplit("_batch", 1)[0] + "_stream1"


def batch_twin(case: str) -> str:
    """`x_stream1` / `x_streamr` -> `x_batch`."""
    return case.rsplit("_stream", 1)[0] + "_batch"


def batch_request_from_stream(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch /derender request of a recorded stream (its `json` bodies): every choice's token
    ids joined, its last finish and stop reason. For a stream golden recorded without a `_batch`
    twin, our batch answer on the same output is what our stream must accumulate to (our batch
    answers are vLLM's wherever a batch golden checks them)."""
    first = requests[0]
    choices: dict[int, dict[str, Any]] = {}
    for body in requests:
        for choice in (body.get("generate_chunk") or {}).get("choices") or ():
            merged = choices.setdefault(
                choice.get("index", 0),
                {"index": choice.get("index", 0), "finish_reason": None, "stop_reason": None, "token_ids": []},
            )
            merged["token_ids"] = merged["token_ids"] + list(choice.get("token_ids") or ())
            if choice.get("finish_reason") is not None:
                merged["finish_reason"] = choice["finish_reason"]
                merged["stop_reason"] = choice.get("stop_reason")
    chat = {k: v for k, v in first["chat_request"].items() if k not in ("stream", "stream_options")}
    return {
        "model": first["model"],
        "generate_response": {
            "request_id": first["generate_chunk"]["request_id"],
            "model": first["model"],
            "output_mode": "tokens",
            "choices": [choices[i] for i in sorted(choices)],
        },
        "prompt_tokens": first.get("prompt_tokens"),
        "prompt_token_ids": first.get("prompt_token_ids"),
        "chat_request": chat,
    }


def accumulate_chunks(bodies: list[Any]) -> dict[str, Any]:
    """What a client accumulates from /derender stream responses (choice 0)."""
    rows: list[list[Any]] = []
    for body in bodies:
        chunk = body.get("chunk") if isinstance(body, dict) else None
        for choice in (chunk or {}).get("choices") or ():
            if choice.get("index", 0) == 0:
                rows.append([choice.get("delta"), choice.get("finish_reason")])
    return accumulate(rows)


def message_view(response: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """A batch /derender response (choice `index`) in `accumulate`'s shape."""
    choice = next(c for c in response["choices"] if c.get("index", 0) == index)
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
    mine = accumulate_chunks(ours)
    if case in E2E_TOOLS_STILL_OPEN:  # only the reasoning side is ours to check here
        mine, whole = {"reasoning": mine["reasoning"]}, {"reasoning": whole["reasoning"]}
    if mine != whole:
        return f"{cause}: our stream must accumulate to the batch answer: {mine} != {whole}"
    return None


# -- Nemotron V3 end to end (tests/parity golden_parsers, test_parsers_llama_parity.py) -------------

NEMOTRON_WHOLE_OUTPUT = (
    "nemotron_v3: the stream is batch's pass over the whole output (markers by text: a </think> spelled by "
    "ordinary tokens ends reasoning as in batch; the reasoning's trailing whitespace held, dropped at the end)"
)
NEMOTRON_FORCE = (
    "nemotron_v3 with force_nonempty_content / enable_thinking=false, blank content at the end: vLLM's batch "
    "swaps reasoning and content; the stream has sent the reasoning by then, so ours keeps it as reasoning and "
    "also sends it as content in the last delta, and our batch answers the same (ACC.md rule 2)"
)
# stream golden case -> cause: ours accumulates to our batch answer on the same output (vLLM's
# stream does not accumulate to its batch twin there)
E2E_PARSER_CASES: dict[str, str] = {
    "p_nemotron_v3_split_end_stream1": NEMOTRON_WHOLE_OUTPUT,
    "p_nemotron_v3_split_end_streamr": NEMOTRON_WHOLE_OUTPUT,
    "p_nemotron_v3_force_nonempty_stream1": NEMOTRON_FORCE,
    "p_nemotron_v3_force_nonempty_streamr": NEMOTRON_FORCE,
}
# batch golden case -> cause, where our batch answer is not vLLM's: it must be what our stream of the
# `<name>_stream1` twin accumulates to
E2E_PARSER_BATCH_CASES: dict[str, str] = {
    "p_nemotron_v3_force_nonempty_batch": NEMOTRON_FORCE,
}


def check_e2e_parser_stream(
    cause: str, ours: list[Any], vllm: list[Any], vllm_batch: dict[str, Any] | None, our_batch: dict[str, Any]
) -> str | None:
    """A listed stream golden (`E2E_PARSER_CASES`): vLLM's stream does not add up to its batch
    twin, ours adds up to our batch answer on the same output."""
    if vllm_batch is not None and accumulate_chunks(vllm) == message_view(vllm_batch):
        return "vLLM's stream accumulates to its batch answer here: ours must equal it chunk by chunk"
    mine, whole = accumulate_chunks(ours), message_view(our_batch)
    if mine != whole:
        return f"{cause}: our stream must accumulate to our batch answer: {mine} != {whole}"
    return None


def check_e2e_parser_batch(cause: str, ours: dict[str, Any], our_stream: list[Any]) -> str | None:
    """A listed batch golden (`E2E_PARSER_BATCH_CASES`): our answer is what our stream adds up to."""
    mine, streamed = message_view(ours), accumulate_chunks(our_stream)
    if mine != streamed:
        return f"{cause}: our batch answer must be what our stream accumulates to: {mine} != {streamed}"
    return None


# -- held calls end to end (`HELD_CALLS`) -----------------------------------------------------------

# What a held-calls stream may answer differently from vLLM's, chunk by chunk: the deltas it holds
# back, the finish reason (vLLM's says tool_calls after calls it streamed that batch rejects), and
# the stream state's record of the calls streamed so far (they go out at the end).
_HELD_E2E_DIFF = re.compile(
    r"\$\.(chunk\.choices\[\d+\]\.(delta\.(content|tool_calls)|finish_reason)"
    r"|stream_state\.(tools_streamed|last_tool_call_ids))\b"
)


def not_held_diffs(diffs: list[str]) -> list[str]:
    """The differences (`compare_call` lines) a held-calls stream may not have."""
    return [d for d in diffs if not _HELD_E2E_DIFF.match(d.strip())]


def _choice_rows(bodies: list[Any], index: int) -> list[list[Any]]:
    """`[call, delta, finish]` rows of choice `index` in /derender stream responses."""
    rows: list[list[Any]] = []
    for n, body in enumerate(bodies):
        chunk = body.get("chunk") if isinstance(body, dict) else None
        for choice in (chunk or {}).get("choices") or ():
            if choice.get("index", 0) == index:
                rows.append([n, choice.get("delta"), choice.get("finish_reason")])
    return rows


def check_e2e_held(cause: str, ours: list[Any], vllm: list[Any], batch_response: dict[str, Any] | None) -> str | None:
    """A held-calls /derender stream golden (its other fields equal vLLM's): per choice, ours
    only holds back vLLM's stream and accumulates to the batch twin (to vLLM's stream where no
    twin was recorded); where vLLM's stream does not accumulate to the twin, ours must."""
    indexes: set[int] = set()
    for body in [*ours, *vllm]:
        chunk = body.get("chunk") if isinstance(body, dict) else None
        indexes |= {c.get("index", 0) for c in (chunk or {}).get("choices") or ()}
    for index in sorted(indexes):
        mine, theirs = _choice_rows(ours, index), _choice_rows(vllm, index)
        whole = message_view(batch_response, index) if batch_response is not None else None
        if whole is not None and accumulate(theirs) != whole:
            if accumulate(mine) != whole:
                return f"{cause}: choice {index} must accumulate to the batch answer: {accumulate(mine)} != {whole}"
            continue
        lag = lags_behind(mine, theirs)
        if lag is not None:
            return f"{cause}: choice {index} must only hold back vLLM's stream: {lag}"
        target = whole if whole is not None else accumulate(theirs)
        if whole is None and target["tool_calls"] and not target["content"].strip():
            target["content"] = ""  # no twin: batch drops blank content when there are calls
        if accumulate(mine) != target:
            return f"{cause}: choice {index} must accumulate to {target}: {accumulate(mine)}"
    return None


def check_e2e_held_call(
    cause: str, ours: dict[str, Any], vllm: dict[str, Any], batch_response: dict[str, Any] | None
) -> str | None:
    """One /derender stream call of a held-calls config, continued from vLLM's state: per choice,
    our delta holds back vLLM's, or (the stream's last chunk) carries the batch twin's calls whole."""
    for index in sorted({c.get("index", 0) for c in (vllm.get("chunk") or {}).get("choices") or ()}):
        mine, theirs = _choice_rows([ours], index), _choice_rows([vllm], index)
        if lags_behind(mine, theirs) is None:
            continue
        finished = any(row[2] is not None for row in theirs)
        if finished and batch_response is not None:
            if accumulate(mine)["tool_calls"] == message_view(batch_response, index)["tool_calls"]:
                continue
        return f"{cause}: choice {index}: {mine} neither holds back vLLM's {theirs} nor ends with the batch calls"
    return None


# -- granite reasoning (parsers/granite_reasoning.py) ------------------------------------------------

GRANITE_THOUGHT = (
    "granite reasoning: vLLM's stream reads reasoning only from a thought-process marker at the very start, "
    "never ends reasoning (so the tool parser never runs) and drops the character before the response "
    "marker; its batch finds both markers anywhere. Ours streams reasoning from a thought marker at the "
    "start to the first response marker, then hands the rest to the tool parser (content from the start "
    "when there is no thought marker), holding only a possible marker prefix"
)
# Rule 2: whether batch has reasoning depends on a response marker that may come last, and
# holding would delay the whole reasoning: without one, ours keeps the reasoning (vLLM: content).
GRANITE_THOUGHT_BATCH = (
    "granite reasoning: a thought marker at the start with no response marker is reasoning in batch too (vLLM: "
    "all content); markers not at the start are content (vLLM: reasoning between them)"
)
E2E_CASES.update(
    {
        f"p_granite_{case}": GRANITE_THOUGHT
        for case in (
            *("named_json_stream1", "named_json_streamr", "named_native_stream1", "parallel_false_stream1"),
            *("reasoning_heres_streamr", "reasoning_split_streamr", "reasoning_streamr"),
            *("reasoning_tool_stream1", "reasoning_tool_streamr"),
            *("reasoning_unfinished_stream1", "reasoning_unfinished_streamr"),
            *("required_json_stream1", "required_json_streamr", "required_native_stream1"),
            *("tool_length_stream1", "tool_length_streamr", "tool_malformed_stream1", "tool_malformed_streamr"),
            *("tool_string_stream1", "tool_string_streamr", "tool_then_content_stream1", "tool_then_content_streamr"),
            *("tool_token_stream1", "tool_token_streamr"),
        )
    }
)
E2E_BATCH_CASES["p_granite_reasoning_unfinished_batch"] = GRANITE_THOUGHT_BATCH
