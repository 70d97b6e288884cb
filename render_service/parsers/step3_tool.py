"""Step3 tool calls (`step3`): vLLM 0.33's `Step3ToolParser` (`tool_parsers/step3_tool_parser.py`).

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
    <steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>

Batch (as vLLM): without `<｜tool_calls_begin｜>` followed somewhere by `<｜tool_calls_end｜>` the
whole text is content. Otherwise the block between them is split at each `<｜tool_call_begin｜>`;
a part that holds `<｜tool_call_end｜>` and, before it, `<｜tool_sep｜>` with the type `function`
and an `<steptml:invoke name="...">` is a call whose `<steptml:parameter>` values are stripped
and cast to the request's tool schema (integer, number, boolean, null); no such call makes the
whole text content. With calls, the content is the text before and after the block, stripped.

Render: with tools and tool_choice not "none", `skip_special_tokens=False` (vLLM's
`adjust_request`), so the markers reach the parser.

Streaming: vLLM's stream sends a call's name as soon as its invoke tag is read and its
arguments when it closes, and streams the text around the block; it does not add up to the
batch answer when the block never closes (batch: all content), a part is not a function call,
or around the content's whitespace. Ours holds instead (`held_calls`, docs/parsers.md): content
streams up to `<｜tool_calls_begin｜>` (a split marker, whitespace-only content and the content's
trailing whitespace held back), everything from the marker on is held, and at the end of the
stream the batch extractor decides: the calls arrive whole, or the held text as content.
Rule 2 (batch follows the stream): with calls, our batch keeps the leading whitespace of content
that has other text before the block (vLLM strips it), as the stream sent it before any call was
known.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from render_service.parsers import held
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, Tag, ToolCallDelta, ToolIdFn
from render_service.parsers.held import HeldText
from render_service.parsers.held_calls import HeldCallsState
from render_service.parsers.protocols import RequestAdjustment, ToolParser
from render_service.parsers.registry import register_tool_parser

TOOL_CALLS_BEGIN = "<｜tool_calls_begin｜>"
TOOL_CALLS_END = "<｜tool_calls_end｜>"
TOOL_CALL_BEGIN = "<｜tool_call_begin｜>"
TOOL_CALL_END = "<｜tool_call_end｜>"
TOOL_SEP = "<｜tool_sep｜>"

_INVOKE_RE = re.compile(r'<steptml:invoke name="([^"]+)">')
_PARAM_RE = re.compile(r'<steptml:parameter name="([^"]+)">(.*?)</steptml:parameter>', re.DOTALL)
_BEGIN = Tag(TOOL_CALLS_BEGIN)


class Step3ToolState(HeldCallsState, tag="step3.tool/1"):
    """`HeldCallsState` (content before the block, then the held text from the marker on) plus
    `trail`: the released content's trailing whitespace, held until other text follows (batch
    strips it when calls follow)."""

    trail: str = ""


def _cast(params: dict[str, Any], name: str, tools: Any) -> dict[str, Any]:
    """vLLM's `_cast_arguments`: the first tool of that name types the parameters."""
    for tool in tools or ():
        function = tool.get("function") or {}
        if function.get("name") != name:
            continue
        properties = (function.get("parameters") or {}).get("properties", {})
        for key, value in params.items():
            if not isinstance(value, str):
                continue
            typ = properties.get(key, {}).get("type")
            if typ == "string":
                params[key] = value.strip()
            elif typ == "integer":
                with contextlib.suppress(ValueError):
                    params[key] = int(value)
            elif typ == "number":
                with contextlib.suppress(ValueError):
                    params[key] = float(value)
            elif typ == "boolean":
                lower = value.lower()
                params[key] = lower == "true" if lower in ("true", "false") else value
            elif typ == "null":
                params[key] = None if value.lower() == "null" else value
        break
    return params


def _calls(block: str, tools: Any) -> list[FunctionCall]:
    calls = []
    for part in block.split(TOOL_CALL_BEGIN):
        if not part or TOOL_CALL_END not in part:
            continue
        body = part.split(TOOL_CALL_END, 1)[0]
        if TOOL_SEP not in body:
            continue
        kind, invoke = body.split(TOOL_SEP, 1)
        if kind.strip() != "function":
            continue
        name = _INVOKE_RE.search(invoke)
        if name is None:
            continue
        params = {key: value.strip() for key, value in _PARAM_RE.findall(invoke)}
        args = json.dumps(_cast(params, name.group(1), tools), ensure_ascii=False)
        calls.append(FunctionCall(name=name.group(1), arguments=args))
    return calls


def extract_calls(model_output: str, tools: Any) -> tuple[bool, list[FunctionCall], str | None]:
    """vLLM's batch `extract_tool_calls`, except that with calls the content keeps its leading
    whitespace when there is other text before the block (rule 2, see the module docstring)."""
    pre, begin, rest = model_output.partition(TOOL_CALLS_BEGIN)
    if not begin or TOOL_CALLS_END not in rest:
        return False, [], model_output
    block, _, post = rest.partition(TOOL_CALLS_END)
    calls = _calls(block, tools)
    if not calls:
        return False, [], model_output
    lead = pre[: len(pre) - len(pre.lstrip())] if pre.strip() else ""
    content = lead + (pre + post).strip()
    return True, calls, content or None


@register_tool_parser("step3")
class Step3ToolParser(ToolParser):
    """Stateless code; all per-stream data lives in `Step3ToolState`. No structural tag model, so
    tool_choice required/named take vLLM's JSON paths (`forced.py`)."""

    version = 1
    state_type = Step3ToolState
    holds_until_finish = True

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        if request.has_tools and request.tool_choice != "none":
            request.skip_special_tokens = False

    def feed(self, st: Step3ToolState, text: str, tool_id: ToolIdFn) -> Delta | None:
        """Content up to `<｜tool_calls_begin｜>`; from there on everything is held."""
        if st.holding:
            st.held.append(text)
            return None
        st.k, released, found, used = _BEGIN.feed(st.k, text)
        out = held.content_before_calls(st, released)
        if st.released:
            # Hold the trailing whitespace: batch strips it when calls follow.
            joined = st.trail + out
            kept = joined.rstrip()
            if kept:
                out, st.trail = kept, joined[len(kept) :]
            else:
                out, st.trail = "", joined
        if found:
            st.holding = True
            st.held = HeldText(TOOL_CALLS_BEGIN + text[used:])
        return Delta(content=out) if out else None

    def finish_for_request(self, st: Step3ToolState, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """The batch decision on the held text: every call whole, or all of it as content."""
        pending = st.ws + st.trail
        st.ws = st.trail = ""
        if not st.holding:
            out = pending + TOOL_CALLS_BEGIN[: st.k]
            st.k = 0
            if not out or (not st.released and opts.forces_tool_calls and not out.strip()):
                return None
            return Delta(content=out)
        text = st.held.text()
        st.held, st.holding = HeldText(), False
        called, calls, _ = extract_calls(text, opts.tools)
        if not called:
            out = pending + text
            if not st.released and opts.forces_tool_calls and not out.strip():
                return None
            return Delta(content=out)
        post = text.partition(TOOL_CALLS_END)[2]
        # batch: (pre + post).strip(), the released part of pre already sent
        tail = (pending + post).rstrip() if st.released else (pending + post).strip()
        deltas: list[ToolCallDelta] = []
        for i, call in enumerate(calls):
            deltas.append(ToolCallDelta(index=i, id=call.call_id(tool_id, i), type="function", name=call.name))
            deltas.append(ToolCallDelta(index=i, arguments=call.arguments))
        return Delta(content=tail or None, tool_calls=deltas)

    def remaining_args(self, st: Step3ToolState) -> str:
        return ""  # calls go out whole at the end

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output, None)

    def extract_for_request(
        self, model_output: str, opts: RequestOptions
    ) -> tuple[bool, list[FunctionCall], str | None]:
        return extract_calls(model_output, opts.tools)
