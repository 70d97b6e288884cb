"""Raw content: an engine tool parser behind a reasoning parser that is not engine-based.

vLLM 0.33 composes such a pair (`deepseek_r1`/`deepseek_v3`/`step3`/`minimax_m2_append_think` in
front of `qwen3_coder`, `minimax_m2`, `deepseek_v32`, `deepseek_v4`, ...) without its engine path:
batch runs the tool parser's `extract_tool_calls` on the reasoning parser's content, and when no
call is accepted it returns that content raw (call markup, stray reasoning markers and the text
between them kept); with a call, the tool parser's parsed content (markup and the reasoning it
read out of the content dropped). vLLM's stream runs the engine either way: it drops the markup,
streams reasoning markers found in the content as reasoning, and so does not add up to the batch
answer when no call is accepted.

Ours accumulates to the batch answer (issue 16, ACC.md rule 1). The engine tool parser runs as
before (it sends each call whole once accepted: `EngineToolParser.calls_whole`); beside it this
shadow keeps the raw text the tool parser was fed and the engine's content, each from where the
two were last equal, and forwards only their common prefix (the content both answers share). The
first accepted call decides for the engine (its pending content and the call go out, the raw text
is dropped); the end of the stream without one decides for the raw text. The engine's reasoning
is never forwarded (batch has none from the tool parser). Once the two differ, both are held to
that decision; they live in `HeldText` fields (append-only, stored beside a snapshot), so a chunk
costs O(new text) however much is held.
"""

from __future__ import annotations

import msgspec

from render_service.parsers.base import Delta
from render_service.parsers.held import HeldText

STATE_TAG = "raw_content/1"


class RawShadow(msgspec.Struct, array_like=True, tag=STATE_TAG):
    """`raw`: the tool parser's input not forwarded yet; `engine`: the engine's content not
    forwarded yet (when neither is empty they differ at their first character: `diverged`);
    `called`: a call was accepted, the engine's answer stands; `sent`: non-blank content went out."""

    raw: HeldText = msgspec.field(default_factory=HeldText)
    engine: HeldText = msgspec.field(default_factory=HeldText)
    diverged: bool = False
    called: bool = False
    sent: bool = False


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _forward(sh: RawShadow, text: str) -> Delta | None:
    if not text:
        return None
    sh.sent = sh.sent or not text.isspace()
    return Delta(content=text)


def feed(sh: RawShadow, raw_text: str, delta: Delta | None) -> Delta | None:
    """One chunk: `raw_text` is what the tool parser was fed, `delta` what it answered."""
    if sh.called:
        if delta is not None:
            delta.reasoning = None
        return delta
    if delta is not None and delta.tool_calls:
        return _decide_called(sh, delta)
    sh.raw.append(raw_text)
    if delta is not None and delta.content:
        sh.engine.append(delta.content)
    if sh.diverged or not sh.raw or not sh.engine:
        return None
    # Both hold text and were equal up to here: forward what they share. One of them was empty
    # before this chunk, so this reads the other's backlog plus the new text.
    raw, engine = sh.raw.text(), sh.engine.text()
    k = _common_prefix(raw, engine)
    sh.raw, sh.engine = HeldText(raw[k:]), HeldText(engine[k:])
    sh.diverged = bool(sh.raw) and bool(sh.engine)
    return _forward(sh, raw[:k])


def finish(sh: RawShadow, flush: Delta | None, *, forced: bool) -> Delta | None:
    """The end of the stream, with the engine's final flush: a call accepted now decides for
    the engine; otherwise the raw text is the content (blank raw content is dropped under
    required/named, as `ChatParser`'s batch does)."""
    if sh.called:
        if flush is not None:
            flush.reasoning = None
        return flush
    if flush is not None and flush.tool_calls:
        return _decide_called(sh, flush)
    out = sh.raw.text()
    sh.raw, sh.engine = HeldText(), HeldText()
    if forced and not sh.sent and not out.strip():
        return None
    return _forward(sh, out)


def _decide_called(sh: RawShadow, delta: Delta) -> Delta:
    """A call was accepted: batch's answer is the engine's, whose content not forwarded yet goes
    out in front of the delta's own."""
    sh.called = True
    pending = sh.engine.text()
    sh.raw, sh.engine = HeldText(), HeldText()
    content = pending + (delta.content or "")
    return Delta(content=content or None, tool_calls=delta.tool_calls)
