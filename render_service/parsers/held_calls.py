"""Held calls: a stream that accumulates to an all-or-nothing batch answer.

Several of vLLM 0.33's tool parsers decide in batch on the whole output: `hermes`/`qwen3_json`
rejects every call when one region is malformed or unclosed, `granite4` when one call does not
load, ... and then the whole text is content. vLLM's stream cannot know that while it streams,
so its deltas do not add up to its batch answer there. Ours hold back instead (issue 16, ACC.md
rule 1): content streams until the family's start marker (a split marker is held back, as is
content that is only whitespace so far, which batch drops when calls follow); from the marker on
everything is held (`HeldText`: an append-only segment beside the snapshot, so a chunk costs
O(new text) and resumes on another replica); when the stream finishes the family's own batch
extractor decides on the held text, and the calls go out whole (one name delta and one
arguments delta per call, as vLLM sends a call that arrives in one chunk), or the held text goes
out as content. So calls arrive whole, at the end of the stream.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from render_service.parsers import held
from render_service.parsers.base import (
    Delta,
    FunctionCall,
    RequestOptions,
    Tag,
    ToolCallDelta,
    ToolIdFn,
    partial_tag_overlap,
)
from render_service.parsers.held import HeldText
from render_service.parsers.protocols import ParserState

Extract = Callable[[str], tuple[bool, list[FunctionCall], str | None]]


class HeldCallsState(ParserState):
    """The fields a held-calls family's state carries (subclasses add the tag).

    `k` is the start marker's matcher state (the held look-behind is `marker[:k]`), `ws` the
    content so far while it is only whitespace, `released` whether other content went out,
    `holding` whether the marker arrived (then `held` is the text from the marker on);
    `poison_k` the poison marker's matcher state, `poisoned` whether it came first."""

    k: int = 0
    ws: str = ""
    released: bool = False
    holding: bool = False
    held: HeldText = msgspec.field(default_factory=HeldText)
    poison_k: int = 0
    poisoned: bool = False


class CallsHolder:
    """The held-calls stream of one family: `start` is the marker that opens the calls block,
    `extract` the family's batch `extract_tool_calls` (run once, on the held text). `poison`: a
    marker that, seen before `start`, makes batch return the whole text as content (granite4's
    end tag without a start): from there on the stream is content, held back no more."""

    __slots__ = ("_poison", "_tag", "extract", "holds_marker_chunk")

    def __init__(
        self, start: str, extract: Extract, poison: str | None = None, *, holds_marker_chunk: bool = False
    ) -> None:
        self._tag = Tag(start)
        self._poison = Tag(poison) if poison else None
        self.extract = extract
        # The content of the chunk that completes `start` is held with the calls (internlm: vLLM's
        # stream sends nothing on that chunk and that content only later), so `extract` then
        # sees it before the marker.
        self.holds_marker_chunk = holds_marker_chunk

    def feed(self, st: HeldCallsState, text: str) -> Delta | None:
        """One chunk: the content that is decided, or None."""
        if st.holding:
            st.held.append(text)
            return None
        if st.poisoned:
            return Delta(content=text) if text else None
        st.k, released, found, used = self._tag.feed(st.k, text)
        if self._poison is not None:
            st.poison_k, _, poisoned, _ = self._poison.feed(st.poison_k, text[:used])
            if poisoned:
                # Batch will not look for calls: everything is content, as it comes.
                st.poisoned = True
                out = st.ws + released + self._tag.text[: len(self._tag.text) if found else st.k] + text[used:]
                st.ws, st.k, st.released = "", 0, True
                return Delta(content=out) if out else None
        if found and self.holds_marker_chunk:
            st.holding = True
            st.held = HeldText(released + self._tag.text + text[used:])
            return None
        out = held.content_before_calls(st, released)
        if found:
            st.holding = True
            st.held = HeldText(self._tag.text + text[used:])
        return Delta(content=out) if out else None

    def finish(self, st: HeldCallsState, tool_id: ToolIdFn, opts: RequestOptions, lead: str = "") -> Delta | None:
        """The end of the stream: the batch decision on what was held. `lead`: streamed text the
        batch extractor must see before the held text (Hunyuan A13B: an open `<think>`), kept
        out of the content."""
        if not st.holding:
            # No calls block: a split marker at the end and held whitespace are content (batch
            # returns the text unchanged when there is no call), except where required/named
            # make batch drop blank content.
            out = st.ws + self._tag.text[: st.k]
            st.ws, st.k = "", 0
            if not out or (not st.released and opts.forces_tool_calls and not out.strip()):
                return None
            return Delta(content=out)
        held = st.held.text()
        st.held = HeldText()
        st.holding = False
        called, calls, content = self.extract(lead + held)
        if content is not None and lead:
            content = content[len(lead) :]
        if not called:
            # Batch returns the whole text as content (blank content is dropped under
            # required/named, as ChatParser's batch does).
            out = st.ws + held
            if not st.released and opts.forces_tool_calls and not out.strip():
                return None
            return Delta(content=out)
        tail = st.ws + (content or "")
        if not st.released and not tail.strip():
            tail = ""  # batch content that is only whitespace becomes None when calls were made
        deltas: list[ToolCallDelta] = []
        for i, call in enumerate(calls):
            deltas.append(ToolCallDelta(index=i, id=call.call_id(tool_id, i), type="function", name=call.name))
            deltas.append(ToolCallDelta(index=i, arguments=call.arguments))
        return Delta(content=tail or None, tool_calls=deltas)


UNDECIDED, CONTENT, HOLDING = 0, 1, 2


class LeadingCallsState(ParserState):
    """The fields of a family whose calls must open the tool phase (subclasses add the tag):
    `mode` UNDECIDED (then `lead` is the text so far, a prefix of the opening marker), CONTENT,
    or HOLDING (then `held` is the whole tool phase)."""

    mode: int = UNDECIDED
    lead: str = ""
    held: HeldText = msgspec.field(default_factory=HeldText)


class LeadingCallsHolder:
    """The held-calls stream of a family whose batch answer needs the whole tool phase to be the
    call list (pythonic): `starts(text)` says the text opens a call list, `may_start(text)` that
    more text still could. A tool phase that does not open one is content as it comes (batch
    finds no calls in it either); one that does is held to the end, where `extract` decides."""

    __slots__ = ("extract", "may_start", "starts")

    def __init__(self, starts: Callable[[str], bool], may_start: Callable[[str], bool], extract: Extract) -> None:
        self.starts = starts
        self.may_start = may_start
        self.extract = extract

    def feed(self, st: LeadingCallsState, text: str) -> Delta | None:
        if st.mode == HOLDING:
            st.held.append(text)
            return None
        if st.mode == CONTENT:
            return Delta(content=text) if text else None
        lead = st.lead + text
        if self.starts(lead):
            st.mode, st.lead, st.held = HOLDING, "", HeldText(lead)
            return None
        if self.may_start(lead):
            st.lead = lead
            return None
        st.mode, st.lead = CONTENT, ""
        return Delta(content=lead) if lead else None

    def finish(self, st: LeadingCallsState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        if st.mode != HOLDING:
            out, st.lead = st.lead, ""
            if not out or (opts.forces_tool_calls and not out.strip()):
                return None
            return Delta(content=out)
        held = st.held.text()
        st.held, st.mode = HeldText(), CONTENT
        called, calls, content = self.extract(held)
        if not called:
            if opts.forces_tool_calls and not held.strip():
                return None
            return Delta(content=held)
        tail = content if content and content.strip() else None
        deltas: list[ToolCallDelta] = []
        for i, call in enumerate(calls):
            deltas.append(ToolCallDelta(index=i, id=call.call_id(tool_id, i), type="function", name=call.name))
            deltas.append(ToolCallDelta(index=i, arguments=call.arguments))
        return Delta(content=tail, tool_calls=deltas)


class MarkedCallsState(ParserState):
    """The fields of a `MarkedCallsHolder` family (subclasses add the tag): `pend` the text that
    may still start a marker, `ws` whitespace not sent yet (before any other content, or at the
    end of the content sent so far), `released` whether other content went out, `holding`
    whether a marker (or a leading character) arrived (then `held` is the text from it on)."""

    pend: str = ""
    ws: str = ""
    released: bool = False
    holding: bool = False
    held: HeldText = msgspec.field(default_factory=HeldText)


STAND_IN = "x"  # opaque content before the first marker (see `MarkedCallsHolder`)


class MarkedCallsHolder:
    """The held-calls stream of a family whose batch extractor looks for any of several
    `markers` anywhere (xlam: code fences, `[TOOL_CALLS]`, `<tool_call>`, `</think>`), or reads
    the whole output as a call list when its first non-blank character is in `leading`, and
    returns the content stripped when it finds calls. Content streams until the first marker;
    whitespace at either end of the content sent so far is held (batch strips it); from the
    marker on everything is held and `extract` decides at the end.

    Batch treats the content before the first marker as opaque text (it holds no marker and does
    not start with a leading character), so the end of the stream runs `extract` on `STAND_IN`
    plus the held whitespace and text, and sends what follows the stand-in in its content. The
    content's leading whitespace has gone out by then: our batch keeps it too
    (`extract_with_leading_ws`), a listed deliberate difference where vLLM strips it."""

    __slots__ = ("extract", "leading", "markers")

    def __init__(self, markers: tuple[str, ...], leading: str, extract: Extract) -> None:
        self.markers = markers
        self.leading = leading
        self.extract = extract

    def _first_marker(self, text: str) -> int:
        found = [i for i in (text.find(m) for m in self.markers) if i != -1]
        return min(found) if found else -1

    def _partial(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a marker."""
        return max(partial_tag_overlap(text, m) for m in self.markers)

    def feed(self, st: MarkedCallsState, text: str) -> Delta | None:
        if st.holding:
            st.held.append(text)
            return None
        s, st.pend = st.pend + text, ""
        if not st.released:
            lead = s.lstrip()
            if not lead:
                st.ws += s
                return None
            if lead[0] in self.leading:
                st.holding, st.held, st.ws = True, HeldText(st.ws + s), ""
                return None
        pos = self._first_marker(s)
        if pos != -1:
            out = self._content(st, s[:pos])
            st.holding, st.held = True, HeldText(s[pos:])
        else:
            keep = self._partial(s)
            st.pend = s[len(s) - keep :] if keep else ""
            out = self._content(st, s[: len(s) - keep])
        return Delta(content=out) if out else None

    @staticmethod
    def _content(st: MarkedCallsState, text: str) -> str:
        """Content before any marker: all but its trailing whitespace goes out."""
        whole = st.ws + text
        body = whole.rstrip()
        if not body:
            st.ws = whole
            return ""
        st.released, st.ws = True, whole[len(body) :]
        return body

    def finish(self, st: MarkedCallsState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        if not st.holding:
            # No marker: batch returns the text unchanged.
            out, st.ws, st.pend = st.ws + st.pend, "", ""
            if not out or (not st.released and opts.forces_tool_calls and not out.strip()):
                return None
            return Delta(content=out)
        rest = st.ws + st.held.text()
        st.held, st.holding, st.ws = HeldText(), False, ""
        prefix = STAND_IN if st.released else ""
        called, calls, content = self.extract(prefix + rest)
        if not called:
            # No calls: batch keeps the whole text as content (blank content is dropped under
            # required/named, as ChatParser's batch does).
            content = None if not st.released and opts.forces_tool_calls and not rest.strip() else rest
        elif prefix:
            assert content is not None and content.startswith(prefix), content
            content = content[len(prefix) :]
        deltas: list[ToolCallDelta] = []
        for i, call in enumerate(calls):
            deltas.append(ToolCallDelta(index=i, id=call.call_id(tool_id, i), type="function", name=call.name))
            deltas.append(ToolCallDelta(index=i, arguments=call.arguments))
        if not content and not deltas:
            return None
        return Delta(content=content or None, tool_calls=deltas)

    def extract_with_leading_ws(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """Our batch answer: `extract`'s, except that content before the first marker keeps its
        leading whitespace (the stream sent it before any marker was known)."""
        rest = model_output.lstrip()
        if not rest or rest[0] in self.leading:
            return self.extract(model_output)
        pos = self._first_marker(rest)
        if pos == -1:
            return self.extract(model_output)
        body = rest[:pos].rstrip()
        if not body:
            return self.extract(model_output)
        called, calls, content = self.extract(STAND_IN + rest[len(body) :])
        if not called:
            return False, [], model_output
        assert content is not None and content.startswith(STAND_IN), content
        return called, calls, model_output[: len(model_output) - len(rest)] + body + content[len(STAND_IN) :]
