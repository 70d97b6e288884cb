"""DeepSeek V3 / V3.1 tool parsers (`deepseek_v3`, `deepseek_v31`) and the `deepseek_v3` reasoning parser.

Tool calls (markers are added tokens of the DeepSeek vocabulary, non-special)::

    V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...
    V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

vLLM 0.33's `DeepSeekV3ToolParser` / `DeepSeekV31ToolParser` (`tool_parsers/deepseekv3_tool_parser.py`,
`deepseekv31_tool_parser.py`). Batch uses vLLM's regexes over the whole text: with
`<｜tool▁calls▁begin｜>` anywhere, every complete call anywhere is a call (V3: a call whose type is not
`function` fails the whole parse, and the whole text is content), and the content is the text before
`<｜tool▁calls▁begin｜>` (V3: plus the text after the last `<｜tool▁calls▁end｜>`).

vLLM's stream keys on the marker ids chunk by chunk and does not add up to that batch answer (a
chunk that closes a call streams its arguments only up to the last `"}`, text after the calls is
streamed as content, a call V3's batch rejects is streamed, ...). Ours holds instead (issue 16 /
docs/parsers.md "Streaming accumulates to the batch answer"): content streams up to the first
`<｜tool▁calls▁begin｜>` or `<｜tool▁call▁begin｜>` (a possible marker prefix at a chunk end, and
content that is only whitespace so far, held back); everything from that marker on is held
(`held.HeldText`, O(new text) per chunk, resumable from a snapshot's segment), and when the stream
finishes the batch extractor decides on it: the calls arrive whole, at the end of the stream, or the
held text arrives as content. (V3's answer is all or nothing and its content after the block is
known only at the end; V3.1's calls are each decided at their end marker but still go out at the end.)

`deepseek_v3` reasoning (`DeepSeekV3ReasoningParser`): `deepseek_r1` when the request's
`chat_template_kwargs` has `thinking` or `enable_thinking` truthy, else the identity parser (everything
is content, the prompt always counts as past reasoning).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers import held
from render_service.parsers.base import (
    Delta,
    FunctionCall,
    RequestOptions,
    ToolCallDelta,
    ToolIdFn,
    json_schema_format,
)
from render_service.parsers.deepseek_r1 import DeepSeekR1ReasoningParser, DeepSeekR1State
from render_service.parsers.held import HeldText
from render_service.parsers.held_calls import HeldCallsState
from render_service.parsers.protocols import ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

TOOL_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
TOOL_CALLS_END = "<｜tool▁calls▁end｜>"
TOOL_CALL_BEGIN = "<｜tool▁call▁begin｜>"
TOOL_CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"

# vLLM's batch regexes (`.` stops at "\n" only, as in the `regex` module).
_V3_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n(?P<function_arguments>[\s\S]*?)\n```<｜tool▁call▁end｜>"
)
_V31_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(?P<function_name>.*?)<｜tool▁sep｜>(?P<function_arguments>[\s\S]*?)<｜tool▁call▁end｜>"
)

# The markers from which batch's answer is undecided: the calls block's (batch reads calls only
# when it is there) and a call's (batch's call regex matches wherever a call starts).
_HOLD_FROM = (TOOL_CALLS_BEGIN, TOOL_CALL_BEGIN)
_LOOK = max(len(m) for m in _HOLD_FROM) - 1  # the longest proper marker prefix a chunk may end with


class DeepSeekToolState(HeldCallsState, tag="deepseek_v3/2"):
    """One stream (`held_calls` fields): content before the first marker (a possible marker
    prefix held in `look`, content that is only whitespace so far in `ws`), then everything from
    the marker on in `held` until the stream ends."""

    look: str = ""


def _marker_prefix_len(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a `_HOLD_FROM` marker
    (what must wait for the next chunk); O(marker length)."""
    for n in range(min(len(text), _LOOK), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in _HOLD_FROM):
            return n
    return 0


@register_tool_parser("deepseek_v3")
class DeepSeekV3ToolParser(ToolParser):
    """`deepseek_v3` (V3 markup, ```json fences); `DeepSeekV31ToolParser` below is `deepseek_v31`."""

    version = 2  # 2: calls held to the end of the stream, decided by the batch extractor
    state_type = DeepSeekToolState
    holds_until_finish = True
    structural_tag_model = "deepseek_r1"  # (strict tool calling: required/named parse like auto)
    v31: ClassVar[bool] = False

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        # vLLM refuses a tokenizer without the calls block's markers.
        if tokenizer.token_to_id(TOOL_CALLS_BEGIN) is None or tokenizer.token_to_id(TOOL_CALLS_END) is None:
            label = "DeepSeek-V3.1" if self.v31 else "DeepSeek-V3"
            raise ValueError(f"{label} Tool parser could not locate tool call start/end tokens in the tokenizer!")

    # -- render side -------------------------------------------------------------------------------

    @classmethod
    def _call_tag(cls, name: str) -> tuple[str, str]:
        if cls.v31:
            return f"{TOOL_CALL_BEGIN}{name}{TOOL_SEP}", TOOL_CALL_END
        return f"{TOOL_CALL_BEGIN}function{TOOL_SEP}{name}\n```json\n", f"\n```{TOOL_CALL_END}"

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """xgrammar's builtin `deepseek_r1` / `deepseek_v3_1` structural tag `format`, dumped."""
        tags: list[dict[str, Any]] = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            begin, end = cls._call_tag(function["name"])
            tags.append({"type": "tag", "begin": begin, "content": json_schema_format(schema), "end": end})
        separator = "" if cls.v31 else "\n"
        if choice == "forced":
            tag = tags[0]
            return {
                "type": "tag",
                "begin": TOOL_CALLS_BEGIN + tag["begin"],
                "content": tag["content"],
                "end": tag["end"] + TOOL_CALLS_END,
            }
        calls = {
            "type": "tag",
            "begin": TOOL_CALLS_BEGIN,
            "content": {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": separator,
                "at_least_one": True,
                "stop_after_first": False,
            },
            "end": TOOL_CALLS_END,
        }
        if choice == "required":
            return calls
        if not tags:
            return {"type": "any_text", "excludes": ["<think>", "</think>"]}
        return {
            "type": "triggered_tags",
            "triggers": [TOOL_CALLS_BEGIN],
            "tags": [calls],
            "at_least_one": False,
            "stop_after_first": False,
            "excludes": ["<think>", "</think>"],
        }

    # -- streaming ---------------------------------------------------------------------------------

    def feed(self, st: DeepSeekToolState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Content up to the first `<｜tool▁calls▁begin｜>` or `<｜tool▁call▁begin｜>` (matched as
        text, as batch matches them, across chunk ends); from there on everything is held."""
        if st.holding:
            st.held.append(text)
            return None
        buf = st.look + text
        at = min((i for i in (buf.find(m) for m in _HOLD_FROM) if i >= 0), default=-1)
        if at >= 0:
            st.look, st.holding, st.held = "", True, HeldText(buf[at:])
            out = held.content_before_calls(st, buf[:at])
        else:
            keep = _marker_prefix_len(buf)
            st.look = buf[len(buf) - keep :]
            out = held.content_before_calls(st, buf[: len(buf) - keep])
        return Delta(content=out) if out else None

    def finish_for_request(self, st: DeepSeekToolState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The end of the stream: batch's decision on the held text, its calls whole."""
        if not st.holding:
            # No marker: batch returns the text unchanged (blank content is dropped under
            # required/named, as ChatParser's batch does).
            out, st.ws, st.look = st.ws + st.look, "", ""
            if not out or (not st.released and opts.forces_tool_calls and not out.strip()):
                return None
            return Delta(content=out)
        held = st.held.text()
        st.held, st.holding = HeldText(), False
        called, calls, content = self.extract_tool_calls(held)
        if not called:
            out, st.ws = st.ws + held, ""
            if not st.released and opts.forces_tool_calls and not out.strip():
                return None
            return Delta(content=out)
        tail, st.ws = st.ws + (content or ""), ""
        if not st.released and not tail.strip():
            tail = ""  # whitespace-only content becomes None when there are calls
        deltas: list[ToolCallDelta] = []
        for i, call in enumerate(calls):
            deltas.append(ToolCallDelta(index=i, id=tool_id(i), type="function", name=call.name))
            deltas.append(ToolCallDelta(index=i, arguments=call.arguments))
        if not tail and not deltas:
            return None
        return Delta(content=tail or None, tool_calls=deltas)

    def remaining_args(self, st: DeepSeekToolState) -> str:
        # Calls go out whole at the end: no argument text is ever left unstreamed.
        return ""

    # -- batch -------------------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """`extract_tool_calls`: (tools_called, calls, content)."""
        if TOOL_CALLS_BEGIN not in model_output:
            return False, [], model_output
        calls: list[FunctionCall] = []
        if self.v31:
            for m in _V31_CALL.finditer(model_output):
                calls.append(FunctionCall(name=m.group("function_name"), arguments=m.group("function_arguments")))
            content = model_output[: model_output.find(TOOL_CALLS_BEGIN)]
            return True, calls, content or None
        for m in _V3_CALL.finditer(model_output):
            # ToolCall(type=...) accepts only "function": any other type fails the whole parse.
            if m.group("type") != "function":
                return False, [], model_output
            calls.append(FunctionCall(name=m.group("function_name"), arguments=m.group("function_arguments")))
        start = model_output.find(TOOL_CALLS_BEGIN)
        end = model_output.rfind(TOOL_CALLS_END)
        content = model_output[:start]
        if end != -1:
            content += model_output[end + len(TOOL_CALLS_END) :]
        return True, calls, content or None


@register_tool_parser("deepseek_v31")
class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    structural_tag_model = "deepseek_v3_1"
    v31 = True


@register_reasoning_parser("deepseek_v3")
class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    """`deepseek_r1` when thinking, else vLLM's identity parser (all content)."""

    version = 2  # 2: deepseek_r1's state 3 (markers matched as text) and its batch rules
    state_type = DeepSeekR1State

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("thinking", False)) or bool(template_kwargs.get("enable_thinking", False))

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        return super().prompt_ends_reasoning(prompt_token_ids) if self.thinking_enabled else True

    def stream(self, st: DeepSeekR1State, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        if self.thinking_enabled:
            return super().stream(st, delta_text, delta_ids)
        return (Delta(content=delta_text) if delta_text else None), True

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        return super().extract_content_ids(delta_ids) if self.thinking_enabled else delta_ids

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        if self.thinking_enabled:
            return super().extract(model_output, prompt_token_ids)
        return None, model_output
