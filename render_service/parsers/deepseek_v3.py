"""DeepSeek V3 / V3.1 tool parsers (`deepseek_v3`, `deepseek_v31`) and the `deepseek_v3` reasoning parser.

Tool calls (markers are added tokens of the DeepSeek vocabulary, non-special)::

    V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...
    V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

A streaming re-implementation of vLLM 0.33's `DeepSeekV3ToolParser` / `DeepSeekV31ToolParser`
(`tool_parsers/deepseekv3_tool_parser.py`, `deepseekv31_tool_parser.py`). vLLM re-counts the marker
ids of the whole output and re-matches the open call's text on every chunk; here the counts are two
ints and the open call is matched incrementally, with every decision of vLLM's kept, quirks included:

- until `<｜tool▁calls▁begin｜>` is among the ids, every chunk is content verbatim;
- a chunk that is exactly the `<｜tool▁call▁begin｜>` token starts a call and yields nothing; a
  longer chunk that starts a call yields only the name (its argument text comes with the next update);
- the name is sent once the header matches (V3: `TYPE<sep>NAME\\n`; V3.1: `NAME<sep>`), then argument
  text streams as it grows (V3: after "```json\\n", holding back a trailing run of newlines and
  backticks);
- a chunk that closes a call streams only its text up to the last `"}` (nothing when it has none:
  `{"a": 1}` loses its tail when `1}` and the end marker share a chunk), and content after a call is
  content (with `<｜tool▁calls▁begin｜>`/`<｜tool▁calls▁end｜>` text removed);
- batch uses vLLM's regexes over the whole text (V3 content keeps the text after `<｜tool▁calls▁end｜>`).

State: two counters, flags, and the open call's own text (from its `<｜tool▁call▁begin｜>` to its end
marker, or on while the marker counts say a call is still open; replaced when the next call starts),
never the rest of the output. Per chunk the work is the new text plus, while a call is open, one
anchored regex match over that call's text (vLLM's own per-chunk step, minus the re-count).

`deepseek_v3` reasoning (`DeepSeekV3ReasoningParser`): `deepseek_r1` when the request's
`chat_template_kwargs` has `thinking` or `enable_thinking` truthy, else the identity parser (everything
is content, the prompt always counts as past reasoning).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import (
    Delta,
    FunctionCall,
    RequestOptions,
    ToolCallDelta,
    ToolIdFn,
    json_schema_format,
)
from render_service.parsers.deepseek_r1 import DeepSeekR1ReasoningParser, DeepSeekR1State
from render_service.parsers.protocols import ParserState, ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

TOOL_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
TOOL_CALLS_END = "<｜tool▁calls▁end｜>"
TOOL_CALL_BEGIN = "<｜tool▁call▁begin｜>"
TOOL_CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"

# vLLM's regexes (`.` stops at "\n" only, as in the `regex` module).
_V3_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n(?P<function_arguments>[\s\S]*?)\n```<｜tool▁call▁end｜>"
)
_V3_PORTION = re.compile(
    r"(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n(?P<function_arguments>[\s\S]*[^\n`])"
)
_V3_NAME = re.compile(r"(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n")
_V31_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(?P<function_name>.*?)<｜tool▁sep｜>(?P<function_arguments>[\s\S]*?)<｜tool▁call▁end｜>"
)
_V31_PORTION = re.compile(r"(?P<function_name>.*)<｜tool▁sep｜>(?P<function_arguments>[\s\S]*)")
_V31_NAME = re.compile(r"(?P<function_name>.*)<｜tool▁sep｜>")

LITERAL, FIXED_ARGS, FIXED_NAME, FIXED_NONE = range(4)
# `streamed_args_for_tool` entries whose text is not kept: equal to the last entry's arguments, or
# those plus a closing diff (never a prefix of them). No model argument text starts with NUL.
STREAMED_EQ = "\x00="
STREAMED_LONGER = "\x00+"
PREV_KEPT = "\x00"  # a truthy last entry whose text is not kept (only its truthiness is read)
JSON_FENCE = "\n```json\n"


class DeepSeekToolState(ParserState, tag="deepseek_v3/1"):
    """One stream. `portion` is the open call's text after its `<｜tool▁call▁begin｜>` (vLLM's
    `current_text.split(start)[-1]`), no longer extended once it holds its end marker and the counts balance. `prev_tool_call_arr` is kept as
    its length and its last entry's arguments (`prev_text`, None for an `arguments`-less entry: only
    the last entry is ever read); `streamed_args_for_tool` as its entries from index
    `streamed_base` on (normally one: the entries below `len(prev_tool_call_arr) - 1` are never read)."""

    begun: bool = False  # `<｜tool▁calls▁begin｜>` among the ids
    n_start: int = 0
    n_end: int = 0
    tool_id: int = -1  # current_tool_id
    name_sent: bool = False
    portion: str | None = None  # None: no start marker text seen yet (split()[-1] is the whole text)
    closed: bool = False  # the portion holds an end marker
    n_entries: int = 0
    prev_text: str | None = None
    streamed_base: int = 0
    streamed: list[str] = msgspec.field(default_factory=list)
    # Once the open call's header is complete its match can only grow at the end: `fixed` says how
    # (FIXED_ARGS: arguments from `args_at` on; FIXED_NAME: name only, empty arguments; FIXED_NONE:
    # no match), `portion` then keeps only the text from `cut` on (what is not streamed yet) and
    # `prev_len` stands for `prev_text` (the arguments `full[args_at:args_at + prev_len]`; -1: none).
    fixed: int = 0
    name: str = ""
    args_at: int = 0
    cut: int = 0
    prev_len: int = -1
    line_open: bool = False  # V3.1: no newline yet, a later separator on the first line moves the match
    moved: bool = False  # ... and one did since the last update


@register_tool_parser("deepseek_v3")
class DeepSeekV3ToolParser(ToolParser):
    """`deepseek_v3` (V3 markup, ```json fences); `DeepSeekV31ToolParser` below is `deepseek_v31`."""

    version = 1
    state_type = DeepSeekToolState
    structural_tag_model = "deepseek_r1"  # (strict tool calling: required/named parse like auto)
    v31: ClassVar[bool] = False

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        ids = {m: tokenizer.token_to_id(m) for m in (TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_END)}
        if ids[TOOL_CALLS_BEGIN] is None or ids[TOOL_CALLS_END] is None:
            label = "DeepSeek-V3.1" if self.v31 else "DeepSeek-V3"
            raise ValueError(f"{label} Tool parser could not locate tool call start/end tokens in the tokenizer!")
        self.calls_begin_id: int = ids[TOOL_CALLS_BEGIN]  # type: ignore[assignment]
        self.start_id = ids[TOOL_CALL_BEGIN]
        self.end_id = ids[TOOL_CALL_END]
        self._portion_re = _V31_PORTION if self.v31 else _V3_PORTION
        self._name_re = _V31_NAME if self.v31 else _V3_NAME

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

    def _track(self, st: DeepSeekToolState, text: str) -> None:
        """current_text += text, keeping only what `split(start)[-1]` is read for: the open call.

        Once the call's end marker is in and the marker counts balance, nothing after it is ever
        read (only `split(end)[0]` of it), so the text stops growing there."""
        if TOOL_CALL_BEGIN in text:
            st.portion = text.rsplit(TOOL_CALL_BEGIN, 1)[1]
            st.closed = TOOL_CALL_END in st.portion
            if st.fixed:
                self._leave_fixed(st)
            return
        if st.portion is None or (st.closed and st.n_start <= st.n_end):
            return
        if st.fixed and st.line_open:
            nl = text.find("\n")
            head = text if nl < 0 else text[:nl]
            k = head.rfind(TOOL_SEP)
            if k >= 0:  # the last separator of the first line moved: the arguments start after it
                st.args_at = st.cut + len(st.portion) + k + len(TOOL_SEP)
                st.moved = True
            st.line_open = nl < 0
        st.portion += text
        st.closed = st.closed or TOOL_CALL_END in (text if st.fixed else st.portion)

    def _current_portion(self, st: DeepSeekToolState) -> str:
        """`current_text.split(TOOL_CALL_BEGIN)[-1]`. Without any start marker text (its id arrived but
        its text did not: not with this vocabulary, where the markers are not special) vLLM would
        read the whole output; that text is not kept."""
        return st.portion if st.portion is not None else ""

    def _match(self, portion: str) -> tuple[str, str] | None:
        """(name, arguments) of the open call as vLLM's portion/name regexes read it."""
        m = self._portion_re.match(portion)
        if m:
            return m.group("function_name"), m.group("function_arguments")
        m = self._name_re.match(portion)
        if m:
            # V3.1 stores `groups()` (a tuple) here; unreachable: its portion regex matches whenever
            # the name regex does.
            return m.group("function_name"), ""
        return None

    def feed(self, st: DeepSeekToolState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Without ids no marker is counted (vLLM keys every decision on the ids)."""
        return self._feed(st, text, (), tool_id)

    def feed_for_request(
        self, st: DeepSeekToolState, text: str, token_ids: Sequence[int], tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        return self._feed(st, text, token_ids, tool_id)

    def _feed(
        self, st: DeepSeekToolState, delta_text: str, delta_ids: Sequence[int], tool_id: ToolIdFn
    ) -> Delta | None:
        """`extract_tool_calls_streaming` for one chunk (the tool phase's text and ids)."""
        prev_start, prev_end = st.n_start, st.n_end
        if self.start_id is not None:
            st.n_start += delta_ids.count(self.start_id)
        if self.end_id is not None:
            st.n_end += delta_ids.count(self.end_id)
        cur_start, cur_end = st.n_start, st.n_end
        if not st.begun and self.calls_begin_id in delta_ids:
            st.begun = True
        self._track(st, delta_text)
        if not st.begun:
            return Delta(content=delta_text)
        delta_text = delta_text.replace(TOOL_CALLS_BEGIN, "").replace(TOOL_CALLS_END, "")
        try:
            return self._step(st, delta_text, delta_ids, tool_id, prev_start, prev_end, cur_start, cur_end)
        except _Skip:
            return None
        finally:
            if not st.fixed and st.name_sent and st.portion is not None and not st.closed:
                self._try_fix(st)

    # -- the open call once its header is complete (O(new text) per chunk) -----------------------------

    def _prev_truthy(self, st: DeepSeekToolState) -> bool:
        return st.prev_len > 0 if st.fixed else bool(st.prev_text)

    def _try_fix(self, st: DeepSeekToolState) -> None:
        """Enter the fixed mode when the header can no longer change the match and the kept
        `prev_tool_call_arr` / `streamed_args_for_tool` entries agree with it."""
        portion = st.portion
        assert portion is not None
        if st.tool_id != st.n_entries - 1 or st.streamed_base + len(st.streamed) - 1 != st.tool_id:
            return
        nl = portion.find("\n")
        line_open = nl < 0
        if line_open and not self.v31:
            return
        line1 = portion if line_open else portion[:nl]
        sep = line1.rfind(TOOL_SEP)
        if sep < 0 and line_open:
            return  # a separator may still come
        if sep < 0:
            kind, name, args_at = FIXED_NONE, "", 0
        elif self.v31:
            kind, name, args_at = FIXED_ARGS, line1[:sep], sep + len(TOOL_SEP)
        else:
            fence = portion[nl : nl + len(JSON_FENCE)]
            if fence == JSON_FENCE:
                kind, name, args_at = FIXED_ARGS, line1[sep + len(TOOL_SEP) :], nl + len(JSON_FENCE)
            elif JSON_FENCE.startswith(fence):
                return  # the fence is still arriving
            else:
                kind, name, args_at = FIXED_NAME, line1[sep + len(TOOL_SEP) :], 0
        prev = st.prev_text
        last = st.streamed[-1]
        if kind == FIXED_ARGS:
            if prev and (portion[args_at : args_at + len(prev)] != prev or last != prev):
                return
        elif prev:
            return
        if not prev and last != "":
            return
        st.fixed, st.name, st.args_at = kind, name, args_at
        st.line_open, st.moved = line_open, False
        st.prev_len = -1 if prev is None else len(prev)
        st.prev_text = None
        if prev:
            st.streamed[-1] = STREAMED_EQ
        st.cut = args_at + max(st.prev_len, 0) if kind == FIXED_ARGS else len(portion)
        st.portion = portion[st.cut :]

    def _leave_fixed(self, st: DeepSeekToolState) -> None:
        if st.prev_len >= 0:
            st.prev_text = PREV_KEPT if st.prev_len > 0 else ""
        st.fixed, st.name, st.args_at, st.cut, st.prev_len = LITERAL, "", 0, 0, -1
        st.line_open = st.moved = False

    def _current_args_len(self, st: DeepSeekToolState, tail: str) -> int:
        """Length of the arguments vLLM's portion regex reads (0: only the name regex matches)."""
        assert st.portion is not None
        if self.v31:
            return st.cut + len(tail) - st.args_at
        stripped = tail.rstrip("\n`")
        if stripped:
            return st.cut + len(stripped) - st.args_at
        return max(st.cut - st.args_at, 0)

    def _set_prev(self, st: DeepSeekToolState, length: int) -> None:
        """prev_tool_call_arr[current] = the current arguments; drop the text now streamed."""
        assert st.portion is not None
        st.prev_len = length
        drop = st.args_at + max(length, 0) - st.cut
        if drop > 0:
            st.portion = st.portion[drop:]
            st.cut += drop

    def _emit_fixed(self, st: DeepSeekToolState, cur_len: int) -> Delta | None:
        assert st.portion is not None
        prev_len = st.prev_len
        delta = None
        if st.moved:
            st.moved = False
            if prev_len > 0:
                # vLLM compares the new arguments with the old ones, whose text is gone here:
                # taken as different (they differ unless the text after the new separator
                # repeats them), and the old ones as streamed beyond the new ones.
                st.streamed[-1] = STREAMED_LONGER
                self._set_prev(st, cur_len)
                return None
        if cur_len > 0 and prev_len <= 0:
            start = st.args_at - st.cut
            delta = Delta(tool_calls=[ToolCallDelta(index=st.tool_id, arguments=st.portion[start : start + cur_len])])
            st.streamed[-1] = STREAMED_EQ
        elif cur_len > prev_len > 0:
            start = st.args_at + prev_len - st.cut
            text = st.portion[start : start + cur_len - prev_len]
            delta = Delta(tool_calls=[ToolCallDelta(index=st.tool_id, arguments=text)])
            st.streamed[-1] = STREAMED_EQ
        self._set_prev(st, cur_len)
        return delta

    def _update_fixed(self, st: DeepSeekToolState) -> Delta | None:
        """The update branch (call still open) in the fixed mode."""
        if st.fixed == FIXED_NONE:
            return None
        if st.fixed == FIXED_NAME:
            st.prev_len = 0
            return None
        assert st.portion is not None
        return self._emit_fixed(st, self._current_args_len(st, st.portion))

    def _closing_fixed(self, st: DeepSeekToolState) -> Delta | None:
        """The closing branch with no arguments streamed yet, in the fixed mode: the call's text
        up to its end marker, stripped, matched again."""
        if st.fixed == FIXED_NONE:
            return None
        if st.fixed == FIXED_NAME:
            st.prev_len = 0
            return None
        assert st.portion is not None
        args = st.portion[st.args_at - st.cut :].split(TOOL_CALL_END)[0].rstrip()
        if not self.v31:
            args = args.rstrip("\n`") if args.rstrip("\n`") else ""
        return self._emit_fixed(st, len(args))

    def _step(
        self,
        st: DeepSeekToolState,
        delta_text: str,
        delta_ids: Sequence[int],
        tool_id: ToolIdFn,
        prev_start: int,
        prev_end: int,
        cur_start: int,
        cur_end: int,
    ) -> Delta | None:
        portion: str | None = None
        text_portion: str | None = None
        if cur_start == cur_end and prev_end == cur_end and TOOL_CALL_END not in delta_text:
            return Delta(content=delta_text)

        if TOOL_CALL_END in delta_text:
            # vLLM: (current_text + delta_text).split(start)[-1].split(end)[0].rstrip()
            if TOOL_CALL_BEGIN in delta_text:
                portion = delta_text.rsplit(TOOL_CALL_BEGIN, 1)[1].split(TOOL_CALL_END)[0].rstrip()
            elif st.fixed:
                portion = None  # matched below from the kept tail (`_closing_fixed`)
            else:
                portion = self._current_portion(st).split(TOOL_CALL_END)[0].rstrip()
            delta_text = delta_text.split(TOOL_CALL_END)[0].rstrip()
            text_portion = delta_text.lstrip()

        if cur_start > cur_end and cur_start > prev_start:
            portion = self._current_portion(st) if len(delta_ids) > 1 else None
            text_portion = None
            st.tool_id += 1
            st.name_sent = False
            st.streamed.append("")
        elif cur_start > cur_end and cur_start == prev_start:
            if st.fixed and st.name_sent:
                return self._update_fixed(st)
            portion = self._current_portion(st)
            text_portion = None
        elif cur_start == cur_end and cur_end >= prev_end:
            if st.n_entries == 0:
                return None
            if st.tool_id >= st.n_entries:
                raise _Skip  # IndexError in vLLM: the chunk yields nothing
            if self._prev_truthy(st):  # (tool_id is the last entry's index: entries never run ahead of it)
                if '"}' not in delta_text:
                    return None
                diff = delta_text[: delta_text.rindex('"}')] + '"}'
                last = st.streamed[-1]
                st.streamed[-1] = STREAMED_LONGER if last in (STREAMED_EQ, STREAMED_LONGER) else last + diff
                return Delta(tool_calls=[ToolCallDelta(index=st.tool_id, arguments=diff)])
            if st.fixed and TOOL_CALL_BEGIN not in delta_text:
                return self._closing_fixed(st)
        else:
            text = delta_text.replace(TOOL_CALL_BEGIN, "").replace(TOOL_CALL_END, "")
            return Delta(content=text)

        current: tuple[str, str] | None = None
        if portion:
            current = self._match(portion)
            if current is None:
                return None

        if not st.name_sent:
            if current is None or not current[0]:
                return None
            st.name_sent = True
            return Delta(
                tool_calls=[ToolCallDelta(index=st.tool_id, id=tool_id(st.tool_id), type="function", name=current[0])]
            )

        if portion is None:
            return Delta(content=delta_text) if text_portion is not None else None

        if st.n_entries <= st.tool_id:
            self._append_entry(st, None)
        if st.tool_id >= st.n_entries:
            raise _Skip  # IndexError in vLLM: one `{}` was appended, the chunk yields nothing
        prev = st.prev_text
        cur = current[1] if current is not None else None
        delta: Delta | None = None
        if cur and not prev:
            delta = Delta(tool_calls=[ToolCallDelta(index=st.tool_id, arguments=cur)])
            st.streamed[-1] = cur
        elif cur and prev and cur != prev and len(cur) > len(prev) and cur.startswith(prev):
            delta = Delta(tool_calls=[ToolCallDelta(index=st.tool_id, arguments=cur[len(prev) :])])
            st.streamed[-1] = cur
        st.prev_text = cur  # prev_tool_call_arr[current_tool_id] = current_tool_call
        return delta

    def _append_entry(self, st: DeepSeekToolState, args: str | None) -> None:
        st.n_entries += 1
        st.prev_text = args
        st.prev_len = -1
        while st.streamed_base < st.n_entries - 1 and st.streamed:
            st.streamed.pop(0)
            st.streamed_base += 1

    def remaining_args(self, st: DeepSeekToolState) -> str:
        """`get_remaining_unstreamed_args()`: the last entry's arguments not yet streamed."""
        if not st.n_entries:
            return ""
        index = st.n_entries - 1 - st.streamed_base
        actual = st.streamed[index] if 0 <= index < len(st.streamed) else ""
        if actual in (STREAMED_EQ, STREAMED_LONGER):
            return ""
        if st.fixed:
            expected = "{}" if st.prev_len < 0 else ""  # (a truthy prev always streamed: EQ above)
        else:
            expected = st.prev_text if st.prev_text is not None else "{}"
        return expected[len(actual) :] if expected.startswith(actual) else ""

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


class _Skip(Exception):
    """vLLM's parser raised inside its try block: the chunk yields nothing."""


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
