"""Olmo 3 (`olmo3` reasoning and tools): vLLM 0.33's `Olmo3ReasoningParser` and
`Olmo3PythonicToolParser`.

Olmo 3 writes `<think>`, `</think>` and `<function_calls>` with ordinary vocabulary tokens, so
both parsers work on text.

Reasoning. vLLM's batch: with a `</think>`, reasoning is the text before the first one (a leading
`<think>` removed), content what follows; without one, all of it is content. Its stream buffers
text around partial markers with chunk-dependent quirks and sends everything before `</think>` as
reasoning. Ours streams the batch rule (a possible marker prefix held at a chunk end, at most 7
characters) and ignores the prompt, as batch does (vLLM's stream sends the whole output as
content after a prompt whose tokens spell `</think>`; render still reports that prompt as closing
reasoning, vLLM's `is_reasoning_end`). Rule 2 (batch follows the stream): without `</think>` our
batch is all reasoning, as the stream sent it (vLLM: all content, known only at the end).

Tools. The tool phase is `<function_calls>` with one pythonic call per line,
`get_weather(city="Paris")`, closed by `</function_calls>`; arguments are literals (also
`null`/`true`/`false`). vLLM's batch takes the text inside the first tag pair (else the whole
text), joins its non-blank lines with ", " into a list, and needs it to match its call-list regex
(1 s timeout) and to parse as a list of literal-argument calls: then every call, no content;
otherwise all content. That regex takes 10-40 ms on a 2,000-token call list (`.*` under nested
repetition): `call_list_matches` answers the same in one pass (tests/parsers/test_olmo3.py checks
it against the regex on fuzzed strings). vLLM's stream reads calls only when the text starts with
`<`, and re-parses the whole text each chunk. Ours holds instead (`held_calls.LeadingCallsHolder`):
a tool phase that opens with `<function_calls>` (after whitespace) is held to the end of the
stream, where the batch extractor decides (the calls arrive whole, or the text as content); any
other tool phase is content. Rule 2: such a phase is content in batch too (vLLM's batch also
reads bare call lines, or a tag pair later in the text, and drops the text around it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import regex  # type: ignore[import-untyped]

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn, partial_tag_overlap
from render_service.parsers.held_calls import LeadingCallsHolder, LeadingCallsState
from render_service.parsers.protocols import ParserState, ReasoningParser, ToolParser
from render_service.parsers.pythonic import _calls as pythonic_calls
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

THINK_START, THINK_END = "<think>", "</think>"
# `</think>` as the pre-tokenizer splits it: the first piece with or without a leading space.
THINK_END_FIRST = ("Ġ</", "</")
THINK_END_REST = ("think", ">")
FUNCTION_CALLS, FUNCTION_CALLS_END = "<function_calls>", "</function_calls>"
_TAGGED_RE = re.compile(r"<function_calls>(.*?)</function_calls>", re.DOTALL)


# -- reasoning --------------------------------------------------------------------------------------

START, REASONING, ENDED = 0, 1, 2


class Olmo3ReasoningState(ParserState, tag="olmo3/1"):
    phase: int = START  # START: a leading `<think>` may still come
    held: str = ""  # a possible marker prefix at the end of the text so far (< 8 characters)


def split_reasoning(text: str) -> tuple[str, str | None]:
    """The rule stream and batch share: (reasoning, content or None without `</think>`)."""
    text = text.removeprefix(THINK_START)
    reasoning, marker, content = text.partition(THINK_END)
    return reasoning, content if marker else None


@register_reasoning_parser("olmo3")
class Olmo3ReasoningParser(ReasoningParser):
    version = 1
    state_type = Olmo3ReasoningState

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        first = [tokenizer.token_to_id(t) for t in THINK_END_FIRST]
        rest = [tokenizer.token_to_id(t) for t in THINK_END_REST]
        if any(t is None for t in (*first, *rest)):
            raise ValueError("olmo3 reasoning parser could not locate the </think> pieces in the vocabulary")
        self.end_first_ids = frozenset(t for t in first if t is not None)
        self.end_rest_ids = [t for t in rest if t is not None]

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        """`is_reasoning_end`: the prompt's tokens spell `</think>` anywhere (any earlier turn)."""
        rest, n = self.end_rest_ids, len(self.end_rest_ids)
        ids = list(prompt_token_ids)
        for i in range(len(ids) - n, -1, -1):
            if ids[i + 1 : i + 1 + n] == rest and ids[i] in self.end_first_ids:
                return True
        return False

    def stream_prompt_ends_reasoning(self, st: Olmo3ReasoningState, prompt_token_ids: Sequence[int]) -> bool:
        return False  # batch ignores the prompt: so does the stream (it then accumulates to batch)

    def stream(self, st: Olmo3ReasoningState, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        text = st.held + delta_text
        st.held = ""
        if st.phase == START:
            if len(text) < len(THINK_START) and THINK_START.startswith(text):
                st.held = text
                return None, False
            st.phase = REASONING
            text = text.removeprefix(THINK_START)
        reasoning, marker, content = text.partition(THINK_END)
        if marker:
            st.phase = ENDED
            return Delta(reasoning=reasoning or None, content=content or None), True
        keep = partial_tag_overlap(reasoning, THINK_END)
        if keep:
            st.held, reasoning = reasoning[-keep:], reasoning[:-keep]
        return (Delta(reasoning=reasoning) if reasoning else None), False

    def finish(self, st: Olmo3ReasoningState) -> Delta | None:
        """The stream ends in reasoning: a held marker prefix is reasoning after all."""
        held, st.held = st.held, ""
        return Delta(reasoning=held) if held else None

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        return []  # vLLM's: the markers are text, no ids go on

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        if not model_output:
            return None, model_output  # vLLM's no-match answer, which the stream's "" equals
        reasoning, content = split_reasoning(model_output)
        return reasoning or None, content or None


# -- tools ------------------------------------------------------------------------------------------

_NAME = regex.compile(r"[a-zA-Z]+\w*")  # vLLM's identifier atom (`regex`'s Unicode \w)
_WS = regex.compile(r"\s*")
_CLOSE = regex.compile(r"\)\s*\]")


def call_list_matches(text: str) -> bool:
    """Whether vLLM's `Olmo3PythonicToolParser.TOOL_CALL_REGEX.match(text)` succeeds, in one pass.

    The regex is `\\[ A* B+ \\]` with A = `NAME\\((NAME=.*,\\s*)*(NAME=.*\\s)?\\),\\s*` and
    B = `NAME\\((NAME=.*,\\s*)*(NAME=.*\\s*)?\\)\\s*`, matched at the start (a prefix). Its `.*`
    matches anything (DOTALL), so a call whose parentheses open with `NAME=` absorbs everything up
    to any later `)\\s*]`, and every other call must be `NAME()`: the language is
    `\\[ (NAME\\(\\),\\s*)* ( (NAME\\(\\)\\s*)+ | (NAME\\(\\)\\s*)* NAME\\(NAME=.*\\)\\s* ) \\]`
    (A's with arguments are contained in the argument case of B). Read left to right: empty calls
    separated by commas, then (once a call is not followed by a comma) by whitespace only, until
    `]` or the first call with an argument, which matches when `)\\s*]` follows it anywhere."""
    if not text.startswith("["):
        return False
    pos, commas = 1, True
    while True:
        name = _NAME.match(text, pos)
        if name is None or text[name.end() : name.end() + 1] != "(":
            return False
        pos = name.end() + 1
        if text[pos : pos + 1] != ")":
            arg = _NAME.match(text, pos)
            if arg is None or text[arg.end() : arg.end() + 1] != "=":
                return False
            return _CLOSE.search(text, arg.end() + 1) is not None
        pos += 1
        if commas and text[pos : pos + 1] == ",":
            pos = _WS.match(text, pos + 1).end()
            continue
        pos = _WS.match(text, pos).end()
        if text[pos : pos + 1] == "]":
            return True
        commas = False


def vllm_call_list(model_output: str) -> str:
    """vLLM's batch rewriting: the inside of the first tag pair (else the whole text), its
    non-blank lines stripped and joined with ", " into a list."""
    tagged = _TAGGED_RE.search(model_output)
    if tagged:
        model_output = tagged.group(1).strip()
    return "[" + ", ".join(line.strip() for line in model_output.splitlines() if line.strip()) + "]"


def vllm_extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM 0.33's batch `extract_tool_calls` (the regex gate read by `call_list_matches`)."""
    source = vllm_call_list(model_output)
    if not call_list_matches(source):
        return False, [], model_output
    try:
        calls = pythonic_calls(source)
    except Exception:
        return False, [], model_output
    return True, [FunctionCall(name, args) for name, args in calls], None


def opens_calls(text: str) -> bool:
    return text.lstrip().startswith(FUNCTION_CALLS)


def extract_calls(model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
    """Our batch: vLLM's where the tool phase opens with `<function_calls>`, else all content
    (rule 2, see the module docstring)."""
    if not opens_calls(model_output):
        return False, [], model_output
    return vllm_extract_calls(model_output)


def _may_open(text: str) -> bool:
    return FUNCTION_CALLS.startswith(text.lstrip())


class Olmo3ToolState(LeadingCallsState, tag="olmo3.tool/1"):
    """The tool phase: undecided, content, or held (`held_calls.LeadingCallsState`)."""


@register_tool_parser("olmo3")
class Olmo3ToolParser(ToolParser):
    """`olmo3`. No structural tag model, so tool_choice required/named take vLLM's JSON paths."""

    version = 1
    state_type = Olmo3ToolState
    holds_until_finish = True

    def feed(self, st: Olmo3ToolState, text: str, tool_id: ToolIdFn) -> Delta | None:
        return _HOLDER.feed(st, text)

    def finish_for_request(self, st: Olmo3ToolState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return _HOLDER.finish(st, tool_id, opts)

    def remaining_args(self, st: Olmo3ToolState) -> str:
        return ""  # calls go out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output)


_HOLDER = LeadingCallsHolder(opens_calls, _may_open, extract_calls)
