"""Kimi K3 (`kimi_k3` reasoning and tool parsers): vLLM 0.33's XTML channels, streamed over new text.

K3 writes its turn as XTML elements built from three special tokens (`<|open|>`, `<|close|>`,
`<|sep|>`)::

    <|open|>think<|sep|>REASONING<|close|>think<|sep|>
    <|open|>response<|sep|>CONTENT<|close|>response<|sep|>
    <|open|>tools<|sep|>
      <|open|>call tool="NAME" index="1"<|sep|>
        <|open|>argument key="K" type="string"<|sep|>RAW<|close|>argument<|sep|>
        <|open|>argument key="N" type="number"<|sep|>3<|close|>argument<|sep|>
      <|close|>call<|sep|>
    <|close|>tools<|sep|><|close|>message<|sep|>

Batch answers are vLLM's (`KimiK3ReasoningParser.extract_reasoning`, `KimiK3ToolParser.
extract_tool_calls`, `KimiK3Parser._extract_tool_calls`), with vLLM's regexes (whitespace
tolerated inside a marker), except where vLLM's batch re-reads the output from a response opener
that comes after text a stream has already sent: there our batch is the stream's rule (both batch
extractors run the stream over the whole output as one chunk; docs/parsers.md#kimi-k3). The
streams walk the text once, hold only a possible marker at a chunk end (and leading whitespace,
which a later channel marker would drop), and send each call whole once its block closes, as
vLLM's stream does. vLLM's own stream re-reads the whole text each chunk and does not always add
up to its batch answer (a `<|close|>response<|sep|>` without an opening one ends its content;
without a tool parser it strips the response wrapper that batch keeps when the request has
tools); ours follows batch.

Rules kept from vLLM:
- `thinking` (else `enable_thinking`, default on) in the chat template kwargs; without thinking
  the whole output is content. With thinking, the prompt ends reasoning only when its newest
  think marker (by token ids) is a close.
- Reasoning runs up to the first `<|close|>think<|sep|>`; a leading `<|open|>think<|sep|>` is
  skipped; an output that starts with `<|open|>response<|sep|>` has no reasoning (vLLM's batch:
  one with no think marker and that opener anywhere; ours: reasoning text after other text).
- Content: the body of a `<|open|>response<|sep|>` that starts it (up to `<|close|>response<|sep|>`
  or the tools channel), else the text with `<|close|>response<|sep|>` markers removed; `<|close|>
  message<|sep|>` markers are always removed. A later opener starts the body with the text before
  it kept (vLLM's batch drops that text). A tool parser unwraps the content (once: vLLM's batch
  unwraps twice when the request has no tools); without one the reasoning parser does, unless
  the request has tools and tool_choice is not "none" (`unwraps_content`).
- Calls: each `call` block of the tools channel (up to the first `<|close|>tools<|sep|>`); a block
  without a `tool` attribute gives no call; `type="string"` arguments are the raw text, the others
  JSON-decoded (the raw text when that fails); arguments are `json.dumps(..., ensure_ascii=False)`.
- Render: both parsers set `skip_special_tokens=False` and `spaces_between_special_tokens=False`;
  tool_choice required/named (and strict tools) get vLLM's `kimi_k3` structural tag.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import regex  # type: ignore[import-untyped]

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers import held
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolCallDelta, ToolIdFn, json_schema_format
from render_service.parsers.protocols import ParserState, ReasoningParser, RequestAdjustment, ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
_O, _C, _S = r"<\|open\|>", r"<\|close\|>", r"<\|sep\|>"


def _marker(head: str, word: str) -> str:
    return head + r"\s*" + word + r"\s*" + _S


THINK_OPEN = _marker(_O, "think")
THINK_CLOSE = _marker(_C, "think")
RESPONSE_OPEN = _marker(_O, "response")
RESPONSE_CLOSE = _marker(_C, "response")
MESSAGE_CLOSE = _marker(_C, "message")
TOOLS_OPEN = _marker(_O, "tools")
TOOLS_CLOSE = _marker(_C, "tools")
CALL_OPEN = _O + r"\s*call\s+"
CALL_CLOSE = _marker(_C, "call")

_TEXT_UNTIL_SEP = r"(?:(?!" + _S + r").)*?"
_CALL_RE = regex.compile(
    _O + r"\s*call\s+(?P<attrs>" + _TEXT_UNTIL_SEP + r")" + _S + r"(?P<body>.*?)" + CALL_CLOSE, regex.DOTALL
)
_ARG_RE = regex.compile(
    _O + r"\s*argument\s+(?P<attrs>" + _TEXT_UNTIL_SEP + r")" + _S + r"(?P<val>.*?)" + _marker(_C, "argument"),
    regex.DOTALL,
)
_ATTR_RE = regex.compile(r'(?P<k>\w+)="(?P<v>[^"]*)"')

# One pattern per scanning mode: the markers that matter there, as named alternatives. A
# `search(..., partial=True)` gives the leftmost complete marker, or a partial one at the end of
# the text (to hold until the next chunk decides it).
_LEAD_THINK = regex.compile(r"\s*(?:" + THINK_OPEN + ")")
_LEAD_RESPONSE = regex.compile(r"\s*(?:" + RESPONSE_OPEN + ")")
# (a think opener inside reasoning is held while partial, as vLLM's stream holds it, then sent)
_IN_REASONING = regex.compile(f"(?P<close>{THINK_CLOSE})|(?P<open>{THINK_OPEN})")
_UNWRAP = regex.compile(f"(?P<rc>{RESPONSE_CLOSE})|(?P<mc>{MESSAGE_CLOSE})|(?P<ro>{RESPONSE_OPEN})")
_CONTENT = regex.compile(
    f"(?P<rc>{RESPONSE_CLOSE})|(?P<mc>{MESSAGE_CLOSE})|(?P<to>{TOOLS_OPEN})|(?P<ro>{RESPONSE_OPEN})"
)
_AFTER_RESPONSE = regex.compile(TOOLS_OPEN)
_BETWEEN_CALLS = regex.compile(f"(?P<co>{CALL_OPEN})|(?P<tc>{TOOLS_CLOSE})")
_IN_CALL = regex.compile(f"(?P<cc>{CALL_CLOSE})|(?P<tc>{TOOLS_CLOSE})")

# Content modes (the tool parser's and the reasoning parser's unwrapping).
START, RESPONSE, PLAIN, AFTER_RESPONSE, TOOLS, DONE = range(6)


def _lead(pattern: Any, text: str, finished: bool) -> tuple[bool | None, int]:
    """Whether `text` starts with (whitespace and) the marker `pattern`: (True, end), (False, 0),
    or (None, 0) when only more text can tell (hold it all)."""
    m = pattern.match(text, partial=not finished)
    if m is None:
        return False, 0
    if m.partial:
        return None, 0
    return True, m.end()


def _attrs(text: str) -> dict[str, str]:
    return {m["k"]: m["v"].replace("&quot;", '"').replace("&amp;", "&") for m in _ATTR_RE.finditer(text)}


def decode_call(attrs: str, body: str) -> FunctionCall | None:
    """`KimiK3ToolParser._decode_call`: None for a block without a tool name."""
    name = _attrs(attrs).get("tool", "")
    arguments: dict[str, Any] = {}
    for arg in _ARG_RE.finditer(body):
        arg_attrs = _attrs(arg["attrs"])
        key = arg_attrs.get("key", "")
        raw = arg["val"]
        if arg_attrs.get("type", "string") == "string":
            arguments[key] = raw
        else:
            try:
                arguments[key] = json.loads(raw)
            except json.JSONDecodeError:
                arguments[key] = raw
    if not name:
        return None
    return FunctionCall(name, json.dumps(arguments, ensure_ascii=False))


def _marker_ids(info: TokenizerInfo, head: str, word: str) -> tuple[int, ...] | None:
    """The token ids vLLM's `tokenizer.encode(marker, add_special_tokens=False)` gives."""
    tokenizer = info.tokenizer
    text = f"{head}{word}{SEP}"
    try:
        encoded = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        return None
    ids = getattr(encoded, "ids", encoded)
    return tuple(int(i) for i in ids) or None


def _newest_is(ids: Sequence[int], close: Sequence[int], open_: Sequence[int]) -> bool:
    """vLLM's `_newest_marker(ids, close, open) == 0`: scanning back, a close comes first."""
    n = len(ids)
    for i in range(n - min(len(close), len(open_)), -1, -1):
        if i + len(close) <= n and tuple(ids[i : i + len(close)]) == tuple(close):
            return True
        if i + len(open_) <= n and tuple(ids[i : i + len(open_)]) == tuple(open_):
            return False
    return False


def _no_id(index: int) -> str:
    """A batch answer's calls carry no wire id."""
    return ""


# -- content unwrapping, shared by both parsers --------------------------------------------------------


def unwrap_feed(mode: int, pend: str, text: str, *, tools: bool, finished: bool) -> tuple[int, str, str, int]:
    """The content rules as a stream: what vLLM's batch keeps of the content, sent as it is
    decided. `tools` says whether the tools channel ends the content (the tool parser) or is
    content text (the reasoning parser on its own, as `unwrap` keeps it). Returns (new mode,
    held text, content to send, offset in `pend + text` where the tools channel's calls start,
    or -1)."""
    buf = pend + text
    out: list[str] = []
    pos = 0
    while True:
        if mode == START:
            found, end = _lead(_LEAD_RESPONSE, buf[pos:], finished)
            if found is None:
                return mode, buf[pos:], "".join(out), -1
            if found:
                mode, pos = RESPONSE, pos + end
            else:
                mode = PLAIN
            continue
        if mode in (DONE, AFTER_RESPONSE) and not tools:
            return DONE, "", "".join(out), -1
        if mode == AFTER_RESPONSE:
            m = _AFTER_RESPONSE.search(buf, pos, partial=not finished)
            if m is None:
                return mode, "", "".join(out), -1
            if m.partial:
                return mode, buf[m.start() :], "".join(out), -1
            return TOOLS, "", "".join(out), m.end()
        if mode in (TOOLS, DONE):
            return mode, "", "".join(out), pos if mode == TOOLS else -1
        pattern = _CONTENT if tools else _UNWRAP
        m = pattern.search(buf, pos, partial=not finished)
        if m is None:
            out.append(buf[pos:])
            return mode, "", "".join(out), -1
        out.append(buf[pos : m.start()])
        if m.partial:
            return mode, buf[m.start() :], "".join(out), -1
        pos = m.end()
        if m.lastgroup == "ro":
            if mode == PLAIN:
                # A late opener: the text before it was content and stays so (vLLM's batch keeps
                # only what follows it, which a stream cannot take back); the body follows it.
                mode = RESPONSE
            else:  # a second opener inside the response body is text
                out.append(m.group())
            continue
        if m.lastgroup == "to":
            return TOOLS, "", "".join(out), pos
        if m.lastgroup == "rc":
            if mode == RESPONSE:
                mode = AFTER_RESPONSE if tools else DONE
            # PLAIN: the marker is dropped and the text goes on (batch's `sub`)
        # "mc": always dropped


# -- reasoning -----------------------------------------------------------------------------------------


class KimiK3ReasoningState(ParserState, tag="kimi_k3.reasoning/1"):
    started: bool = False  # past a possible leading `<|open|>think<|sep|>`
    pend: str = ""  # a possible marker (or leading whitespace) not decided yet
    mode: int = START  # content unwrapping (no tool parser)
    cpend: str = ""


@register_reasoning_parser("kimi_k3")
class KimiK3ReasoningParser(ReasoningParser):
    version = 1
    state_type = KimiK3ReasoningState
    # The content after reasoning is unwrapped here when no tool parser runs (vLLM: the reasoning
    # parser's `_content_after_reasoning` in batch, `KimiK3Parser.parse_delta` when streaming).
    unwraps_content = True

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)
        self.open_ids = _marker_ids(tokenizer, OPEN, "think")
        self.close_ids = _marker_ids(tokenizer, CLOSE, "think")

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        thinking = template_kwargs.get("thinking")
        if thinking is None:
            thinking = template_kwargs.get("enable_thinking", True)
        return bool(thinking)

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        request.skip_special_tokens = False
        request.spaces_between_special_tokens = False

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool | None:
        if not self.thinking_enabled:
            return True
        if not self.close_ids or not self.open_ids:
            return False
        return _newest_is(prompt_token_ids, self.close_ids, self.open_ids)

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        return self._stream(st, delta_text, finished=False)

    def _stream(self, st: Any, text: str, *, finished: bool) -> tuple[Delta | None, bool]:
        buf = st.pend + text
        st.pend = ""
        if not st.started:
            found, end = _lead(_LEAD_THINK, buf, finished)
            if found is None:
                st.pend = buf
                return None, False
            if not found:
                # An output that opens the response channel first has no think channel (batch:
                # "response opener without think markers"): all of it is content.
                opens_response, _ = _lead(_LEAD_RESPONSE, buf, finished)
                if opens_response is None:
                    st.pend = buf
                    return None, False
                if opens_response:
                    st.started = True
                    return Delta(content=buf), True
            st.started = True
            buf = buf[end:]
        pos = 0
        while True:
            m = _IN_REASONING.search(buf, pos, partial=not finished)
            if m is None:
                return (Delta(reasoning=buf) if buf else None), False
            if m.partial:
                st.pend = buf[m.start() :]
                return (Delta(reasoning=buf[: m.start()]) if m.start() else None), False
            if m.lastgroup == "open":
                pos = m.end()
                continue
            reasoning, content = buf[: m.start()], buf[m.end() :]
            return Delta(reasoning=reasoning or None, content=content or None), True

    def finish(self, st: Any) -> Delta | None:
        delta, _ = self._stream(st, "", finished=True)
        return delta

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """`extract_reasoning` with the content left raw (`unwrap_content` finishes it: it
        depends on the request), read as the stream reads it (the whole output as one chunk):
        vLLM's answer except where it depends on a marker after text a stream has already sent
        (its think opener and response opener are looked for anywhere, ours only at the start)."""
        if not self.thinking_enabled:
            return None, model_output
        delta, ended = self._stream(self.new_state(), model_output, finished=True)
        reasoning = (delta.reasoning if delta is not None else None) or None
        if not ended:
            return reasoning, None
        return reasoning, (delta.content if delta is not None else None) or ""

    @staticmethod
    def keeps_raw(opts: RequestOptions) -> bool:
        """`_should_preserve_tool_channels`: the request has tools and tool_choice is not none."""
        return opts.has_tools and opts.tool_choice != "none"

    def unwrap_content(self, content: str | None, opts: RequestOptions) -> str | None:
        """`_content_after_reasoning` for a batch answer."""
        if content is None:
            return None
        if self.keeps_raw(opts):
            return content or None
        return unwrap_feed(START, "", content, tools=False, finished=True)[2] or None

    def unwrap_stream(self, st: Any, text: str, opts: RequestOptions, *, finished: bool) -> str:
        """The content of a chunk after reasoning, when no tool parser runs."""
        if self.keeps_raw(opts):
            return text
        st.mode, st.cpend, out, _ = unwrap_feed(st.mode, st.cpend, text, tools=False, finished=finished)
        return out


# -- tools ---------------------------------------------------------------------------------------------


class KimiK3ToolState(ParserState, tag="kimi_k3.tool/1"):
    mode: int = START
    pend: str = ""  # a possible marker (or leading whitespace) not decided yet
    in_call: bool = False
    call: held.HeldText = msgspec.field(
        default_factory=held.HeldText
    )  # the open call block's text, from its `<|open|>call`
    sent: int = 0  # calls sent
    shown: bool = False  # content other than whitespace sent
    blank: str = ""  # whitespace-only content so far: batch drops it when a call is made


@register_tool_parser("kimi_k3")
class KimiK3ToolParser(ToolParser):
    version = 1
    state_type = KimiK3ToolState
    structural_tag_model = "kimi_k3"
    holds_until_finish = True
    # Its batch content replaces the raw text even without calls, and with tool_choice "none" its
    # stream still runs with the calls dropped (`KimiK3Parser._extract_tool_calls[_streaming]`).
    owns_content = True

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        request.skip_special_tokens = False
        request.spaces_between_special_tokens = False

    def feed(self, st: Any, text: str, tool_id: ToolIdFn) -> Delta | None:
        return self._feed(st, text, tool_id, finished=False)

    def feed_for_request(
        self, st: Any, text: str, token_ids: Sequence[int], tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        return self._blank_rule(st, self._feed(st, text, tool_id, finished=False), opts, finished=False)

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        return self._blank_rule(st, self._feed(st, "", tool_id, finished=True), opts, finished=True)

    @staticmethod
    def _blank_rule(st: Any, delta: Delta | None, opts: RequestOptions, *, finished: bool) -> Delta | None:
        """Batch drops a whitespace-only content when calls are made (tool_choice not "none"):
        hold such content until text or the end decides it."""
        if opts.tool_choice == "none" or st.shown:
            return delta
        content = (delta.content if delta is not None else None) or ""
        if content.strip():
            st.shown = True
            content, st.blank = st.blank + content, ""
        else:
            st.blank += content
            content = ""
            if finished and st.sent == 0:
                content, st.blank = st.blank, ""
        if delta is None:
            return Delta(content=content) if content else None
        delta.content = content or None
        return delta if delta.content or delta.tool_calls else None

    def _feed(self, st: Any, text: str, tool_id: ToolIdFn, *, finished: bool) -> Delta | None:
        content = ""
        if st.mode not in (TOOLS, DONE):
            st.mode, pend, content, at = unwrap_feed(st.mode, st.pend, text, tools=True, finished=finished)
            if at < 0:
                st.pend = pend
                return Delta(content=content) if content else None
            text = (st.pend + text)[at:]
            st.pend = ""
        calls = self._calls(st, text, tool_id, finished=finished) if st.mode == TOOLS else []
        if not content and not calls:
            return None
        return Delta(content=content or None, tool_calls=calls)

    def _calls(self, st: Any, text: str, tool_id: ToolIdFn, *, finished: bool) -> list[ToolCallDelta]:
        """The calls whose blocks close in this chunk (the tools channel's text so far is
        `st.pend + text`)."""
        buf = st.pend + text
        st.pend = ""
        out: list[ToolCallDelta] = []
        pos = 0
        while pos < len(buf):
            pattern = _IN_CALL if st.in_call else _BETWEEN_CALLS
            m = pattern.search(buf, pos, partial=not finished)
            if m is None:
                if st.in_call:
                    st.call.append(buf[pos:])
                break
            if m.partial:
                if st.in_call:
                    st.call.append(buf[pos : m.start()])
                st.pend = buf[m.start() :]
                break
            if m.lastgroup == "tc":  # the channel ends; an open call never closes
                st.mode, st.in_call, st.call = DONE, False, held.HeldText()
                break
            if m.lastgroup == "co":
                st.in_call, st.call = True, held.HeldText(m.group())
                pos = m.end()
                continue
            # "cc": does the block now parse (vLLM's regex over the channel from the last call on)?
            st.call.append(buf[pos : m.end()])
            pos = m.end()
            block = st.call.text()
            parsed = _CALL_RE.search(block)
            if parsed is None:
                continue  # e.g. the attributes ran past this close: keep reading the block
            st.in_call, st.call = False, held.HeldText()
            rest = block[parsed.end() :]
            if rest:  # cannot happen with a lazy body, but keep what follows the block
                buf, pos = rest + buf[pos:], 0
            call = decode_call(parsed["attrs"], parsed["body"])
            if call is not None:
                index = st.sent
                st.sent += 1
                out.append(
                    ToolCallDelta(
                        index=index, id=tool_id(index), type="function", name=call.name, arguments=call.arguments
                    )
                )
        return out

    def remaining_args(self, st: Any) -> str:
        return ""  # calls go out whole

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """`KimiK3ToolParser.extract_tool_calls` (tools_called, calls, content), read as the
        stream reads it (the whole output as one chunk): vLLM's answer except where it depends
        on a response channel after text a stream has already sent (vLLM's batch takes the first
        response block anywhere, even after the tools channel, and drops the text before it)."""
        delta = self._feed(KimiK3ToolState(), model_output, _no_id, finished=True)
        if delta is None:
            return False, [], None
        calls = [FunctionCall(c.name or "", c.arguments or "") for c in delta.tool_calls]
        return bool(calls), calls, delta.content or None

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """vLLM's `get_kimi_k3_structural_tag` format, dumped."""
        return structural_tag(tools, strict, choice)


# -- the structural tag (vLLM `tool_parsers/structural_tag_registry.py`, kimi_k3) --------------------------

_JSON_TO_XTML_TYPE = {
    "string": "string",
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "object",
    "array": "array",
}
_STRING_ATOM = r"(?:[^<]|<[^|])"


def _escape_attr(value: Any) -> str:
    return str(value).replace("&", "&amp;").replace('"', "&quot;")


def _bounded_string_regex(prop: dict[str, Any]) -> str | None:
    max_len = prop.get("maxLength")
    min_len = prop.get("minLength", 0)
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 0 or max_len > 4096:
        return None
    if not isinstance(min_len, int) or isinstance(min_len, bool) or min_len < 0 or min_len > max_len:
        min_len = 0
    return _STRING_ATOM + f"{{{min_len},{max_len}}}"


def _argument_tag(key: str, schema: Any, root_defs: dict[str, Any]) -> dict[str, Any] | None:
    prop = schema if isinstance(schema, dict) else {}
    json_type = prop.get("type")
    xtml_type = _JSON_TO_XTML_TYPE.get(json_type) if isinstance(json_type, str) else None
    if xtml_type is None:
        return None
    begin = f'{OPEN}argument key="{_escape_attr(key)}" type="{xtml_type}"{SEP}'
    content: dict[str, Any]
    if xtml_type == "string":
        enum_values = prop.get("enum")
        if enum_values is None and isinstance(prop.get("const"), str):
            enum_values = [prop["const"]]
        if (
            isinstance(enum_values, list)
            and enum_values
            and len(enum_values) <= 256
            and all(isinstance(v, str) for v in enum_values)
            and not any("<|" in v for v in enum_values)
        ):
            branches = [{"type": "const_string", "value": v} for v in enum_values]
            content = branches[0] if len(branches) == 1 else {"type": "or", "elements": branches}
        elif (bounded := _bounded_string_regex(prop)) is not None:
            content = {"type": "regex", "pattern": bounded}
        else:
            content = {"type": "any_text", "excludes": [CLOSE]}
    else:
        embedded = prop
        if root_defs:
            embedded = dict(prop)
            for defs_key, defs_value in root_defs.items():
                embedded.setdefault(defs_key, defs_value)
        content = json_schema_format(embedded)
    return {"type": "tag", "begin": begin, "content": content, "end": f"{CLOSE}argument{SEP}"}


def _permissive_argument_tag() -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": OPEN + "argument ",
        "content": {
            "type": "sequence",
            "elements": [
                {"type": "regex", "pattern": r"[^<]*" + SEP.replace("|", r"\|")},
                {"type": "any_text", "excludes": [CLOSE]},
            ],
        },
        "end": f"{CLOSE}argument{SEP}",
    }


def _arguments_block(parameters: Any) -> dict[str, Any]:
    if not isinstance(parameters, dict):
        return {"type": "star", "content": _permissive_argument_tag()}
    props = parameters.get("properties")
    if not isinstance(props, dict) or not props:
        return {"type": "star", "content": _permissive_argument_tag()}
    root_defs = {k: parameters[k] for k in ("$defs", "definitions") if isinstance(parameters.get(k), dict)}
    tags = []
    for key, prop in props.items():
        tag = _argument_tag(key, prop, root_defs)
        tags.append(tag if tag is not None else _permissive_argument_tag())
    inner = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    required = parameters.get("required")
    if isinstance(required, list) and required:
        return {"type": "plus", "content": inner}
    return {"type": "star", "content": inner}


def _call_tag(function: dict[str, Any], is_strict: bool) -> dict[str, Any]:
    parameters = function.get("parameters")
    schema: Any = (parameters if parameters is not None else True) if is_strict else True
    return {
        "type": "tag",
        "begin": f'{OPEN}call tool="{_escape_attr(function["name"])}" index="',
        "content": {
            "type": "sequence",
            "elements": [
                {"type": "regex", "pattern": "[0-9]+"},
                {"type": "const_string", "value": f'"{SEP}'},
                _arguments_block(schema),
            ],
        },
        "end": f"{CLOSE}call{SEP}",
    }


def structural_tag(tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any]:
    response = [
        {"type": "optional", "content": {"type": "const_string", "value": f"{OPEN}response{SEP}"}},
        {
            "type": "tag",
            "begin": "",
            "content": {"type": "any_text", "excludes": [OPEN, CLOSE, "<|end_of_msg|>"]},
            "end": f"{CLOSE}response{SEP}",
        },
    ]
    trailer = {"type": "optional", "content": {"type": "const_string", "value": f"{CLOSE}message{SEP}"}}
    if not tools:
        return {"type": "sequence", "elements": [*response, trailer]}
    calls = [_call_tag(tool["function"], is_strict) for tool, is_strict in zip(tools, strict, strict=True)]
    if choice == "forced":
        calls = calls[:1]
    channel = {
        "type": "tag",
        "begin": f"{OPEN}tools{SEP}",
        "content": {"type": "tags_with_separator", "tags": calls, "separator": "", "at_least_one": True},
        "end": f"{CLOSE}tools{SEP}",
    }
    tools_part = {"type": "optional", "content": channel} if choice == "auto" else channel
    return {"type": "sequence", "elements": [*response, tools_part, trailer]}
