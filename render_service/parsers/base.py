"""Shared pieces of the native parsers: delta types, request options, tool-call ids, the
`finish_reason` / `tool_choice` / `parallel_tool_calls` rules, small streaming matchers and
structural-tag building blocks. Families reuse these; see `protocols.py` for what a family
implements.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

# -- tool-call ids -------------------------------------------------------------------------------

TOOL_ID_HEX = 16  # vLLM's random ids are `chatcmpl-tool-` + 16 hex digits (utils.random_uuid)


def id_for(request_id: str, choice_index: int, tool_index: int) -> str:
    """Deterministic tool-call id, shaped like vLLM's: any replica derives the same one."""
    digest = hashlib.sha256(f"{request_id}\x00{choice_index}\x00{tool_index}".encode()).hexdigest()
    return f"chatcmpl-tool-{digest[:TOOL_ID_HEX]}"


ToolIdFn = Callable[[int], str]


def tool_ids(request_id: str, choice_index: int = 0) -> ToolIdFn:
    """`tool_index -> id` for one choice of one request."""
    return lambda tool_index: id_for(request_id, choice_index, tool_index)


# -- deltas ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class ToolCallDelta:
    """vLLM's `DeltaToolCall` (function flattened to name/arguments)."""

    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None

    def to_wire(self) -> dict[str, Any]:
        # DeltaToolCall.model_dump(): id, type, index, function{name, arguments}, nulls included.
        return {
            "id": self.id,
            "type": self.type,
            "index": self.index,
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class Delta:
    """vLLM's `DeltaMessage` without `role` (the caller adds it on the first chunk)."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def to_wire(self, role: str | None = None) -> dict[str, Any]:
        # DeltaMessage.model_dump(): role, content, reasoning, tool_calls (dropped when empty).
        out: dict[str, Any] = {"role": role, "content": self.content, "reasoning": self.reasoning}
        if self.tool_calls:
            out["tool_calls"] = [tc.to_wire() for tc in self.tool_calls]
        return out


@dataclass(slots=True)
class FunctionCall:
    name: str
    arguments: str
    id: str | None = None  # an id the family's own format carries (Kimi's `functions.NAME:N`)
    # A family's id shape around the generated id's hex (Hunyuan A13B's `call_` / `call_{i}_`).
    id_prefix: str | None = None

    def call_id(self, tool_id: ToolIdFn, index: int) -> str:
        """The call's id: its own, else `tool_id(index)` (its hex behind `id_prefix` if set)."""
        if self.id:
            return self.id
        generated = tool_id(index)
        return generated if self.id_prefix is None else self.id_prefix + generated.rsplit("-", 1)[-1]


# -- request options -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What the parsers read from a validated `ChatCompletionRequest`.

    `tool_choice` is "none" | "auto" | "required" | None (explicit null) | "named" (then
    `tool_name` holds the forced function).
    """

    tool_choice: str | None = "none"
    tool_name: str | None = None
    has_tools: bool = False
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    # The request's tools (for parsers that coerce arguments to the schema or check names).
    tools: Any = None

    @classmethod
    def from_request(cls, req: Mapping[str, Any] | None) -> RequestOptions:
        """From a chat request dict, applying vLLM's tool_choice default ("auto" with tools)."""
        if req is None:
            return cls()
        tools = req.get("tools")
        if "tool_choice" in req:
            choice = req["tool_choice"]
        else:
            choice = "auto" if tools else "none"
        name = None
        if isinstance(choice, Mapping):
            name = (choice.get("function") or {}).get("name")
            choice = "named"
        include = req.get("include_reasoning")
        return cls(
            tool_choice=choice,
            tool_name=name,
            has_tools=bool(tools),
            parallel_tool_calls=req.get("parallel_tool_calls", True),
            include_reasoning=True if include is None else bool(include),
            tools=tools or None,
        )

    @property
    def forces_tool_calls(self) -> bool:
        return self.tool_choice in ("named", "required")


def keeps_tool_calls(opts: RequestOptions, *, enable_auto_tools: bool, has_tool_parser: bool) -> bool:
    """`message_assembly.keeps_tool_calls`: does the choice return the calls its parser finds?"""
    if opts.forces_tool_calls:
        return True
    if not (enable_auto_tools and has_tool_parser) or opts.tool_choice != "auto":
        return False
    return opts.has_tools


def resolve_finish_reason(engine_finish_reason: str | None, opts: RequestOptions | None, tool_calls_made: bool) -> str:
    """`tool_calls_utils.resolve_finish_reason`."""
    finish_reason = engine_finish_reason or "stop"
    forced_named = opts is not None and opts.tool_choice == "named"
    if tool_calls_made and finish_reason == "stop" and not forced_named:
        return "tool_calls"
    return finish_reason


def filter_parallel(delta: Delta, opts: RequestOptions) -> Delta:
    """`maybe_filter_parallel_tool_calls` on a delta: keep index 0 when parallel calls are off."""
    if opts.parallel_tool_calls is False and delta.tool_calls:
        delta.tool_calls = [tc for tc in delta.tool_calls if tc.index == 0]
    return delta


# -- streaming helpers -----------------------------------------------------------------------------

# `\s` of the `regex` module (vLLM's `re`): Unicode White_Space, i.e. str.isspace() minus the
# four information separators U+001C..U+001F.
REGEX_WS = frozenset(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()) - frozenset("\x1c\x1d\x1e\x1f")
JSON_WS = frozenset(" \t\n\r")


def json_string_body(text: str) -> str:
    """`json.dumps(text, ensure_ascii=False)[1:-1]` (the same C escaper `json.dumps` picks for a
    str) without building a `JSONEncoder` per call: ~10x cheaper on a per-chunk path."""
    return encode_basestring(text)[1:-1]


class Tag:
    """KMP tables for finding a literal tag in a stream with a bounded look-behind.

    The matcher state is one int `k`: the length of the longest suffix of the text seen so far
    that is a proper prefix of the tag (what `partial_tag_overlap` computes), so the held-back
    text is always `tag[:k]`.
    """

    __slots__ = ("_fail", "first", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.first = text[0]
        fail = [0] * (len(text) + 1)
        j = 0
        for i in range(1, len(text)):
            while j and text[i] != text[j]:
                j = fail[j]
            if text[i] == text[j]:
                j += 1
            fail[i + 1] = j
        self._fail = fail

    def advance(self, k: int, c: str) -> int:
        text, fail = self.text, self._fail
        while k and c != text[k]:
            k = fail[k]
        if c == text[k]:
            k += 1
        return k

    def feed(self, k: int, chunk: str) -> tuple[int, str, bool, int]:
        """Feed `chunk` with matcher state `k`.

        Returns (new_k, released, found, consumed): `released` is the text now known not to be
        part of the tag, in order; `found` whether the tag completed; `consumed` how many chars
        of `chunk` were used (all of them unless found).
        """
        text, first, n = self.text, self.first, len(self.text)
        out: list[str] = []
        i, size = 0, len(chunk)
        while i < size:
            if not k:  # nothing held: jump to the next possible tag start
                j = chunk.find(first, i)
                if j == -1:
                    out.append(chunk[i:])
                    return 0, "".join(out), False, size
                if j > i:
                    out.append(chunk[i:j])
                i = j
            c = chunk[i]
            nk = self.advance(k, c)
            if nk == n:
                return 0, "".join(out), True, i + 1
            drop = k + 1 - nk  # chars of held+c that can no longer start the tag
            if drop > 0:
                out.append((text[:k] + c)[:drop])
            k = nk
            i += 1
        return k, "".join(out), False, size


# -- structural tags ----------------------------------------------------------------------------------


def json_schema_format(schema: Any) -> dict[str, Any]:
    """xgrammar's `JSONSchemaFormat(json_schema=schema)`, dumped as vLLM sends it."""
    return {
        "type": "json_schema",
        "json_schema": schema,
        "style": "json",
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


def tool_schema_tags(
    tools: list[dict[str, Any]], strict: list[bool], begin: Callable[[str], str], end: str, style: str
) -> list[dict[str, Any]]:
    """One xgrammar `TagFormat` per tool (begin from the tool's name), its arguments a JSON
    schema in `style`: the tool's parameters when strict (`True` when it has none), else `True`
    (xgrammar's `_get_function_parameters`)."""
    tags = []
    for tool, is_strict in zip(tools, strict, strict=True):
        function = tool["function"]
        parameters = function.get("parameters")
        schema = (parameters if parameters is not None else True) if is_strict else True
        content = {"type": "json_schema", "json_schema": schema, "style": style}
        tags.append({"type": "tag", "begin": begin(function["name"]), "content": content, "end": end})
    return tags


def partial_tag_overlap(text: str, tag: str) -> int:
    """vLLM's `partial_tag_overlap` (used by tests and batch helpers)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
