"""gpt-oss output: the `openai_gptoss` reasoning parser and `openai` tool parser, as vLLM 0.33 runs
them through `HarmonyParser` (`vllm/parser/harmony.py`), with a state that can be snapshotted.

vLLM parses Harmony output token by token with `openai_harmony.StreamableParser`: messages are
`<|channel|>C [to=R] [<|constrain|>T]<|message|>TEXT<|end|>` (also `<|call|>`, `<|return|>`),
later ones after `<|start|>assistant`. `analysis` text is reasoning, `final` text (and
`commentary` without a recipient) is content, and a message to `functions.NAME` is a tool call
whose text is the JSON arguments. That parser keeps every token it has seen and cannot be
serialised, so this module re-implements its state machine (the header grammar, the UTF-8
buffering of content deltas, the errors it raises and how vLLM recovers from them) over a small
msgspec state: the current header's tokens, the header it parsed, content bytes that are not yet
valid UTF-8, and the tool-call counter. Each chunk costs O(its tokens); the state resumes
identically in another process.

The registered `openai_gptoss` and `openai` classes are what vLLM's are: markers that select
Harmony parsing (the reasoning parser says reasoning has always ended in the prompt; the tool
parser's structural-tag model is `harmony`). They do not parse text: a model that is not
gpt-oss cannot use them (the service refuses that configuration at start).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import (
    REGEX_WS,
    Delta,
    FunctionCall,
    RequestOptions,
    ToolCallDelta,
    ToolIdFn,
    json_schema_format,
)
from render_service.parsers.chat import ChatParser, StreamState
from render_service.parsers.protocols import ParserState, ReasoningParser, ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

# Harmony's formatting tokens in the gpt-oss encoding (o200k_harmony).
START, MESSAGE, CHANNEL_TEXT, CONSTRAIN_TEXT = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
STOP_TOKENS = ("<|end|>", "<|call|>", "<|return|>")
ROLES = ("user", "assistant", "system", "developer", "tool")
BUILTIN_TOOLS = ("python", "browser", "container")
# Rust's `split_ascii_whitespace`: space, \t, \n, \x0c, \r (not \x0b).
_ASCII_WS = " \t\n\x0c\r"

EXPECT_START, HEADER, CONTENT = 0, 1, 2


class HarmonyError(ValueError):
    """What `StreamableParser.process` raises (vLLM skips the token)."""


# -- the registered names --------------------------------------------------------------------------


class _NoState(ParserState, tag="openai_gptoss/1"):
    pass


@register_reasoning_parser("openai_gptoss")
class GptOssReasoningParser(ReasoningParser):
    """vLLM's `GptOssReasoningParser`: only `is_reasoning_end` (always True); Harmony parses."""

    state_type = _NoState

    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool | None:
        return True

    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        raise NotImplementedError("openai_gptoss parses Harmony output only (gpt-oss models)")

    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        raise NotImplementedError("openai_gptoss parses Harmony output only (gpt-oss models)")


class _NoToolState(ParserState, tag="openai/1"):
    pass


@register_tool_parser("openai")
class GptOssToolParser(ToolParser):
    """vLLM's `GptOssToolParser`: a capability marker; Harmony parses the calls."""

    state_type = _NoToolState
    structural_tag_model = "harmony"

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """`get_harmony_structural_tag(...).format` dumped: optional analysis and commentary
        preambles, then a call to one of the tools in any of Harmony's header spellings (for
        auto, or a final answer)."""
        tags: list[dict[str, Any]] = []
        for tool, is_strict in zip(tools, strict, strict=True):
            function = tool["function"]
            parameters = function.get("parameters")
            schema = (parameters if parameters is not None else True) if is_strict else True
            for pattern in _FUNCTION_CALL_BEGINS:
                for constrain in _JSON_CONSTRAINS:
                    for channel in _TOOL_CALL_CHANNELS:
                        begin = pattern.format(name=function["name"], channel=channel, constrain=constrain)
                        tags.append(
                            {"type": "tag", "begin": begin, "content": json_schema_format(schema), "end": _END_TAG}
                        )
        if choice == "auto":
            tags.extend(
                {
                    "type": "tag",
                    "begin": f"<|channel|>final{constrain}<|message|>",
                    "content": _ANY_TEXT,
                    "end": _END_TAG,
                }
                for constrain in (*_JSON_CONSTRAINS, "")
            )
        return {"type": "sequence", "elements": [*_PREAMBLES, {"type": "or", "elements": tags}]}

    def feed(self, st: Any, text: str, tool_id: ToolIdFn) -> Delta | None:
        raise NotImplementedError("the openai tool parser parses Harmony output only (gpt-oss models)")

    def remaining_args(self, st: Any) -> str:
        return ""

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        raise NotImplementedError("the openai tool parser parses Harmony output only (gpt-oss models)")


HARMONY_ONLY_PARSERS = ("openai_gptoss", "openai")

# vLLM's Harmony structural-tag pieces (parser/harmony.py). The empty end is a stop token
# (<|call|>, <|return|>), which xgrammar may not require under a constraint.
_END_TAG = ["<|end|>", ""]
_JSON_CONSTRAINS = (" json", " <|constrain|>json")
_TOOL_CALL_CHANNELS = ("<|channel|>commentary", "<|channel|>analysis", "<|channel|>final")
_FUNCTION_CALL_BEGINS = (
    " to=functions.{name}{channel}{constrain}<|message|>",
    "{channel} to=functions.{name}{constrain}<|message|>",
)
_ANY_TEXT: dict[str, Any] = {"type": "any_text"}
_PREAMBLES = [
    {
        "type": "optional",
        "content": {
            "type": "sequence",
            "elements": [
                {"type": "tag", "begin": f"<|channel|>{channel}<|message|>", "content": _ANY_TEXT, "end": "<|end|>"},
                {"type": "const_string", "value": "<|start|>assistant"},
            ],
        },
    }
    for channel in ("analysis", "commentary")
]


def adjust_output_format(body: dict[str, Any]) -> dict[str, Any]:
    """`HarmonyParser.adjust_request`'s `_adjust_output_format`: the request's structured output
    (response_format or structured_outputs) becomes a structural tag that lets the model reason
    first and constrains only its `final` message. Returns the body to resolve structured
    outputs from (the same body when it has none)."""
    from render_service.api import structured

    params = structured._from_response_format(body)
    if params is None:
        return body
    final = structured._output_format(params)
    if final is None:
        return body
    content: dict[str, Any]
    if final["type"] == "json_schema":
        content = {
            "type": "or",
            "elements": [
                {"type": "tag", "begin": f"<|channel|>final{c}<|message|>", "content": final, "end": _END_TAG}
                for c in _JSON_CONSTRAINS
            ],
        }
    else:
        content = {"type": "tag", "begin": "<|channel|>final<|message|>", "content": final, "end": _END_TAG}
    tag = {
        "type": "structural_tag",
        "format": structured._normalize_format({"type": "sequence", "elements": [_PREAMBLES[0], content]}),
    }
    cleared = dict.fromkeys(("json", "regex", "choice", "grammar", "json_object"))
    rewritten = {name: params[name] for name in structured.SO_FIELDS} | cleared | {"structural_tag": json.dumps(tag)}
    return {**body, "response_format": None, "structured_outputs": rewritten}


# -- the state machine --------------------------------------------------------------------------


class HarmonyState(ParserState, tag="harmony/1"):
    """One stream's `StreamableParser` state, without the tokens it has no further use for."""

    phase: int = HEADER  # the parser starts in a header whose role is known (assistant)
    first: bool = True  # `next_role` is still assistant (no header parsed yet)
    header: list[int] = msgspec.field(default_factory=list)  # header tokens so far
    # The parsed header of the message in CONTENT.
    role: str | None = None
    channel: str | None = None
    recipient: str | None = None  # normalised as vLLM reads it
    content_type: str | None = None
    # Content bytes held back (an incomplete UTF-8 sequence, or what followed an invalid one), as
    # latin-1 text so the state stays plain JSON.
    pending: str = ""
    # vLLM's `_current_message_tokens` outside content (what it decodes if EOS comes mid-header).
    recovery: list[int] = msgspec.field(default_factory=list)
    next_tool_index: int = 0


class Vocabulary:
    """Token id -> bytes for a byte-level BPE tokenizer (special tokens: their text)."""

    def __init__(self, info: TokenizerInfo) -> None:
        self.info = info
        tokenizer = info.tokenizer
        decoder = getattr(tokenizer, "added_tokens_decoder", None)
        if decoder is None and hasattr(tokenizer, "get_added_tokens_decoder"):
            decoder = tokenizer.get_added_tokens_decoder()
        self.added: dict[int, str] = {tid: tok.content for tid, tok in (decoder or {}).items()}
        self.ids = {content: tid for tid, content in self.added.items()}
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._id_to_token = backend.id_to_token
        self._byte_of = _byte_decoder()
        self._cache: dict[int, bytes] = {}
        missing = [t for t in (START, MESSAGE, *STOP_TOKENS) if t not in self.ids]
        if missing:
            raise ValueError(f"the tokenizer lacks Harmony's tokens {missing}: not a gpt-oss tokenizer")
        self.start, self.message = self.ids[START], self.ids[MESSAGE]
        self.stops = frozenset(self.ids[t] for t in STOP_TOKENS)

    def bytes_of(self, token_id: int) -> bytes:
        hit = self._cache.get(token_id)
        if hit is None:
            if token_id in self.added:
                hit = self.added[token_id].encode()
            else:
                piece = self._id_to_token(token_id)
                hit = bytes(self._byte_of[c] for c in piece) if piece is not None else b""
            self._cache[token_id] = hit
        return hit

    def decode_utf8(self, ids: Sequence[int]) -> str | None:
        """Harmony's `decode_utf8`: the text, or None when the bytes are not valid UTF-8."""
        try:
            return b"".join(self.bytes_of(t) for t in ids).decode("utf-8")
        except UnicodeDecodeError:
            return None


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (what byte-level BPE vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _trim(text: str) -> str:
    return text.strip("".join(REGEX_WS))


def parse_header(text: str, first: bool) -> tuple[str, str | None, str | None, str | None]:
    """`StreamableParser::parse_header_from_tokens`: (role, channel, recipient, content type)."""
    channel = None
    at = text.find(CHANNEL_TEXT)
    if at != -1:
        after = text[at + len(CHANNEL_TEXT) :]
        end = next((i for i, c in enumerate(after) if c in REGEX_WS or c == "<"), len(after))
        if end == 0:
            raise HarmonyError("channel marker present but no channel value found in header")
        channel = after[:end]
        text = text[:at] + after[end:]
    text = _trim(text)
    if CONSTRAIN_TEXT in text:
        text = _trim(text.replace(CONSTRAIN_TEXT, f" {CONSTRAIN_TEXT}"))
    parts = _split_ascii_ws(text)
    if first:
        role = "assistant"
    else:
        if not parts:
            raise HarmonyError("message header did not contain a role")
        role = parts[0]
        if role not in ROLES:
            if len(parts) > 1 or parts[0].startswith("to="):
                parts.pop(0)
                role = "tool"
            else:
                raise HarmonyError(f"Unknown role: {role}")
    if parts and parts[0] == role:
        parts.pop(0)
    recipient = content_type = None
    if parts:
        count = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1:
            recipient = last
        else:
            content_type = last
            if parts:
                raw = parts.pop()
                recipient = raw[3:] if raw.startswith("to=") else raw
    if parts:
        raise HarmonyError(f"unexpected tokens remaining in message header: {parts}")
    return role, channel, recipient, content_type


def _split_ascii_ws(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    for c in text:
        if c in _ASCII_WS:
            if current:
                parts.append("".join(current))
                current = []
        else:
            current.append(c)
    if current:
        parts.append("".join(current))
    return parts


def normalize_recipient(recipient: str | None) -> str | None:
    """`HarmonyParser._normalize_recipient`: drop a constrained format misread as recipient."""
    if recipient is None:
        return None
    cut = recipient.find(CONSTRAIN_TEXT)
    return recipient if cut == -1 else (recipient[:cut].rstrip() or None)


def is_function_recipient(recipient: str | None) -> bool:
    """vLLM's `is_function_recipient` (chat: every non-builtin recipient is a function)."""
    if not recipient or recipient.startswith("<|") or recipient == "assistant":
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    return recipient.split(".", 1)[0] not in BUILTIN_TOOLS


REASONING, CONTENT_SEGMENT, TOOL, IGNORE = "reasoning", "content", "tool", "ignore"


def segment_type(channel: str | None, recipient: str | None) -> str:
    """`_SegmentType.from_channel_and_recipient`."""
    if recipient and is_function_recipient(recipient):
        return TOOL
    if channel == "analysis":
        return REASONING
    if channel == "final" or (channel == "commentary" and recipient is None):
        return CONTENT_SEGMENT
    return IGNORE


class Completed(msgspec.Struct):
    """A message the parser finished; `text` is its held-back tail until a `Collector` prepends
    the deltas it collected (streaming keeps no text)."""

    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str = ""


def process(vocab: Vocabulary, st: HarmonyState, token: int) -> tuple[str | None, Completed | None]:
    """`StreamableParser.process(token)`: (last_content_delta, completed message). Raises
    HarmonyError where Harmony does (the state is then as Harmony leaves it)."""
    if st.phase == EXPECT_START:
        if token != vocab.start:
            raise HarmonyError(f"Unexpected token {token} while expecting start token {vocab.start}")
        st.phase = HEADER
        st.header = []
        return None, None
    if st.phase == HEADER:
        if token != vocab.message:
            st.header.append(token)
            return None, None
        header, st.header = st.header, []
        st.phase = EXPECT_START  # where Harmony is left if the header does not parse
        text = vocab.decode_utf8(header)
        if text is None:
            raise HarmonyError("could not decode header")
        st.role, st.channel, recipient, st.content_type = parse_header(text, st.first)
        st.recipient = normalize_recipient(recipient)
        st.first = False
        st.phase = CONTENT
        st.pending = ""
        return None, None
    if token in vocab.stops:
        return None, _finish(st)
    return _decode_content(st, vocab.bytes_of(token)), None


def _decode_content(st: HarmonyState, data: bytes) -> str | None:
    """oss-harmony's incremental content decoding: emit the valid UTF-8 prefix; an invalid
    sequence becomes U+FFFD and what follows it waits for the next token; an incomplete tail
    waits. None when nothing is emitted."""
    raw = st.pending.encode("latin-1") + data
    try:
        delta, rest = raw.decode("utf-8"), b""
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(raw):
            delta, rest = raw[: exc.start].decode("utf-8"), raw[exc.start :]
        else:
            delta, rest = raw[: exc.start].decode("utf-8") + "\ufffd", raw[exc.end :]
    st.pending = rest.decode("latin-1")
    return delta or None


def _finish(st: HarmonyState) -> Completed:
    """The message in CONTENT is complete; its text ends with the held-back bytes (lossy)."""
    tail = st.pending.encode("latin-1").decode("utf-8", "replace")
    done = Completed(st.role or "assistant", st.channel, st.recipient, st.content_type, tail)
    st.phase, st.pending = EXPECT_START, ""
    st.role = st.channel = st.recipient = st.content_type = None
    return done


def process_eos(st: HarmonyState) -> Completed | None:
    """`StreamableParser.process_eos()`: finishes a message in content; mid-header is an error."""
    if st.phase == HEADER:
        raise HarmonyError("Unexpected EOS while waiting for message header to complete")
    if st.phase == CONTENT:
        return _finish(st)
    return None


class Segment(msgspec.Struct, array_like=True):
    """vLLM's `Segment` (the completed message is only flagged: its text lives in the batch
    collector)."""

    channel: str | None
    recipient: str | None
    delta: str
    completed: Completed | None = None


class Collector:
    """Batch parsing: the finished messages, with their text (streaming keeps no text)."""

    def __init__(self) -> None:
        self.messages: list[Completed] = []
        self.pending: list[str] = []  # the open message's content deltas

    def finish(self, done: Completed) -> None:
        done.text = "".join(self.pending) + done.text
        self.pending = []
        self.messages.append(done)


def feed(vocab: Vocabulary, st: HarmonyState, token_ids: Sequence[int], batch: Collector | None) -> list[Segment]:
    """`HarmonyParser.process_chunk`: one segment per token Harmony accepts (rejected tokens are
    skipped, as vLLM skips them)."""
    segments: list[Segment] = []
    for token in token_ids:
        was_content = st.phase == CONTENT
        try:
            delta, done = process(vocab, st, token)
        except HarmonyError:
            continue
        if done is not None:
            st.recovery = []
            if batch is not None:
                batch.finish(done)
        else:
            if st.phase != CONTENT:
                st.recovery.append(token)
            elif not was_content:
                # A header just parsed: content always ends in a finished message, which clears
                # vLLM's token list before EOS could read it, so nothing needs keeping.
                st.recovery = []
            if batch is not None and delta:
                batch.pending.append(delta)
        segments.append(Segment(st.channel, st.recipient, delta or "", done))
    return segments


def flush(vocab: Vocabulary, st: HarmonyState, batch: Collector | None) -> list[Segment]:
    """`HarmonyParser.flush`: EOS, then a fresh assistant parser. EOS mid-header is Harmony's
    error; vLLM then returns the raw tokens since the last message as `final` content."""
    try:
        done = process_eos(st)
    except HarmonyError:
        text = vocab.info.tokenizer.decode(st.recovery, skip_special_tokens=False)
        done = Completed("assistant", "final", None, None, text)
        _reset(st)
        if batch is not None:
            batch.messages.append(done)
        return [Segment("final", None, text), Segment("final", None, "", done)]
    _reset(st)
    if done is None:
        return []
    if batch is not None:
        batch.finish(done)
    return [Segment(done.channel, done.recipient, "", done)]


def _reset(st: HarmonyState) -> None:
    st.phase, st.first, st.header, st.recovery, st.pending = HEADER, True, [], [], ""
    st.role = st.channel = st.recipient = st.content_type = None


# -- the composed parser --------------------------------------------------------------------------


class HarmonyChatParser(ChatParser):
    """`HarmonyParser` in `ChatParser`'s place: same streaming, batch and assembly interface.

    The stream's `HarmonyState` travels in `StreamState.reasoning` (the slot the composition
    gives a reasoning parser's state)."""

    # `parse_delta` and `parse` read token ids only (as vLLM's `HarmonyParser`), so the streaming
    # path (`parsers.advance`) does not detokenize the chunk for it.
    reads_text = False

    def __init__(self, tokenizer: Any, reasoning: str | None, tool: str | None, *, enable_auto_tools: bool) -> None:
        super().__init__(tokenizer, reasoning, tool, enable_auto_tools=enable_auto_tools)
        self.vocab = Vocabulary(self.info)
        self.engine_based = False

    def new_state(self, prompt_token_ids: Sequence[int] | None) -> StreamState:
        return StreamState(prompt_checked=prompt_token_ids is not None, reasoning_ended=True, reasoning=HarmonyState())

    def _load_substates(self, st: StreamState) -> None:
        try:
            st.reasoning = msgspec.convert(st.reasoning, HarmonyState)
        except msgspec.ValidationError as exc:
            raise ValueError(f"unsupported parser state: {exc}") from None
        st.tool = None

    def parse_delta(
        self,
        st: StreamState,
        delta_text: str,
        delta_token_ids: Sequence[int],
        opts: RequestOptions,
        tool_id: ToolIdFn,
        *,
        finished: bool,
    ) -> Delta | None:
        """`HarmonyParser.parse_delta` (token ids only; the text is not read)."""
        hs: HarmonyState = st.reasoning
        previous = hs.recipient if hs.phase == CONTENT else None
        segments = feed(self.vocab, hs, delta_token_ids, None)
        if finished:
            segments.extend(flush(self.vocab, hs, None))
        content, reasoning = [], []
        calls: list[ToolCallDelta] = []
        for segment in segments:
            if segment.completed is not None:
                previous = None
                continue
            kind = segment_type(segment.channel, segment.recipient)
            if kind == REASONING and self.reasoning is not None:
                reasoning.append(segment.delta)
            elif kind == CONTENT_SEGMENT:
                content.append(segment.delta)
            elif kind == TOOL and self.tool is not None:
                if previous != segment.recipient:
                    assert segment.recipient is not None
                    calls.append(
                        ToolCallDelta(
                            index=hs.next_tool_index,
                            id=tool_id(hs.next_tool_index),
                            type="function",
                            name=segment.recipient.removeprefix("functions."),
                            arguments=segment.delta,
                        )
                    )
                    hs.next_tool_index += 1
                    previous = segment.recipient
                elif segment.delta:
                    if calls:
                        calls[-1].arguments = (calls[-1].arguments or "") + segment.delta
                    else:
                        calls.append(ToolCallDelta(index=hs.next_tool_index - 1, arguments=segment.delta))
        if finished:
            hs.next_tool_index = 0
        delta = Delta(content="".join(content) or None, reasoning="".join(reasoning) or None, tool_calls=calls)
        if not delta.content and not delta.reasoning and not calls:
            return None
        if not opts.include_reasoning:
            delta.reasoning = None
            if not delta.content and not delta.tool_calls:
                return None
        return delta

    def parse(
        self,
        model_output: str,
        opts: RequestOptions,
        prompt_token_ids: Sequence[int] | None = None,
        output_token_ids: Sequence[int] = (),
    ) -> tuple[str | None, str | None, list[FunctionCall] | None]:
        """`HarmonyParser.parse`: (reasoning, content, tool calls) from the output's token ids
        (the text is not read). Tool calls are always extracted; `assemble` decides."""
        token_ids = output_token_ids
        st = HarmonyState()
        batch = Collector()
        feed(self.vocab, st, token_ids, batch)
        flush(self.vocab, st, batch)
        reasoning, content = [], []
        calls: list[FunctionCall] = []
        for message in batch.messages:
            if message.role != "assistant":
                continue
            text = message.text
            kind = segment_type(message.channel, message.recipient)
            if kind == REASONING and self.reasoning is not None and text:
                reasoning.append(text)
            elif kind == CONTENT_SEGMENT and text:
                content.append(text)
            elif kind == TOOL and self.tool is not None:
                assert message.recipient is not None
                arguments = text
                if message.content_type is None or "json" in message.content_type:
                    try:
                        arguments = json.dumps(json.loads(text))
                    except ValueError:
                        arguments = text
                calls.append(FunctionCall(message.recipient.removeprefix("functions."), arguments))
        return "\n".join(reasoning) or None, "\n".join(content) or None, calls or None


def _cached(info: TokenizerInfo, reasoning: str | None, tool: str | None, enable_auto_tools: bool) -> HarmonyChatParser:
    """One parser per configuration, kept on the tokenizer's info (freed with the tokenizer)."""
    key = ("harmony", reasoning, tool, enable_auto_tools)
    parser = info.parsers.get(key)
    if parser is None:
        parser = info.parsers[key] = HarmonyChatParser(info, reasoning, tool, enable_auto_tools=enable_auto_tools)
    return parser


def get_parser(
    tokenizer: Any, reasoning: str | None, tool: str | None, *, enable_auto_tools: bool, thinking_enabled: bool = True
) -> HarmonyChatParser | None:
    """vLLM's `ParserManager` with `is_harmony`: `HarmonyParser` whenever a parser is configured
    (`thinking_enabled` is not read: Harmony always reasons)."""
    if not reasoning and not (tool and enable_auto_tools):
        return None
    return _cached(TokenizerInfo.of(tokenizer), reasoning, tool, enable_auto_tools)
