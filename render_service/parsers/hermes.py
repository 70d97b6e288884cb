"""Hermes tool parser (`hermes`, alias `qwen3_json`): `<tool_call>{json}</tool_call>`.

A streaming re-implementation of vLLM 0.33's `Hermes2ProToolParser`
(`tool_parsers/hermes_tool_parser.py`). vLLM re-parses the whole accumulated text on every
chunk; this parser consumes only the new text and keeps a constant-size state, yet emits the
same deltas at every chunk boundary:

- content: text before the first `<tool_call>`, holding back a suffix that could be a split
  `<tool_call>` (vLLM's `partial_tag_overlap`); nothing after the first tag is ever content;
- per `<tool_call>` region, in order: the name (first match of `"name"\\s*:\\s*"([^"]+)"`) with
  the tool-call id, then argument text: everything after the first `"arguments"\\s*:\\s*`, minus
  trailing whitespace, minus a partial `</tool_call>`, and minus one closing `}` once the
  region is complete (closed, or valid JSON per `json.loads`), streamed by length diff as vLLM
  does (so malformed JSON streams as raw text);
- a region whose name never appears blocks every later region (vLLM `break`s there);
- `remaining_args()` is `get_remaining_unstreamed_args()`: "{}" when the last region seen never
  streamed arguments, else "".

How the state stays small: the current region is tracked with three incremental matchers
instead of text: the `</tool_call>` look-behind (a KMP state), small NFAs for the two regexes,
and a pushdown validator that answers `json.loads(region.strip())` succeeds. The only text kept
is argument text not emitted yet (trailing whitespace, a held `}`, or arguments that precede the
name in the JSON), never text already sent.

Known difference: vLLM's `json.loads` raises RecursionError (not JSONDecodeError) past ~1000
nesting levels and then drops that chunk's deltas; here deep nesting is validated normally.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from render_service.parsers.base import (
    JSON_WS,
    REGEX_WS,
    Delta,
    FunctionCall,
    Tag,
    ToolCallDelta,
    ToolIdFn,
    json_schema_format,
)
from render_service.parsers.protocols import ParserState, RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_START = Tag(TOOL_CALL_START)
_END = Tag(TOOL_CALL_END)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

# -- JSON validator ---------------------------------------------------------------------------------
# Modes of an incremental validator equivalent to CPython's json.loads(text.strip()).
(
    J_START,  # before the first non-space char
    J_VALUE,  # a value is expected (after ':' or ',' in an array)
    J_ARR_FIRST,  # after '[': value or ']'
    J_OBJ_FIRST,  # after '{': key or '}'
    J_OBJ_KEY,  # after ',' in an object: key
    J_OBJ_COLON,  # after a key: ':'
    J_STR,  # in a string (aux 1 = key string)
    J_STR_ESC,  # after a backslash
    J_STR_U,  # in \uXXXX (aux = digits read * 2 + key)
    J_NUM_MINUS,
    J_NUM_ZERO,
    J_NUM_INT,
    J_NUM_DOT,
    J_NUM_FRAC,
    J_NUM_E,
    J_NUM_ESIGN,
    J_NUM_EXP,
    J_LIT,  # in a literal; `lit` holds the chars still expected
    J_AFTER,  # after a value
    J_DEAD,
) = range(20)

_NUM_ACCEPT = frozenset((J_NUM_ZERO, J_NUM_INT, J_NUM_FRAC, J_NUM_EXP))
_LITERALS = {"t": "rue", "f": "alse", "n": "ull", "N": "aN", "I": "nfinity"}
_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")


class JsonCheck(msgspec.Struct, array_like=True):
    """Incremental "is `json.loads(text.strip())` valid" for a growing text."""

    mode: int = J_START
    stack: str = ""  # open containers, '{' or '['
    aux: int = 0
    lit: str = ""
    bad_ws: bool = False  # a non-JSON whitespace char is pending (only valid if trailing)

    def complete(self) -> bool:
        if self.stack or self.mode == J_DEAD:
            return False
        return self.mode == J_AFTER or self.mode in _NUM_ACCEPT

    def feed(self, text: str) -> None:
        for c in text:
            if self.mode == J_DEAD:
                return
            self._char(c)

    def _value_done(self) -> None:
        self.mode = J_AFTER

    def _start_value(self, c: str) -> None:
        if c == '"':
            self.mode, self.aux = J_STR, 0
        elif c == "{":
            self.stack += "{"
            self.mode = J_OBJ_FIRST
        elif c == "[":
            self.stack += "["
            self.mode = J_ARR_FIRST
        elif c == "-":
            self.mode = J_NUM_MINUS
        elif c == "0":
            self.mode = J_NUM_ZERO
        elif c in _DIGITS:
            self.mode = J_NUM_INT
        elif c in _LITERALS:
            self.mode, self.lit = J_LIT, _LITERALS[c]
        else:
            self.mode = J_DEAD

    def _close(self, c: str) -> None:
        top = self.stack[-1:] if self.stack else ""
        if (c == "}" and top == "{") or (c == "]" and top == "["):
            self.stack = self.stack[:-1]
            self._value_done()
        else:
            self.mode = J_DEAD

    def _after(self, c: str) -> None:
        # After a complete value: JSON whitespace, ',' or the container's close.
        if c in JSON_WS:
            return
        if not self.stack:
            self.mode = J_DEAD  # "Extra data"
        elif c == ",":
            self.mode = J_OBJ_KEY if self.stack[-1] == "{" else J_VALUE
        elif c in "}]":
            self._close(c)
        else:
            self.mode = J_DEAD

    def _char(self, c: str) -> None:
        mode = self.mode
        # Strings take every char verbatim.
        if mode == J_STR:
            if c == '"':
                if self.aux:
                    self.mode = J_OBJ_COLON
                else:
                    self._value_done()
            elif c == "\\":
                self.mode = J_STR_ESC
            elif c < " ":
                self.mode = J_DEAD  # strict: control characters are invalid in strings
            return
        if mode == J_STR_ESC:
            if c == "u":
                self.mode, self.aux = J_STR_U, self.aux & 1
            elif c in _ESCAPES:
                self.mode = J_STR
            else:
                self.mode = J_DEAD
            return
        if mode == J_STR_U:
            if c not in _HEX:
                self.mode = J_DEAD
                return
            self.aux += 2
            if self.aux >> 1 == 4:
                self.mode, self.aux = J_STR, self.aux & 1
            return
        # Outside strings: whitespace rules of text.strip() + json.loads.
        if c.isspace():
            if mode == J_START:
                return
            if c not in JSON_WS:
                self.bad_ws = True  # fine only if nothing but whitespace follows
                return
            if self.bad_ws:
                return
        elif self.bad_ws:
            self.mode = J_DEAD
            return
        if mode == J_START:
            self._start_value(c)
        elif mode == J_VALUE:
            if c not in JSON_WS:
                self._start_value(c)
        elif mode == J_ARR_FIRST:
            if c == "]":
                self._close(c)
            elif c not in JSON_WS:
                self._start_value(c)
        elif mode in (J_OBJ_FIRST, J_OBJ_KEY):
            if c == '"':
                self.mode, self.aux = J_STR, 1
            elif c == "}" and mode == J_OBJ_FIRST:
                self._close(c)
            elif c not in JSON_WS:
                self.mode = J_DEAD
        elif mode == J_OBJ_COLON:
            if c == ":":
                self.mode = J_VALUE
            elif c not in JSON_WS:
                self.mode = J_DEAD
        elif mode == J_AFTER:
            self._after(c)
        elif mode == J_LIT:
            if c == self.lit[0]:
                self.lit = self.lit[1:]
                if not self.lit:
                    self._value_done()
            else:
                self.mode = J_DEAD
        else:
            self._number(mode, c)

    def _number(self, mode: int, c: str) -> None:
        digit = c in _DIGITS
        if mode == J_NUM_MINUS:
            if c == "0":
                self.mode = J_NUM_ZERO
            elif digit:
                self.mode = J_NUM_INT
            elif c == "I":
                self.mode, self.lit = J_LIT, "nfinity"
            else:
                self.mode = J_DEAD
        elif mode in (J_NUM_DOT, J_NUM_E, J_NUM_ESIGN):
            if digit:
                self.mode = J_NUM_FRAC if mode == J_NUM_DOT else J_NUM_EXP
            elif mode == J_NUM_E and c in "+-":
                self.mode = J_NUM_ESIGN
            else:
                self.mode = J_DEAD
        elif digit and mode in (J_NUM_INT, J_NUM_FRAC, J_NUM_EXP):
            pass
        elif c == "." and mode in (J_NUM_ZERO, J_NUM_INT):
            self.mode = J_NUM_DOT
        elif c in "eE" and mode in (J_NUM_ZERO, J_NUM_INT, J_NUM_FRAC):
            self.mode = J_NUM_E
        elif digit:  # a digit after a leading zero
            self.mode = J_DEAD
        else:
            self.mode = J_AFTER  # the number ended; c belongs to what follows
            self._after(c)


# -- regex matchers -----------------------------------------------------------------------------------
# Leftmost-first streaming equivalents of vLLM's two regexes. A candidate is [state, capture];
# a new candidate starts at every '"'. For these patterns the first candidate to accept is the
# leftmost complete match at that point of the text.

_NAME_LIT = '"name"'
(N_W1, N_W2, N_C0, N_C1) = (10, 11, 12, 13)  # after literal / after ':' / after '"' / capturing


def _name_step(cands: list[list[Any]], c: str) -> str | None:
    """Advance `"name"\\s*:\\s*"([^"]+)"` candidates by one char; returns the name on a match."""
    out: list[list[Any]] = []
    for st, cap in cands:
        if st < len(_NAME_LIT):
            if c == _NAME_LIT[st]:
                out.append([st + 1 if st + 1 < len(_NAME_LIT) else N_W1, cap])
        elif st == N_W1:
            if c in REGEX_WS:
                out.append([st, cap])
            elif c == ":":
                out.append([N_W2, cap])
        elif st == N_W2:
            if c in REGEX_WS:
                out.append([st, cap])
            elif c == '"':
                out.append([N_C0, cap])
        elif st == N_C0:
            if c != '"':
                out.append([N_C1, c])
        elif c == '"':  # N_C1
            return cap
        else:
            out.append([st, cap + c])
    if c == '"':
        out.append([1, ""])
    # Two candidates in one state behave the same from here on: keep the leftmost.
    seen: set[int] = set()
    kept: list[list[Any]] = []
    for cand in out:
        if cand[0] not in seen:
            seen.add(cand[0])
            kept.append(cand)
    cands[:] = kept
    return None


_ARGS_LIT = '"arguments"'
A_W = 20  # after the literal, before ':'


def _args_step(cands: list[int], c: str) -> bool:
    """Advance `"arguments"\\s*:` candidates; True when a match completes."""
    out: list[int] = []
    for st in cands:
        if st < len(_ARGS_LIT):
            if c == _ARGS_LIT[st]:
                out.append(st + 1 if st + 1 < len(_ARGS_LIT) else A_W)
        elif c == ":":
            return True
        elif c in REGEX_WS:
            out.append(st)
    if c == '"':
        out.append(1)
    cands[:] = list(dict.fromkeys(out))
    return False


# -- state ---------------------------------------------------------------------------------------------

PH_CONTENT, PH_REGION, PH_BETWEEN, PH_BLOCKED = range(4)
ARGS_SEARCH, ARGS_WS, ARGS_ON = range(3)


class HermesState(ParserState, tag="hermes/2"):
    """Per-stream state. `k` is the KMP state of the tag being looked for (`<tool_call>` in the
    content and between phases, `</tool_call>` inside a region), so the look-behind is
    `tag[:k]`. `n` counts regions visited (vLLM's `prev_tool_call_arr` length)."""

    phase: int = PH_CONTENT
    k: int = 0
    n: int = 0
    name: str | None = None  # of the current region, once found (then already emitted)
    name_cands: list[list[Any]] = msgspec.field(default_factory=list)  # [regex state, capture so far]
    args_phase: int = ARGS_SEARCH
    args_cands: list[int] = msgspec.field(default_factory=list)
    pend: str = ""  # argument text not streamed yet
    args_sent: bool = False  # the last region streamed some arguments
    json: JsonCheck = msgspec.field(default_factory=JsonCheck)


@register_tool_parser("hermes", aliases=("qwen3_json",))
class HermesToolParser(ToolParser):
    """Stateless code; all per-stream data lives in `HermesState`."""

    version = 2
    state_type = HermesState
    # VLLM_ENFORCE_STRICT_TOOL_CALLING (default on) + this structural tag model: vLLM treats
    # required/named tool_choice like auto for this parser.
    structural_tag_model = "hermes"

    # -- render side ----------------------------------------------------------------------------

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        # The tool-call markers are special tokens in some models: keep them for the parser.
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """`_hermes_style_structural_tag(...).format` dumped: one tag per tool, with and without
        the newlines around the JSON, behind the `<tool_call>` trigger for auto."""
        formats = (
            (TOOL_CALL_START + '\n{"name": "', "}\n" + TOOL_CALL_END),
            (TOOL_CALL_START + '{"name": "', "}" + TOOL_CALL_END),
        )
        tag_list = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            for begin, finish in formats:
                tag_list.append(
                    {
                        "type": "tag",
                        "begin": begin + function["name"] + '", "arguments": ',
                        "content": json_schema_format(schema),
                        "end": finish,
                    }
                )
        if choice == "auto":
            return {
                "type": "triggered_tags",
                "triggers": [TOOL_CALL_START],
                "tags": tag_list,
                "at_least_one": False,
                "stop_after_first": False,
                "excludes": [],
            }
        return {
            "type": "tags_with_separator",
            "tags": tag_list,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": choice == "forced",
        }

    # -- streaming ------------------------------------------------------------------------------

    def feed(self, st: HermesState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """`extract_tool_calls_streaming` for the new text only."""
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        i, size = 0, len(text)
        while i < size:
            phase = st.phase
            if phase == PH_BLOCKED:
                break
            chunk = text[i:]
            if phase == PH_REGION:
                st.k, released, found, used = _END.feed(st.k, chunk)
                if released:
                    self._region_text(st, released, calls, tool_id)
                    if st.phase == PH_BLOCKED:
                        break
                i += used
                if found:
                    self._close_region(st, calls, tool_id)
                continue
            st.k, released, found, used = _START.feed(st.k, chunk)
            if phase == PH_CONTENT and released:
                content.append(released)
            i += used
            if found:
                self._open_region(st)
        if st.phase == PH_REGION and st.name is not None:
            self._emit_args(st, calls, complete=st.json.complete())
        text_out = "".join(content)
        if text_out or calls:
            return Delta(content=text_out or None, tool_calls=calls)
        return None

    def _open_region(self, st: HermesState) -> None:
        st.phase = PH_REGION
        st.k = 0
        st.n += 1  # vLLM appends a `{}` entry for the region
        st.name = None
        st.name_cands = []
        st.args_phase = ARGS_SEARCH
        st.args_cands = []
        st.pend = ""
        st.args_sent = False
        st.json = JsonCheck()

    def _region_text(self, st: HermesState, text: str, calls: list[ToolCallDelta], tool_id: ToolIdFn) -> None:
        """Text known to belong to the current region (not part of `</tool_call>`)."""
        st.json.feed(text)
        if st.name is None:
            cands = st.name_cands
            for c in text:
                found = _name_step(cands, c) if (cands or c == '"') else None
                if found is not None:
                    st.name = found
                    st.name_cands = []
                    calls.append(ToolCallDelta(index=st.n - 1, id=tool_id(st.n - 1), type="function", name=found))
                    break
        phase = st.args_phase
        if phase == ARGS_ON:
            st.pend += text
            return
        j = 0
        if phase == ARGS_SEARCH:
            args_cands = st.args_cands
            for i, c in enumerate(text):
                if (args_cands or c == '"') and _args_step(args_cands, c):
                    j = i + 1
                    break
            else:
                return
            st.args_phase = ARGS_WS
            st.args_cands = []
        # ARGS_WS: the regex's trailing \s* swallows whitespace; the arguments start after it.
        while j < len(text) and text[j] in REGEX_WS:
            j += 1
        if j < len(text):
            st.args_phase = ARGS_ON
            st.pend = text[j:]

    def _emit_args(self, st: HermesState, calls: list[ToolCallDelta], complete: bool) -> None:
        if st.args_phase != ARGS_ON or not st.pend:
            return
        cand = st.pend.rstrip()
        if cand and complete and cand.endswith("}"):
            cand = cand[:-1].rstrip()
        if cand:
            calls.append(ToolCallDelta(index=st.n - 1, arguments=cand))
            st.pend = st.pend[len(cand) :]
            st.args_sent = True

    def _close_region(self, st: HermesState, calls: list[ToolCallDelta], tool_id: ToolIdFn) -> None:
        if st.name is None:
            st.phase = PH_BLOCKED  # vLLM breaks at a nameless region on every later call
            return
        self._emit_args(st, calls, complete=True)  # a closed region counts as complete
        st.phase = PH_BETWEEN
        st.k = 0
        st.name_cands = []
        st.args_cands = []
        st.pend = ""
        st.json = JsonCheck()

    def remaining_args(self, st: HermesState) -> str:
        """`get_remaining_unstreamed_args()` after the last feed."""
        if not st.n or st.args_sent:
            return ""
        return "{}"

    # -- batch ----------------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """`extract_tool_calls`: (tools_called, calls, content)."""
        if TOOL_CALL_START not in model_output:
            return False, [], model_output
        try:
            calls = []
            for match in _TOOL_CALL_RE.findall(model_output):
                obj = json.loads(match[0] if match[0] else match[1])
                name = obj["name"]
                if not isinstance(name, str):  # pydantic's FunctionCall(name: str) rejects it
                    raise TypeError("tool name is not a string")
                calls.append(FunctionCall(name=name, arguments=json.dumps(obj["arguments"], ensure_ascii=False)))
        except Exception:
            return False, [], model_output
        content = model_output[: model_output.find(TOOL_CALL_START)]
        return True, calls, content or None
