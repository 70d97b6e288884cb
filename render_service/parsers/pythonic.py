"""Pythonic tool parsers: `pythonic` (vLLM 0.33's `PythonicToolParser`) and `llama4_pythonic`
(`Llama4PythonicToolParser`, the same format optionally wrapped in `<|python_start|>` /
`<|python_end|>`).

Format: the whole tool phase is one Python list of calls, `[get_weather(city='Paris'), f(x=1)]`;
keyword values are literals (strings, numbers, dicts, lists, tuples and sets as lists, f-strings
without placeholders, `true`/`false`/`null`, signed numbers) and become JSON arguments.

Batch (as vLLM): the whole text must match vLLM's call-list regex (1 s timeout) and parse as a list
of calls; otherwise it is all content.

Streaming: vLLM treats the tool phase as a call list when it starts with `[` (llama4: or
`<|python_start|>`) and streams each call's arguments as it re-parses the list on every chunk; it
does not add up to the batch answer when the list never parses whole (text after it, a call that
is not literal, a cut list), where batch makes everything content. Ours holds instead
(`held_calls.LeadingCallsHolder`, docs/parsers.md "Streaming accumulates to the batch answer"): a
tool phase that does not start a call list streams as content (batch finds no calls in it either);
one that does is held to the end of the stream, where the batch extractor decides: the calls
arrive whole, or the text as content.
"""

from __future__ import annotations

import ast
import json
import warnings
from typing import Any

import regex  # type: ignore[import-untyped]

from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.held_calls import LeadingCallsHolder, LeadingCallsState
from render_service.parsers.protocols import ToolParser
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
_JSON_NAMES = {"null": None, "true": True, "false": False}


class _NotACall(Exception):
    """The text is not (yet) a list of literal-argument calls."""


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


class PythonicState(LeadingCallsState, tag="pythonic/2"):
    """The tool phase: undecided, content, or held (`held_calls.LeadingCallsState`)."""


@register_tool_parser("pythonic")
class PythonicToolParser(ToolParser):
    """`pythonic`. Stateless; per-stream data in `PythonicState`. No structural tag model, so
    vLLM's JSON paths serve tool_choice required/named (`forced.py`)."""

    version = 2  # 2: calls held to the end of the stream (held_calls)
    state_type = PythonicState
    holds_until_finish = True
    wrapped = False  # llama4: <|python_start|> ... <|python_end|>

    def _holder(self) -> LeadingCallsHolder:
        return _WRAPPED_HOLDER if self.wrapped else _HOLDER

    def feed(self, st: PythonicState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Content, unless the tool phase starts a call list: then everything is held."""
        return self._holder().feed(st, text)

    def finish_for_request(self, st: PythonicState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The batch decision on a held call list: every call whole, or all of it as content."""
        return self._holder().finish(st, tool_id, opts)

    def remaining_args(self, st: PythonicState) -> str:
        # Calls go out whole at the end: no argument text is ever left unstreamed.
        return ""

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output, wrapped=self.wrapped)


def extract_calls(model_output: str, *, wrapped: bool) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`: the whole text is the call list, or it is content."""
    if wrapped and model_output.startswith(PYTHON_START):
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


def _starts(text: str) -> bool:
    return text.startswith("[")


def _starts_wrapped(text: str) -> bool:
    return text.startswith(("[", PYTHON_START))


def _may_start(text: str) -> bool:
    return not text


def _may_start_wrapped(text: str) -> bool:
    """Nothing yet, or a prefix of the wrapper."""
    return len(text) < len(PYTHON_START) and PYTHON_START.startswith(text)


_HOLDER = LeadingCallsHolder(_starts, _may_start, lambda text: extract_calls(text, wrapped=False))
_WRAPPED_HOLDER = LeadingCallsHolder(
    _starts_wrapped, _may_start_wrapped, lambda text: extract_calls(text, wrapped=True)
)
