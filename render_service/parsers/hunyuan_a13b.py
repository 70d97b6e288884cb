"""Hunyuan A13B reasoning and tool parsers (`hunyuan_a13b`): vLLM 0.33's `HunyuanA13BReasoningParser`
and `HunyuanA13BToolParser`, changed where vLLM's stream does not add up to its batch answer.

Reasoning. The output is `<think>\\n REASONING \\n</think>\\n<answer>\\n CONTENT \\n</answer>`. vLLM's
stream walks Hunyuan's hard-coded token ids for these markers (one token per chunk, it asserts as
much), its batch matches the marker text with two regexes. Here stream and batch share one rule on
the marker text, found across chunks by holding back only a possible marker prefix: an output that
starts with `<think>\\n` is reasoning up to the first `\\n</think>\\n<answer>\\n`, the rest (or an
output without the opening marker) is content up to the first `\\n</answer>`, after which nothing
is kept. vLLM's batch agrees except where its decision waits for text that may come last
(deliberate, docs/parsers.md): an opened reasoning that never reaches the answer marker is content
there (ours: reasoning), its answer group needs a `\\n</answer>` after the answer marker (else the
text up to an earlier one is content), and `<think>\\n` found later in an output without `\\n</answer>`
drops the text before it.

Tools. Batch takes the first `<tool_calls>...</tool_calls>` region outside a `<think>...</think>`
span whose text loads as JSON; a list of `{"name", "arguments"}` objects makes the calls (content is
the text before the region), anything else leaves the whole text content. That is decided only at
the end, so the stream holds everything from the first `<tool_calls>` on (`held_calls.CallsHolder`)
and the calls arrive whole when it ends. Ids keep vLLM's shape: `call_HEX` in batch, `call_{i}_HEX`
streamed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, Tag, ToolIdFn
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import ParserState, ReasoningParser, ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

THINK_START = "<think>\n"
ANSWER_START = "\n</think>\n<answer>\n"
ANSWER_END = "\n</answer>"

START, THINK, CONTENT, DONE = 0, 1, 2, 3
_ANSWER_START = Tag(ANSWER_START)
_ANSWER_END = Tag(ANSWER_END)


class HunyuanReasoningState(ParserState, tag="hunyuan_a13b/1"):
    phase: int = START
    pend: str = ""  # START: the output so far, a proper prefix of `<think>\n`
    k: int = 0  # the current phase's marker matcher (the held text is that marker's prefix)


def split_reasoning(text: str) -> tuple[str | None, str | None]:
    """The rule stream and batch share: (reasoning, content), empty parts None."""
    if text.startswith(THINK_START):
        rest = text[len(THINK_START) :]
        at = rest.find(ANSWER_START)
        if at == -1:
            return rest or None, None
        reasoning, content = rest[:at], rest[at + len(ANSWER_START) :]
        end = content.find(ANSWER_END)
        return reasoning or None, (content[:end] if end != -1 else content) or None
    end = text.find(ANSWER_END)
    if end == -1:
        return None, text  # vLLM: no match, the output as it is (empty too)
    return None, text[:end] or None


@register_reasoning_parser("hunyuan_a13b")
class HunyuanA13BReasoningParser(ReasoningParser):
    state_type = HunyuanReasoningState
    # Batch's pass runs from the first chunk (`after_end`): its content goes on to the tool parser.
    streams_whole_output = True
    filters_after_end = True

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        return False  # vLLM: `current_state == "response"`, never so before the output

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        return self.after_end(st, delta_text, delta_ids, finished=False), True

    def after_end(self, st: Any, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        reasoning, content = "", ""
        if st.phase == START:
            lead = st.pend + text
            if lead.startswith(THINK_START):
                st.phase, st.pend, text = THINK, "", lead[len(THINK_START) :]
            elif THINK_START.startswith(lead) and not finished:
                st.pend, text = lead, ""
            else:
                st.phase, st.pend, text = CONTENT, "", lead
        if st.phase == THINK:
            st.k, released, found, used = _ANSWER_START.feed(st.k, text)
            reasoning, text = released, text[used:]
            if found:
                st.phase = CONTENT
            elif finished:
                reasoning += ANSWER_START[: st.k]
                st.k, text = 0, ""
        if st.phase == CONTENT and text:
            st.k, content, found, _ = _ANSWER_END.feed(st.k, text)
            if found:
                st.phase, st.k = DONE, 0  # batch keeps nothing after `\n</answer>`
        if finished and st.phase == CONTENT:
            content += ANSWER_END[: st.k]
            st.k = 0
        if not reasoning and not content:
            return None
        return Delta(reasoning=reasoning or None, content=content or None)

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        return split_reasoning(model_output)


# -- tools ------------------------------------------------------------------------------------------

CALLS_START = "<tool_calls>"
_CALLS_RE = re.compile(r"<tool_calls>([\s\S]*?)</tool_calls>")
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_CALLS_START = Tag(CALLS_START)
_THINK_OPEN = Tag("<think>")
_THINK_CLOSE = Tag("</think>")


def extract_calls(text: str, id_prefix: str = "call_") -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's `extract_tool_calls`: the first loadable calls region outside a think span."""
    spans: list[tuple[int, int]] | None = None
    for match in _CALLS_RE.finditer(text):
        start, end = match.span()
        if spans is None:
            spans = [(m.start(), m.end()) for m in _THINK_RE.finditer(text)]
        if any(start > a and end < b for a, b in spans):
            continue
        try:
            data = json.loads(match.group(1).strip())
        except (ValueError, RecursionError):  # deeply nested model output is text too
            continue
        return _calls(data, text, text[:start], id_prefix)
    return False, [], text


def _calls(data: Any, text: str, content: str, id_prefix: str) -> tuple[bool, list[FunctionCall], str | None]:
    if not isinstance(data, list):
        return False, [], text
    calls: list[FunctionCall] = []
    for call in data:
        if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
            continue
        name, arguments = call["name"], call["arguments"]
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(name, str) or not isinstance(arguments, str):
            return False, [], text  # vLLM's FunctionCall refuses it: the whole text is content
        calls.append(FunctionCall(name=name, arguments=arguments))
    if not calls:
        return False, [], text
    for i, call in enumerate(calls):
        call.id_prefix = id_prefix.format(i=i)
    return True, calls, content if content.strip() else None


def _streamed_calls(text: str) -> tuple[bool, list[FunctionCall], str | None]:
    return extract_calls(text, "call_{i}_")  # vLLM's streamed ids carry the call's index


class HunyuanToolState(HeldCallsState, tag="hunyuan_a13b.tool/1"):
    think_k: int = 0  # the `<think>` / `</think>` matcher over the content streamed so far
    in_think: bool = False  # a `<think>` is open there (a calls region after it may be inside)


@register_tool_parser("hunyuan_a13b")
class HunyuanA13BToolParser(ToolParser):
    state_type = HunyuanToolState
    holds_until_finish = True
    holder = CallsHolder(CALLS_START, _streamed_calls)

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)

    def feed(self, st: Any, text: str, tool_id: ToolIdFn) -> Delta | None:
        if not st.holding:
            _, _, _, used = _CALLS_START.feed(st.k, text)
            self._track_think(st, text[:used])
        return self.holder.feed(st, text)

    @staticmethod
    def _track_think(st: HunyuanToolState, text: str) -> None:
        """Whether a `<think>` is open at the end of `text`, as batch's think spans pair them."""
        while text:
            tag = _THINK_CLOSE if st.in_think else _THINK_OPEN
            st.think_k, _, found, used = tag.feed(st.think_k, text)
            if not found:
                return
            st.in_think, st.think_k, text = not st.in_think, 0, text[used:]

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return self.holder.finish(st, tool_id, opts, lead="<think>" if st.in_think else "")

    def remaining_args(self, st: Any) -> str:
        return ""

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)
