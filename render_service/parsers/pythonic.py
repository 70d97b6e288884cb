"""Pythonic tool parsers: `pythonic` (vLLM 0.33's `PythonicToolParser`) and `llama4_pythonic`
(`Llama4PythonicToolParser`, the same format optionally wrapped in `<|python_start|>` /
`<|python_end|>`).

Format: the whole tool phase is one Python list of calls, `[get_weather(city='Paris'), f(x=1)]`;
keyword values are literals (strings, numbers, dicts, lists, tuples and sets as lists, f-strings
without placeholders, `true`/`false`/`null`, signed numbers) and become JSON arguments.

Streaming (as vLLM): the tool phase is a call list only when its text starts with `[` (or, for
llama4, `<|python_start|>`); otherwise every delta is content. In a call list each chunk closes the
open brackets and quotes of the text so far (vLLM's `make_valid_python`: nothing while the text ends
between parameters or inside a key), parses it with `ast`, and streams each call's JSON arguments
minus the closing suffix it invented; the first delta of a call carries its id and name.

The call list is parsed again on a chunk that may change its structure, as in vLLM (Python's
grammar decides what parses): O(length of the call list). Inside a plain string argument (the
bulk of a long call) a chunk costs O(new text): the answer is derived from the text's end alone
(`_enter_open_string`), and the string's streamed middle is elided from the state.

Batch (as vLLM): the whole text must match vLLM's call-list regex (1 s timeout) and parse as a list
of calls; otherwise it is all content.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

import msgspec
import regex  # type: ignore[import-untyped]

from render_service.parsers.base import Delta, FunctionCall, ToolCallDelta, ToolIdFn
from render_service.parsers.protocols import ParserState, ToolParser
from render_service.parsers.registry import register_tool_parser

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
REGEX_TIMEOUT_SECONDS = 1  # VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS

# vLLM's PythonicToolParser.TOOL_CALL_REGEX (the batch gate), matched at the start of the text.
TOOL_CALL_REGEX = regex.compile(
    r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*"
    r"([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    regex.DOTALL,
)

UNDECIDED, CONTENT, CALLS = 0, 1, 2
# Text that reads the same inside a Python string literal and `json.dumps(...,
# ensure_ascii=False)` writes as it is, and that cannot end the literal or the line.
_PLAIN = re.compile(r'[^"\'\\\x00-\x1f\x7f-\x9f\u2028\u2029]+')
_PROBE = "\ue003"
ELIDED = "\ue000\ue001\ue002"  # stands for the streamed middle of a long string argument
ELIDE_MIN_CHARS = 64
ELIDE_KEEP_CHARS = 16
# vLLM's closing step counts these in the whole text (string literals included) and finds the
# last "(" / "{" in it: the elided text keeps them, in order.
_COUNTED = frozenset("{(=:,")


def _elided(text: str) -> str:
    """The marker that stands for `text` (an earlier marker in it is absorbed)."""
    return ELIDED + "".join(c for c in text if c in _COUNTED)


_JSON_NAMES = {"null": None, "true": True, "false": False}
_CLOSERS = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}


class _NotACall(Exception):
    """The text is not (yet) a list of literal-argument calls."""


def _escaped(text: str, index: int) -> bool:
    """An odd run of backslashes before `index`."""
    n = 0
    j = index - 1
    while j >= 0 and text[j] == "\\":
        n += 1
        j -= 1
    return n % 2 == 1


def scan_brackets(stack: str, bs_odd: bool, text: str) -> tuple[str, bool]:
    """The bracket / quote scan of `make_valid_python`, resumable: `stack` holds the open
    brackets and quotes, `bs_odd` whether the text so far ends in an odd run of backslashes.
    Raises _NotACall on a mismatched bracket."""
    openers = list(stack)
    for c in text:
        escaped = bs_odd
        bs_odd = (not bs_odd) if c == "\\" else False
        if openers and openers[-1] in "'\"":
            if c == openers[-1] and not escaped:
                openers.pop()
            continue
        if c in "[({":
            openers.append(c)
        elif c in "])}":
            if not openers or openers.pop() != {"]": "[", ")": "(", "}": "{"}[c]:
                raise _NotACall("mismatched brackets")
        elif c in "'\"":
            openers.append(c)
    return "".join(openers), bs_odd


def close_python(text: str, stack: str | None = None) -> tuple[str, str] | None:
    """vLLM's `make_valid_python`: (text completed with closers, the closers), or None when the text
    is too incomplete. Raises _NotACall on mismatched brackets. `stack` is the bracket scan of
    `text` when the caller keeps it incrementally (`scan_brackets`)."""
    if stack is None:
        stack, _ = scan_brackets("", False, text)
    text = text.rstrip()
    if text.endswith("=") or text.endswith(":"):
        return None
    top = stack[-1] if stack else None
    if top == "{":
        before = text[: text.rfind("{")]
        if before.count(":") <= before.count(","):
            return None
    if top == "(":
        before = text[: text.rfind("(")]
        if before.count("=") <= before.count(","):
            return None
    if text.endswith(","):
        text = text[:-1]
    if top == "[" and not text.endswith("[") and not text.endswith(")"):
        return None
    added = "".join(_CLOSERS[c] for c in reversed(stack))
    candidate = text + added
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            module = ast.parse(candidate)
    except SyntaxError:
        return None
    if not module.body:
        return None
    if "}" in added and any(isinstance(node, ast.Set) for node in ast.walk(module)):
        return None  # a dict cut inside a key reads as a set
    return candidate, added


def _literal(node: ast.expr) -> Any:
    """vLLM's `get_parameter_value`."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):
            return node.value
        raise _NotACall("constant without a JSON form")
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise _NotACall("dict keys must be literals")
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values, strict=False)}  # type: ignore[union-attr]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise _NotACall("arguments must be literals")


def _call(node: ast.Call) -> tuple[str, str]:
    """vLLM's `handle_single_tool`: (dotted name, JSON arguments)."""
    parts: list[str] = []
    func: ast.expr = node.func
    if not isinstance(func, (ast.Name, ast.Attribute)):
        raise _NotACall("invalid tool call name")
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        raise _NotACall("invalid tool call name")
    parts.append(func.id)
    arguments = {kw.arg: _literal(kw.value) for kw in node.keywords}
    return ".".join(reversed(parts)), json.dumps(arguments, ensure_ascii=False)


def _calls(source: str) -> list[tuple[str, str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        module = ast.parse(source)
    value = getattr(module.body[0], "value", None)
    if not isinstance(value, ast.List) or not all(isinstance(e, ast.Call) for e in value.elts):
        raise _NotACall("tool output must be a list of function calls")
    return [_call(e) for e in value.elts]  # type: ignore[arg-type]


class PythonicState(ParserState, tag="pythonic/1"):
    """`text`: the tool-phase text (the call list); `cur`: vLLM's current_tool_index; `sent`:
    argument text streamed per call; `called`: vLLM's prev_tool_call_arr was set."""

    mode: int = UNDECIDED
    text: str = ""
    cur: int = -1
    sent: list[str] = msgspec.field(default_factory=list)
    called: bool = False
    stack: str = ""  # the bracket scan of `text` (open brackets and quotes)
    bs_odd: bool = False  # `text` ends in an odd run of backslashes
    mismatched: bool = False  # the scan met a mismatched bracket: no chunk parses any more
    # The call list ends inside an open string argument (see `_enter_open_string`): `pending`
    # is its raw text not streamed yet (the trailing part vLLM's closing step strips or cuts).
    in_open_string: bool = False
    pending: str = ""
    clean: bool = False  # the string's text so far reads the same in Python and in JSON
    raw_start: int = 0  # where that text starts in `text`
    sent_start: int = 0  # ... and in the current call's `sent`


@register_tool_parser("pythonic")
class PythonicToolParser(ToolParser):
    """`pythonic`. Stateless; per-stream data in `PythonicState`. No structural tag model, so
    vLLM's JSON paths serve tool_choice required/named (`forced.py`)."""

    version = 1
    state_type = PythonicState
    wrapped = False  # llama4: <|python_start|> ... <|python_end|>

    def _starts_calls(self, text: str) -> bool:
        return text.startswith("[") or (self.wrapped and text.startswith(PYTHON_START))

    def _may_start_calls(self, text: str) -> bool:
        """Could more text still make this a call list? (nothing yet, or a prefix of the wrapper)"""
        if not text:
            return True
        return self.wrapped and len(text) < len(PYTHON_START) and PYTHON_START.startswith(text)

    def _unwrap(self, text: str) -> str:
        if not self.wrapped:
            return text
        if text.startswith(PYTHON_START):
            text = text[len(PYTHON_START) :]
        if text.endswith(PYTHON_END):
            text = text[: text.rfind(PYTHON_END)]
        return text

    def feed(self, st: PythonicState, text: str, tool_id: ToolIdFn) -> Delta | None:
        if st.mode == CONTENT:
            return Delta(content=text)
        if st.in_open_string:
            if text and _PLAIN.fullmatch(text) and not (self.wrapped and (st.text + text[-16:]).endswith(PYTHON_END)):
                return self._extend_open_string(st, text)
            st.in_open_string = False
            st.pending = ""
        st.text += text
        if not st.mismatched:
            try:
                # The wrapper markers hold no brackets, quotes or backslashes: scanning the raw
                # text gives the scan of vLLM's unwrapped text.
                st.stack, st.bs_odd = scan_brackets(st.stack, st.bs_odd, text)
            except _NotACall:
                st.mismatched = True
        if st.mode == UNDECIDED:
            if self._starts_calls(st.text):
                st.mode = CALLS
            else:
                if not self._may_start_calls(st.text):
                    st.mode, st.text = CONTENT, ""
                return Delta(content=text)
        try:
            delta = self._calls_step(st, tool_id)
        except Exception:  # vLLM logs and skips the chunk (state changes made so far stay)
            return None
        self._enter_open_string(st)
        return delta

    # -- an open string argument, in O(new text) --------------------------------------------------

    def _enter_open_string(self, st: PythonicState) -> None:
        """After a full parse: when the call list ends inside a plain string literal of the
        last call's arguments, text without quotes, backslashes or control characters appended
        to it is appended verbatim to that call's JSON arguments (checked once, by parsing with
        a probe character appended), so later chunks of such text need no parse. What vLLM's
        closing step does to the end of the text (strip whitespace; nothing at a trailing `=`
        or `:`; cut a trailing comma) is then all that decides each chunk's delta."""
        if st.mismatched or st.bs_odd or not st.stack or st.stack[-1] not in "'\"" or st.cur < 0:
            return
        if len(st.sent) != st.cur + 1 or not st.sent[st.cur]:
            return
        quote = st.text.rfind(st.stack[-1])
        if quote <= 0 or st.text[quote - 1].isalnum() or st.text[quote - 1] == st.stack[-1]:
            return  # a prefixed (f/r/b) or triple-quoted literal
        raw = st.text[quote + 1 :]
        try:
            closed = close_python(self._unwrap(st.text + _PROBE), st.stack)
            if closed is None:
                return
            valid, added = closed
            calls = _calls(valid)
        except Exception:
            return
        if len(calls) != st.cur + 1 or ")]" not in added:
            return
        withheld = added[:-2] + ("}" if added[-2] == ")" else "")
        args = calls[-1][1]
        withheld = withheld.replace("'", '"')
        if not args.endswith(withheld):
            return
        args = args[: len(args) - len(withheld)]
        sent = st.sent[st.cur]
        if not args.endswith(_PROBE) or args.count(_PROBE) != 1 or not args.startswith(sent):
            return
        before = args[:-1]
        if len(sent) < len(before) - len(raw):
            return  # the string's start was never streamed (vLLM's stripping held it back)
        if raw and (_PLAIN.fullmatch(raw) is None or not before.endswith(raw)):
            return  # the closing step reads the raw end of the text: it must read as the JSON
        st.in_open_string = True
        st.pending = before[len(sent) :]
        st.clean = True
        st.raw_start = quote + 1
        st.sent_start = len(before) - len(raw)

    def _extend_open_string(self, st: PythonicState, text: str) -> Delta | None:
        st.text += text
        st.pending += text
        kept = st.pending.rstrip()
        if not kept or kept.endswith(("=", ":")):
            return None  # the stripped text ends before this call's unsent part, or is not closed
        if kept.endswith(","):
            kept = kept[:-1]
            if not kept:
                return None
        st.pending = st.pending[len(kept) :]
        st.sent[st.cur] += kept
        sent = st.sent[st.cur]
        keep = ELIDE_KEEP_CHARS
        if st.clean and len(sent) - st.sent_start - keep >= ELIDE_MIN_CHARS:
            # The string's streamed text is plain: nothing reads it again except as part of
            # later parses, where one marker stands for it in the raw and the streamed text
            # alike (every later answer is the same; only this stream's state is affected).
            # The last characters stay: the llama4 end marker is found at the end of the text.
            # The characters vLLM counts stay too (`_elided`).
            cut = len(sent) - st.sent_start - keep
            marker = _elided(sent[st.sent_start : st.sent_start + cut])
            st.text = st.text[: st.raw_start] + marker + st.text[st.raw_start + cut :]
            st.sent[st.cur] = sent[: st.sent_start] + marker + sent[st.sent_start + cut :]
        return Delta(tool_calls=[ToolCallDelta(index=st.cur, arguments=kept)])

    def _calls_step(self, st: PythonicState, tool_id: ToolIdFn) -> Delta | None:
        if st.mismatched:
            return None  # vLLM: make_valid_python raises on every chunk from now on
        closed = close_python(self._unwrap(st.text), st.stack)
        if closed is None:
            return None
        valid, added = closed
        calls = _calls(valid)
        deltas: list[ToolCallDelta] = []
        for index, (name, args) in enumerate(calls):
            if index < st.cur:
                continue
            st.cur = index
            if len(st.sent) == index:
                st.sent.append("")
            complete = index < len(calls) - 1 or ")]" not in added
            if complete:
                st.cur += 1
            withheld = added[:-2] if not complete else ""
            if not complete and added[-2] == ")":
                withheld += "}"  # the call's closing paren: withhold the arguments' brace
            withheld = withheld.replace("'", '"')
            if withheld:
                if not args.endswith(withheld):
                    raise ValueError("arguments do not end with the withheld suffix")
                args = args[: -len(withheld)]
            sent = st.sent[index]
            if not sent:
                delta = ToolCallDelta(index=index, id=tool_id(index), type="function", name=name, arguments=args)
            else:
                diff = args[len(sent) :]
                if not diff:
                    continue
                delta = ToolCallDelta(index=index, arguments=diff)
            deltas.append(delta)
            st.sent[index] += delta.arguments or ""
        if deltas:
            st.called = True
            return Delta(tool_calls=deltas)
        if not added and st.cur > 0:
            return Delta(content="")  # vLLM's empty delta once every call is done
        return None

    def remaining_args(self, st: PythonicState) -> str:
        # vLLM's prev_tool_call_arr is [{"arguments": {}}]: only "{}" minus what call 0 streamed.
        if not st.called:
            return ""
        actual = st.sent[0] if st.sent else ""
        return "{}"[len(actual) :] if "{}".startswith(actual) else ""

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        if self.wrapped and model_output.startswith(PYTHON_START):
            model_output = model_output[len(PYTHON_START) :].replace(PYTHON_END, "")
        try:
            matched = TOOL_CALL_REGEX.match(model_output, timeout=REGEX_TIMEOUT_SECONDS) is not None
        except TimeoutError:
            matched = False
        if not matched:
            return False, [], model_output
        try:
            calls = _calls(model_output)
        except Exception:
            return False, [], model_output
        return True, [FunctionCall(name, args) for name, args in calls], None


@register_tool_parser("llama4_pythonic")
class Llama4PythonicToolParser(PythonicToolParser):
    """`llama4_pythonic`."""

    wrapped = True
