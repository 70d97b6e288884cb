"""Qwen3 reasoning parser (`qwen3`): vLLM 0.33's `Qwen3ParserReasoningAdapter`.

In 0.33 `qwen3` is an adapter over the parser engine `Qwen3Parser` (`parser/qwen3.py`,
`parser/engine/*`), always run with `skip_tool_parsing=True`. This module ports exactly the part
of that engine the adapter exercises, with all per-stream data in `Qwen3State`:

- `TokenIDScanner`: `<think>`, `</think>`, `<tool_call>`, `</tool_call>` and every special token
  the config does not name (here `<|im_end|>`, `<|endoftext|>`: dropped) are recognised by
  token id; the delta text is split at them (with vLLM's hold-back recovery and anchor rebuild
  when individually decoded tokens do not match the detokenized text, and its deferral when
  a terminal's text has not arrived).
- `IncrementalLexer`: holds back any suffix that is a proper prefix of a terminal literal
  (`<think`, `</tool_`, `<function`, `<|im_`...) until the next chunk decides it. Once token ids
  have been seen, text-matched token-id terminals are plain text ("strict" mode).
- the state machine restricted to the two states it can reach with tool parsing skipped:
  REASONING (the initial state when thinking is enabled) and CONTENT. `<think>` in REASONING
  is dropped; `</think>` ends reasoning (and is dropped in CONTENT); `<tool_call>` ends
  reasoning implicitly and becomes content; everything else is text of the current state.
- `ParserEngine._events_to_delta`: content that is only whitespace is deferred until
  non-whitespace content arrives or the stream finishes. No trailing-whitespace stripping of
  reasoning (`strip_trailing_reasoning_whitespace=False` for Qwen3).
- `is_reasoning_end(prompt)` scans back to the last `<|im_start|>`/`<|im_end|>`; with
  `enable_thinking=false` it is always true (the engine's initial state is CONTENT).
- batch `extract_reasoning` feeds the whole text with no token ids (text-matched terminals,
  drop texts removed) starting in CONTENT when the prompt already closes reasoning;
  `enable_thinking=false` returns the text as content untouched.

Output is the same as vLLM's chunk by chunk: the same deltas at the same chunk boundaries
(checked against vLLM 0.33 by tests/parity/compare_parsers.py, including content before
`<think>`, no `<think>` at all, `</think>` and `<tool_call>` inside one chunk with text around
them, split `<thi`/`</tool_` text, whitespace-only content, multi-byte characters split across
chunks, `<|im_end|>` inside the output, truncation). No difference is known. Not ported because
they cannot affect output here: reasoning-token counting, and the tool states of the engine
(unreachable with `skip_tool_parsing=True`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta
from render_service.parsers.protocols import ParserState, ReasoningParser, RequestAdjustment
from render_service.parsers.registry import register_reasoning_parser

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
CHATML_TURN_BOUNDARIES = ("<|im_start|>", "<|im_end|>")
DROP = "__DROP__"

# Terminal literals of qwen3_config (all literal; order irrelevant).
TERMINALS: dict[str, str] = {
    "THINK_START": THINK_START,
    "THINK_END": THINK_END,
    "TOOL_START": TOOL_CALL_START,
    "TOOL_END": TOOL_CALL_END,
    "FUNC_PREFIX": "<function=",
    "FUNC_END": "</function>",
    "PARAM_START": "<parameter=",
    "PARAM_END": "</parameter>",
    "CLOSE_ANGLE": ">",
}
TOKEN_ID_TERMINALS = ("THINK_START", "THINK_END", "TOOL_START", "TOOL_END")

REASONING, CONTENT = 0, 1
# Events: text of the current state, and the end of reasoning.
EV_REASONING, EV_TEXT, EV_END = 0, 1, 2


class Qwen3State(ParserState, tag="qwen3/2"):
    """The engine's per-stream data. `buf` is the lexer look-behind (shorter than the longest
    terminal), `dterms`/`dpost` the scanner's deferred terminals and text (only non-empty
    while a terminal's text has not reached the detokenized stream), `dcontent` whitespace-only
    content held back."""

    state: int = REASONING
    ever_ids: bool = False  # unused since markers match by text throughout (kept: the layout)
    buf: str = ""
    dterms: list[tuple[str, int, str]] = msgspec.field(default_factory=list)  # (terminal, token_id, text)
    dpost: str = ""
    ended: bool = False  # the engine's `_reasoning_ended`
    dcontent: str = ""
    nonws: bool = False  # `_content_has_nonws`


Event = tuple[int, str]
Item = tuple[str, str] | tuple[str, str, int, str]  # ("text", text) | ("term", terminal, id, text)


@register_reasoning_parser("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    version = 4  # 4: markers matched by text in streaming too, as batch does
    state_type = Qwen3State
    engine_based_streaming = True

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        info = tokenizer
        # token id -> terminal name (the scanner's map, drop tokens included)
        resolved: dict[int, str] = {}
        for name in TOKEN_ID_TERMINALS:
            tid = info.token_to_id(TERMINALS[name])
            if tid is not None:
                resolved[tid] = name
        configured = set(TERMINALS.values())
        drop_texts: set[str] = set()
        for text, tid in zip(info.special_tokens, info.special_ids, strict=False):
            if text not in configured:
                resolved[tid] = DROP
                drop_texts.add(text)
        self.has_drops = bool(drop_texts)
        self.resolved = resolved
        literals = [(lit, name) for name, lit in TERMINALS.items()] + [(t, DROP) for t in sorted(drop_texts)]
        self.first_chars = frozenset(lit[0] for lit, _ in literals if lit)
        # In content only a literal that can be held (longer than one character) or dropped
        # changes the text; a lone ">" is passed through.
        self.content_first_chars = frozenset(lit[0] for lit, name in literals if len(lit) > 1 or name == DROP)
        self.prefix_set = frozenset(lit[:i] for lit, _ in literals for i in range(1, len(lit)))
        by_first: dict[str, list[tuple[str, str]]] = {}
        for lit, name in literals:
            by_first.setdefault(lit[0], []).append((lit, name))
        self.by_first = by_first
        self.literals = literals

        self.start_id = info.token_to_id(THINK_START)
        end_id = info.token_to_id(THINK_END)
        tool_id = info.token_to_id(TOOL_CALL_START)
        # _derive_reasoning_end_token_ids: </think> (to CONTENT) and <tool_call> (implicit end)
        self.end_ids: frozenset[int] = (
            frozenset() if end_id is None else frozenset(t for t in (end_id, tool_id) if t is not None)
        )
        # token id -> its text, for the markers batch drops from content (`after_end`)
        self.dropped_after_end: dict[int, str] = {
            tid: THINK_END for tid, name in resolved.items() if name == "THINK_END"
        }
        self.boundary_ids = frozenset(t for t in (info.token_to_id(b) for b in CHATML_TURN_BOUNDARIES) if t is not None)

    # -- configuration ----------------------------------------------------------------------------

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """The engine starts in CONTENT with `enable_thinking=false`."""
        return bool(template_kwargs.get("enable_thinking", True))

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        """The engine adapter recognises `<think>`/`</think>` by token id: keep them."""
        request.skip_special_tokens = False

    # -- prompt ---------------------------------------------------------------------------------

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        """`is_reasoning_end(prompt)`: a reasoning end after the last turn boundary / `<think>`."""
        wait_for_reasoning = self.thinking_enabled
        start_opens_reasoning = self.thinking_enabled  # (REASONING, THINK_START) only exists then
        for tid in reversed(prompt_token_ids):
            if tid in self.end_ids:
                return True
            if tid == self.start_id:
                if start_opens_reasoning:
                    return False
                break
            if tid in self.boundary_ids:
                break
        return not wait_for_reasoning

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        """`ParserEngine.extract_content_ids`: after the last `</think>`, else from the first
        implicit end (`<tool_call>`) of the current turn."""
        if not self.thinking_enabled:
            return delta_ids
        end_id = self.info.token_to_id(THINK_END)
        if end_id is not None:
            for i in range(len(delta_ids) - 1, -1, -1):
                if delta_ids[i] == end_id:
                    return delta_ids[i + 1 :]
        if self.end_ids:
            turn_start = 0
            for i in range(len(delta_ids) - 1, -1, -1):
                if delta_ids[i] in self.boundary_ids:
                    turn_start = i + 1
                    break
            for i in range(turn_start, len(delta_ids)):
                if delta_ids[i] in self.end_ids:
                    return delta_ids[i:]
        return delta_ids

    def new_state(self) -> Qwen3State:
        return Qwen3State(state=REASONING if self.thinking_enabled else CONTENT)

    # -- accumulating to the batch answer -------------------------------------------------------

    filters_after_end = True

    def stream_prompt_ends_reasoning(self, st: Qwen3State, prompt_token_ids: Sequence[int]) -> bool:
        """Batch starts the engine in CONTENT when the prompt closes reasoning (and the
        tokenizer has turn boundaries; without them it ignores the prompt)."""
        ends = self.prompt_ends_reasoning(prompt_token_ids)
        if ends and self.thinking_enabled:
            if not self.boundary_ids:
                return False
            st.state = CONTENT
        return ends

    def after_end(self, st: Qwen3State, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        """Batch keeps running the engine over the content after reasoning ends, with no token
        ids: it matches markers by text and drops `</think>` and the special tokens it does not
        name (`<|im_end|>` with ignore_eos), wherever they are and however they are spelled.
        So does the stream (`enable_thinking=false`: the text untouched), holding back only a
        possible marker prefix at the chunk's end (the lexer's look-behind, flushed when the
        stream finishes): it accumulates to the batch content."""
        if not self.thinking_enabled:
            return Delta(content=text) if text else None
        if not st.buf and not finished and self.content_first_chars.isdisjoint(text):
            # No literal can start here: the engine would pass the text through (per-chunk speed:
            # most content chunks take this path).
            return Delta(content=text) if text else None
        events = self._feed(st, text, ()) if text else []
        if finished:
            events.extend(self._finish(st))
        content = "".join(v for k, v in events if k == EV_TEXT)
        return Delta(content=content) if content else None

    # -- streaming (the adapter's API) ---------------------------------------------------------

    def stream(self, st: Qwen3State, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        """`extract_reasoning_streaming`, then `has_engine_confirmed_reasoning_end()`."""
        events = self._feed(st, delta_text, delta_ids)
        return self._events_to_delta(st, events, finished=False), st.ended

    def flush_on_transition(self, st: Qwen3State) -> Delta | None:
        """`finish_streaming()`: flush the scanner, the lexer and deferred content."""
        events = self._finish(st)
        if events or st.dcontent:
            return self._events_to_delta(st, events, finished=True)
        return None

    finish = flush_on_transition  # `_flush_engine_parsers` calls the same finish_streaming()

    # -- batch ----------------------------------------------------------------------------------

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """Batch `extract_reasoning` (`Qwen3Parser` + `ParserEngine`)."""
        if not self.thinking_enabled:
            return None, model_output
        prompt_closes = (
            prompt_token_ids is not None and bool(self.boundary_ids) and self.prompt_ends_reasoning(prompt_token_ids)
        )
        st = Qwen3State(state=CONTENT if prompt_closes else REASONING)
        events = self._feed(st, model_output, ())
        events.extend(self._finish(st))
        reasoning = "".join(v for k, v in events if k == EV_REASONING)
        content = "".join(v for k, v in events if k == EV_TEXT)
        return reasoning or None, content or None

    # -- engine ----------------------------------------------------------------------------------

    def _emit(self, st: Qwen3State, text: str) -> list[Event]:
        return [(EV_REASONING if st.state == REASONING else EV_TEXT, text)]

    def _feed(self, st: Qwen3State, text: str, ids: Sequence[int]) -> list[Event]:
        resolved = self.resolved
        # Fast path of StreamingParserEngine.feed: plain text, nothing pending.
        if (
            text
            and not st.buf
            and not st.dterms
            and self.first_chars.isdisjoint(text)
            and not any(t in resolved for t in ids)
        ):
            return self._emit(st, text)
        return self._process_items(st, self._scan(st, text, ids))

    def _finish(self, st: Qwen3State) -> list[Event]:
        events = self._process_items(st, self._flush_pending(st))
        events.extend(self._lex_tokens(st, self._lex_flush(st)))
        if st.state == REASONING:
            events.append((EV_END, ""))
            st.state = CONTENT
        return events

    def _process_items(self, st: Qwen3State, items: list[Item]) -> list[Event]:
        events: list[Event] = []
        for item in items:
            if item[0] == "term":
                events.extend(self._lex_tokens(st, self._lex_flush(st)))
                events.extend(self._on_terminal(st, item[1], item[3]))  # type: ignore[misc]
            elif item[1]:
                events.extend(self._lex_tokens(st, self._lex_feed(st, item[1])))
        return events

    def _lex_tokens(self, st: Qwen3State, tokens: list[tuple[str | None, str]]) -> list[Event]:
        events: list[Event] = []
        # vLLM's stream reads a token-id terminal spelled by ordinary tokens as text once it has
        # seen ids ("strict"); its batch has no ids and matches every terminal by text. Ours
        # matches by text in both, so the stream accumulates to the batch answer.
        for terminal, value in tokens:
            if terminal is None:
                if value:
                    events.extend(self._emit(st, value))
            else:
                events.extend(self._on_terminal(st, terminal, value))
        return events

    def _on_terminal(self, st: Qwen3State, terminal: str, value: str) -> list[Event]:
        state = st.state
        if terminal == "THINK_START" and state == REASONING:
            return []  # (REASONING, THINK_START) -> REASONING, no events
        if terminal == "THINK_END":
            st.state = CONTENT  # (REASONING|CONTENT, THINK_END) -> CONTENT
            return [(EV_END, value)] if state == REASONING else []
        if terminal == "TOOL_START":
            # tool parsing skipped: the implicit reasoning end, the tag becomes content
            st.state = CONTENT
            return [(EV_END, value), (EV_TEXT, value)]
        if terminal == DROP and self.has_drops:
            return []
        # FUNC_PREFIX in CONTENT (skipped tool opener) and every terminal without a transition
        return self._emit(st, value)

    # -- IncrementalLexer ------------------------------------------------------------------------

    def _lex_feed(self, st: Qwen3State, text: str) -> list[tuple[str | None, str]]:
        if not st.buf and self.first_chars.isdisjoint(text):
            return [(None, text)]
        st.buf += text
        return self._drain(st, final=False)

    def _lex_flush(self, st: Qwen3State) -> list[tuple[str | None, str]]:
        if not st.buf:
            return []
        tokens = self._drain(st, final=True)
        if st.buf:
            tokens.append((None, st.buf))
            st.buf = ""
        return tokens

    def _drain(self, st: Qwen3State, *, final: bool) -> list[tuple[str | None, str]]:
        tokens: list[tuple[str | None, str]] = []
        first_chars, by_first, prefix_set = self.first_chars, self.by_first, self.prefix_set
        buf = st.buf
        while buf:
            if first_chars.isdisjoint(buf):
                tokens.append((None, buf))
                buf = ""
                break
            best: tuple[str, str] | None = None
            candidates = by_first.get(buf[0], ())
            for lit, name in candidates:
                if buf.startswith(lit) and (best is None or len(lit) > len(best[1])):
                    best = (name, lit)
            if buf in prefix_set and not final:
                # Wait unless a complete literal here cannot grow into a longer one.
                if best is not None and not any(
                    len(lit) > len(best[1]) and lit.startswith(buf) for lit, _ in candidates
                ):
                    tokens.append(best)
                    buf = buf[len(best[1]) :]
                    continue
                break
            if best is not None:
                tokens.append(best)
                buf = buf[len(best[1]) :]
            else:
                end = self._content_boundary(buf)
                tokens.append((None, buf[:end]))
                buf = buf[end:]
        st.buf = buf
        return tokens

    def _content_boundary(self, buf: str) -> int:
        n = len(buf)
        first_chars = self.first_chars
        for i in range(1, n):
            if buf[i] not in first_chars:
                continue
            remaining = n - i
            for lit, _ in self.literals:
                check = min(remaining, len(lit))
                if buf[i : i + check] == lit[:check]:
                    return i
        return n

    # -- TokenIDScanner ---------------------------------------------------------------------------

    def _scan(self, st: Qwen3State, text: str, ids: Sequence[int]) -> list[Item]:
        prefix: list[Item] = []
        effective = text
        if st.dterms:
            prefix, effective = self._resolve_deferred(st, text)
        resolved = self.resolved
        if not resolved or not any(t in resolved for t in ids):
            if effective:
                prefix.append(("text", effective))
            return prefix
        decode = self.info.decode_one
        results: list[Item] = []
        acc: list[str] = []
        for tid in ids:
            terminal = resolved.get(tid)
            if terminal is not None:
                joined = "".join(acc)
                if joined:
                    results.append(("text", joined))
                acc = []
                results.append(("term", terminal, tid, decode(tid)))
            else:
                acc.append(decode(tid))
        joined = "".join(acc)
        if joined:
            results.append(("text", joined))
        if effective:
            results = self._recover_holdback(st, effective, results)
        else:
            # No detokenized text to anchor to: defer the terminals until their text arrives.
            st.dterms.extend((r[1], r[2], r[3]) for r in results if r[0] == "term")  # type: ignore[misc]
            results = []
        return prefix + results

    def _flush_pending(self, st: Qwen3State) -> list[Item]:
        if not st.dterms and not st.dpost:
            return []
        items: list[Item] = []
        if st.dpost:
            items.append(("text", st.dpost))
            st.dpost = ""
        items.extend(("term", t[0], t[1], t[2]) for t in st.dterms)
        st.dterms = []
        return items

    def _resolve_deferred(self, st: Qwen3State, text: str) -> tuple[list[Item], str]:
        deferred = st.dterms
        st.dterms = []
        results: list[Item] = []
        remaining = text
        if st.dpost:
            remaining = st.dpost + remaining
            st.dpost = ""
        for terminal, tid, ttext in deferred:
            pos = remaining.find(ttext)
            if pos > 0:
                results.append(("text", remaining[:pos]))
                results.append(("term", terminal, tid, ttext))
                remaining = remaining[pos + len(ttext) :]
            elif pos == 0:
                results.append(("term", terminal, tid, ttext))
                remaining = remaining[len(ttext) :]
            else:
                if remaining:
                    st.dpost += remaining
                    remaining = ""
                st.dterms.append((terminal, tid, ttext))
        return results, remaining

    def _recover_holdback(self, st: Qwen3State, text: str, results: list[Item]) -> list[Item]:
        if not results:
            return [("text", text)]
        reconstructed = "".join(r[1] if r[0] == "text" else r[3] for r in results)  # type: ignore[misc]
        if not reconstructed:
            return [("text", text), *results]
        pos = text.find(reconstructed)
        if pos > 0:
            return [("text", text[:pos]), *results]
        if pos == 0:
            return results
        return self._rebuild_from_anchors(st, text, results)

    def _rebuild_from_anchors(self, st: Qwen3State, text: str, results: list[Item]) -> list[Item]:
        anchors = [r for r in results if r[0] == "term"]
        if not anchors:
            return [("text", text)]
        positions = [-1] * len(anchors)
        search_end = len(text)
        for i in range(len(anchors) - 1, -1, -1):
            pos = text.rfind(anchors[i][3], 0, search_end)  # type: ignore[misc]
            if pos >= 0:
                positions[i] = pos
                search_end = pos
        out: list[Item] = []
        consumed = 0
        for i, anchor in enumerate(anchors):
            pos = positions[i]
            if pos >= consumed:
                if pos > consumed:
                    out.append(("text", text[consumed:pos]))
                out.append(anchor)
                consumed = pos + len(anchor[3])  # type: ignore[misc]
            else:
                has_later_valid = any(p >= 0 for p in positions[i + 1 :])
                if not has_later_valid and consumed < len(text) and anchor[1] != DROP:
                    st.dpost += text[consumed:]
                    consumed = len(text)
                st.dterms.append((anchor[1], anchor[2], anchor[3]))  # type: ignore[misc]
        if consumed < len(text):
            out.append(("text", text[consumed:]))
        return out

    # -- ParserEngine._events_to_delta --------------------------------------------------------------

    def _events_to_delta(self, st: Qwen3State, events: list[Event], finished: bool) -> Delta | None:
        if not events and not st.dcontent:
            return None
        content_parts: list[str] = []
        reasoning_parts: list[str] = []
        for kind, value in events:
            if kind == EV_TEXT:
                content_parts.append(value)
            elif kind == EV_REASONING:
                reasoning_parts.append(value)
            else:
                st.ended = True
        if st.dcontent:
            content_parts.insert(0, st.dcontent)
            st.dcontent = ""
        content = "".join(content_parts)
        if not st.nonws and content:
            if content.strip():
                st.nonws = True
            elif not finished:
                st.dcontent = content  # whitespace-only so far: hold it back
                content = ""
        reasoning = "".join(reasoning_parts)
        if content or reasoning:
            return Delta(content=content or None, reasoning=reasoning or None)
        return None
