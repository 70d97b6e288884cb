"""Baidu ERNIE 4.5 (`ernie45`, reasoning and tools): `abc</think>\\n\\n<response>\\ndef\\n</response>`
or `abc</think>\\n\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

vLLM 0.33's `Ernie45ReasoningParser` (a `BaseThinkingReasoningParser`) and `Ernie45ToolParser`.

Batch (vLLM's, with the differences below): reasoning is the text before `</think>`, content what
follows, with a `<response>...</response>` wrapper removed; the tool parser matches
`<tool_call>\\s*{...}\\s*</tool_call>` regions, every one of which must load as JSON (else the
whole text is content), and keeps the text before the first `<tool_call>`, trailing newlines
stripped, as content. The tool parser is hermes-shaped (all or nothing over the output), so its
stream is `held_calls.CallsHolder` with ERNIE's extractor: content streams up to `<tool_call>`,
the calls arrive whole at the end.

vLLM's streams split at marker token ids and strip newlines by the ids of `<0x0A>` (ERNIE's
byte token) around `</think>`, `<response>` and `</response>`, chunk by chunk: they do not add up
to its batch answer (e.g. without a tool parser the wrapper is never removed). Ours stream
batch's pass over the whole output instead (`streams_whole_output`), matching the markers by text
and holding back only a possible marker prefix, the content's leading whitespace while a
`<response>` may still open it, and the text after a `</response>` that another may still close.
Where batch's decision depends on text that may come last, our batch follows the stream's rule
(docs/parsers.md, "ERNIE 4.5"):

- reasoning: the first `<think>` is removed only before `</think>` and the text before it is kept
  (vLLM's batch drops the text before the first `<think>`, looked for anywhere), as `deepseek_r1`;
- content: the wrapper is removed when the content opens with it (after whitespace): then it is
  the text after `<response>` up to the last `</response>` (all of it when none comes); content
  that does not open with `<response>` is kept as it is (vLLM's batch also unwraps a
  `<response>...</response>` pair that comes later, and keeps an unclosed one).

The stream ignores a prompt that closes reasoning, as vLLM's batch does (its stream would send
the whole output as content there); render still reports the prompt check (`is_reasoning_end`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, Tag, ToolIdFn, partial_tag_overlap
from render_service.parsers.held import HeldText
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import ParserState, ReasoningParser, ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser
from render_service.parsers.xml_args import ws_pattern

THINK_START, THINK_END = "<think>", "</think>"
RESPONSE_START, RESPONSE_END = "<response>", "</response>"
TOOL_CALL_START = "<tool_call>"
# vLLM's pattern (the `regex` module's `\s`)
_TOOL_CALL_RE = re.compile(ws_pattern(r"<tool_call>\s*(?P<json>\{.*?\})\s*</tool_call>"), re.DOTALL)

# The content after `</think>`: not decided yet (whitespace, maybe a `<response>` prefix), kept as
# it is, or inside a `<response>` wrapper.
LEAD, PLAIN, WRAPPED = 0, 1, 2
_RESPONSE_END = Tag(RESPONSE_END)


def unwrap_response(content: str) -> str:
    """The content rule stream and batch share: a `<response>` that opens the content (after
    whitespace) is removed with the text from its last `</response>` on; other content is kept."""
    body = content.lstrip()
    if not body.startswith(RESPONSE_START):
        return content
    body = body[len(RESPONSE_START) :]
    end = body.rfind(RESPONSE_END)
    return body if end == -1 else body[:end]


def split_reasoning(text: str) -> tuple[str, str | None]:
    """(reasoning, content or None when `</think>` is not in `text`): reasoning is the text before
    the first `</think>` with the first `<think>` in it removed."""
    end = text.find(THINK_END)
    head = text if end == -1 else text[:end]
    i = head.find(THINK_START)
    if i != -1:
        head = head[:i] + head[i + len(THINK_START) :]
    return head, (None if end == -1 else text[end + len(THINK_END) :])


class Ernie45ReasoningState(ParserState, tag="ernie45/1"):
    ended: bool = False  # `</think>` (text) is behind us: the rest is content
    seen_start: bool = False  # the first `<think>` was removed (reasoning only)
    held: str = ""  # a possible marker prefix at the end of the reasoning so far (< 8 characters)
    mode: int = LEAD  # the content's: LEAD, PLAIN or WRAPPED
    lead: str = ""  # LEAD: the content so far (whitespace, then maybe a prefix of `<response>`)
    k: int = 0  # WRAPPED: the `</response>` matcher state (held look-behind `</response>`[:k])
    closed: bool = False  # WRAPPED: a `</response>` came; `tail` is the text after it
    tail: HeldText = msgspec.field(default_factory=HeldText)


@register_reasoning_parser("ernie45")
class Ernie45ReasoningParser(ReasoningParser):
    version = 1
    state_type = Ernie45ReasoningState
    streams_whole_output = True
    filters_after_end = True  # (streams_whole_output implies it)

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        start_id = tokenizer.token_to_id(THINK_START)
        end_id = tokenizer.token_to_id(THINK_END)
        if start_id is None or end_id is None:
            raise ValueError(
                "Ernie45ReasoningParser reasoning parser could not locate think start/end tokens in the tokenizer!"
            )
        self.start_id, self.end_id = start_id, end_id

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        """`is_reasoning_end(prompt)`: the prompt's last think token is `</think>`."""
        for tid in reversed(prompt_token_ids):
            if tid == self.start_id:
                return False
            if tid == self.end_id:
                return True
        return False

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        return False  # batch ignores the prompt: so does the stream

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        # Not called: `streams_whole_output` sends every chunk to `after_end`.
        out = self.after_end(st, delta_text, delta_ids, finished=False)
        return out, True

    def after_end(self, st: Any, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        """Batch's pass over the chunk `text`: its reasoning and content; `finished` flushes."""
        reasoning = ""
        content = ""
        if not st.ended:
            reasoning, rest = self._reasoning(st, text)
            if rest is not None:
                st.ended = True
                content = self._content(st, rest)
            elif finished:
                reasoning += st.held
                st.held = ""
        else:
            content = self._content(st, text)
        if finished and st.ended:
            content += self._finish_content(st)
        if not reasoning and not content:
            return None
        return Delta(reasoning=reasoning or None, content=content or None)

    def _reasoning(self, st: Ernie45ReasoningState, text: str) -> tuple[str, str | None]:
        text = st.held + text
        st.held = ""
        end = text.find(THINK_END)
        head = text if end == -1 else text[:end]
        if not st.seen_start:
            i = head.find(THINK_START)
            if i != -1:
                head = head[:i] + head[i + len(THINK_START) :]
                st.seen_start = True
        if end != -1:
            return head, text[end + len(THINK_END) :]
        # hold a suffix that may still become `</think>` (or, before it, `<think>`)
        keep = partial_tag_overlap(head, THINK_END)
        if not st.seen_start:
            keep = max(keep, partial_tag_overlap(head, THINK_START))
        if keep:
            st.held = head[-keep:]
            head = head[:-keep]
        return head, None

    def _content(self, st: Ernie45ReasoningState, text: str) -> str:
        """The content `text` as `unwrap_response` keeps it, as far as it is decided."""
        if st.mode == PLAIN or not text:
            return text
        if st.mode == LEAD:
            lead = st.lead + text
            body = lead.lstrip()
            if body.startswith(RESPONSE_START):
                st.mode, st.lead = WRAPPED, ""
                text = body[len(RESPONSE_START) :]
            elif not body or RESPONSE_START.startswith(body):
                st.lead = lead
                return ""
            else:
                st.mode, st.lead = PLAIN, ""
                return lead
        # WRAPPED: text up to each `</response>` is decided once another one closes it.
        out: list[str] = []
        while text:
            st.k, released, found, used = _RESPONSE_END.feed(st.k, text)
            text = text[used:]
            if st.closed:
                st.tail.append(released)
                if found:  # the earlier `</response>` was not the last one after all
                    out.append(RESPONSE_END + st.tail.text())
                    st.tail = HeldText()
            else:
                out.append(released)
            if found:
                st.closed = True
        return "".join(out)

    def _finish_content(self, st: Ernie45ReasoningState) -> str:
        if st.mode == LEAD:
            out, st.lead = st.lead, ""
            return out
        if st.mode == WRAPPED and not st.closed:
            out = _RESPONSE_END.text[: st.k]  # a split marker that never completed is content
            st.k = 0
            return out
        st.tail, st.k = HeldText(), 0  # the text after the last `</response>` is dropped
        return ""

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """Batch `extract_reasoning` by the stream's rules (`split_reasoning`, `unwrap_response`)."""
        reasoning, content = split_reasoning(model_output)
        if not content:
            return reasoning, None
        return reasoning, unwrap_response(content) or None


# -- tools -------------------------------------------------------------------------------------------


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `Ernie45ToolParser.extract_tool_calls`: every closed region or nothing."""
    if TOOL_CALL_START not in model_output:
        return False, [], model_output
    try:
        calls = []
        for match in _TOOL_CALL_RE.finditer(model_output):
            obj = json.loads(match.group("json"))
            name = obj.get("name", "")
            if not isinstance(name, str):  # pydantic's FunctionCall(name: str) rejects it
                raise TypeError("tool name is not a string")
            calls.append(FunctionCall(name=name, arguments=json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
    except Exception:
        return False, [], model_output
    content = model_output[: model_output.find(TOOL_CALL_START)].rstrip("\n")
    return True, calls, content or None


_HOLDER = CallsHolder(TOOL_CALL_START, extract_calls)


class Ernie45ToolState(HeldCallsState, tag="ernie45.tool/1"):
    """`held_calls` state, plus `nl`: the newlines that end the content so far (batch strips them
    before a `<tool_call>`)."""

    nl: str = ""


@register_tool_parser("ernie45")
class Ernie45ToolParser(ToolParser):
    version = 1
    state_type = Ernie45ToolState
    holds_until_finish = True

    def feed(self, st: Ernie45ToolState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Content up to the first `<tool_call>` (trailing newlines held); then everything is held."""
        was_holding = st.holding
        out = _HOLDER.feed(st, text)
        if was_holding:
            return out
        shown = st.nl + (out.content or "") if out is not None else st.nl
        if st.holding:
            # the newlines before the marker: batch strips them if calls are accepted, else keeps them
            st.nl, st.held = "", HeldText(shown[len(shown.rstrip("\n")) :] + st.held.text())
            shown = shown.rstrip("\n")
        else:
            kept = shown.rstrip("\n")
            st.nl, shown = shown[len(kept) :], kept
        return Delta(content=shown) if shown else None

    def finish_for_request(self, st: Ernie45ToolState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The batch decision on the held text: every call whole, or all of it as content."""
        nl, st.nl = st.nl, ""
        out = _HOLDER.finish(st, tool_id, opts)
        if not nl or (out is not None and out.tool_calls):
            return out
        if out is None:
            return Delta(content=nl)
        out.content = nl + (out.content or "")
        return out

    def remaining_args(self, st: Ernie45ToolState) -> str:
        return ""  # calls go out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)
