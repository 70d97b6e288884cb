"""The composed chat parser: one reasoning parser and/or one tool parser, as vLLM runs them.

`ChatParser` is vLLM 0.33's `DelegatingParser` (`parser/abstract_parser.py`: `parse_delta`,
`parse`, `finalize_generation`, `_flush_engine_parsers`) fused with `ChatStreamProcessor.step`
(`entrypoints/openai/chat_completion/stream_processor.py`): the initial reasoning state from the
prompt (`is_reasoning_end(prompt)`, e.g. `enable_thinking=false` or `</think>` in the prompt), the
reasoning -> tool phase hand-over (the transition chunk's content plus the engine flush), the
finish flush, `include_reasoning=false`, `tool_choice` none/auto/required/named,
`parallel_tool_calls=false` (index 0 only), `tools_streamed` and `resolve_finish_reason`.

Unlike vLLM, nothing is replayed and nothing re-scanned: the parser objects are immutable
tables; each stream's data is a `StreamState` (a few flags plus the reasoning and tool
sub-states) whose size does not grow with the output. `to_obj()` gives plain lists (msgspec
`to_builtins` of the tagged array structs) that resume identically in another process.

The request half (`RequestOptions`) and the tool-call id function are passed to every call, not
stored: they come with every derender request. Nothing here names a family: the registry gives
the classes, and each class answers for its own quirks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from render_service.derender.detokenize import DetokState, TokenizerInfo, detokenize_delta, seed_state
from render_service.parsers import forced, held, raw_content
from render_service.parsers.base import (
    Delta,
    FunctionCall,
    RequestOptions,
    ToolIdFn,
    filter_parallel,
    keeps_tool_calls,
    resolve_finish_reason,
)
from render_service.parsers.protocols import ReasoningParser, RequestAdjustment, ToolParser
from render_service.parsers.registry import reasoning_parser_class, tool_parser_class

# The tag of the composed states: bump when StreamState/ParsedStreamState change shape.
STATE_VERSION = 3  # 3: `raw` (raw_content.RawShadow)


def parser_versions(reasoning: str | None, tool: str | None) -> dict[str, int]:
    """Name -> implementation version, for the config fingerprint."""
    out = {}
    if reasoning:
        out[f"reasoning:{reasoning}"] = reasoning_parser_class(reasoning).version
    if tool:
        out[f"tool:{tool}"] = tool_parser_class(tool).version
    return out


def thinking_enabled(reasoning: str | None, template_kwargs: Mapping[str, Any] | None, tool: str | None = None) -> bool:
    """What the reasoning parser reads from the request's chat template kwargs; without one,
    what a tool parser that builds its grammar from them reads (`tool_thinking_enabled_for`)."""
    if reasoning is None:
        read = getattr(tool_parser_class(tool), "tool_thinking_enabled_for", None) if tool else None
        return bool(read(template_kwargs or {})) if read is not None else True
    return reasoning_parser_class(reasoning).thinking_enabled_for(template_kwargs or {})


def adjust_request(reasoning: str | None, tool: str | None, request: RequestAdjustment) -> RequestAdjustment:
    """`DelegatingParser.adjust_request` (minus structured outputs, see `api.structured`): the
    reasoning parser's, then the tool parser's (`tool` only when auto tool choice is on)."""
    if reasoning is not None:
        reasoning_parser_class(reasoning).adjust_request(request)
    if tool is not None:
        tool_parser_class(tool).adjust_request(request)
    return request


def prompt_ends_reasoning(
    tokenizer: Any, reasoning: str, prompt_token_ids: Sequence[int], template_kwargs: Mapping[str, Any] | None
) -> bool | None:
    """The reasoning parser's `is_reasoning_end(prompt)` for a rendered prompt."""
    parser = _cached_parser(
        TokenizerInfo.of(tokenizer), reasoning, None, False, thinking_enabled(reasoning, template_kwargs)
    )
    assert parser is not None and parser.reasoning is not None
    return parser.reasoning.prompt_ends_reasoning(prompt_token_ids)


class StreamState(msgspec.Struct, array_like=True, tag=STATE_VERSION):
    """Everything one choice's stream needs between chunks (vLLM's `StreamState` minus the
    accumulated text and ids, plus `ChatStreamProcessor`'s counters). `reasoning` and `tool`
    are the families' own `ParserState`s (decoded by their parser classes)."""

    prompt_checked: bool = False
    reasoning_ended: bool = False
    tool_started: bool = False
    has_output: bool = False  # `num_output_tokens > 0`
    tools_streamed: bool = False
    reasoning: Any = None
    tool: Any = None
    # vLLM's JSON paths for tool_choice required/named (parsers that support them), once used
    forced: forced.RequiredScan | None = None
    # An engine tool parser behind a reasoning parser that is not engine-based: the raw content
    # batch returns when no call is accepted (`raw_content`; a `RawShadow`, decoded as the sub-states)
    raw: Any = None

    def to_obj(self, sink: held.HeldSink | None = None) -> list[Any]:
        """Plain lists; held text (`held.HeldText` fields) inline, or as `sink` stores it."""
        return msgspec.to_builtins(self, enc_hook=held.encode_hook(sink))


class ParsedStreamState(msgspec.Struct, array_like=True, tag=STATE_VERSION):
    """The parser path's whole per-choice state: the detokenizer window (special tokens kept)
    and the parser state."""

    detok: DetokState = msgspec.field(default_factory=DetokState)
    parser: StreamState = msgspec.field(default_factory=StreamState)

    def to_obj(self, sink: held.HeldSink | None = None) -> list[Any]:
        """Plain lists; held text (`held.HeldText` fields) inline, or as `sink` stores it (a
        snapshot: only what was appended since the last one is written)."""
        return msgspec.to_builtins(self, enc_hook=held.encode_hook(sink))


class ChatParser:
    """One reasoning parser and/or one tool parser, composed as vLLM's `DelegatingParser`."""

    def __init__(
        self,
        tokenizer: Any,
        reasoning: str | None = None,
        tool: str | None = None,
        *,
        enable_auto_tools: bool = False,
        thinking_enabled: bool = True,
    ) -> None:
        reasoning_cls = reasoning_parser_class(reasoning) if reasoning is not None else None
        tool_cls = tool_parser_class(tool) if tool is not None else None
        self.info = TokenizerInfo.of(tokenizer)
        self.reasoning_name = reasoning
        # vLLM only builds a tool parser with --enable-auto-tool-choice.
        self.tool_name = tool if enable_auto_tools else None
        self.enable_auto_tools = enable_auto_tools
        self.reasoning: ReasoningParser | None = (
            reasoning_cls(self.info, thinking_enabled=thinking_enabled) if reasoning_cls is not None else None
        )
        self.tool: ToolParser | None = tool_cls(self.info) if tool_cls is not None and enable_auto_tools else None
        if self.tool is not None:
            self.tool.reasoning_configured = self.reasoning is not None
            self.tool.thinking_enabled = thinking_enabled
        r, t = self.reasoning, self.tool
        self.engine_based = (r is None or r.engine_based_streaming) and (t is None or t.engine_based_streaming)
        # vLLM's batch returns the raw content when no call is accepted outside the engine path:
        # the stream keeps it beside an engine tool parser that sends calls whole (`raw_content`).
        self.raw_shadow = (
            not self.engine_based and t is not None and t.engine_based_streaming and getattr(t, "calls_whole", False)
        )

    # -- state --------------------------------------------------------------------------------------

    def new_state(self, prompt_token_ids: Sequence[int] | None) -> StreamState:
        """A fresh stream. The prompt check vLLM runs on the first `parse_delta` happens here
        (it is a pure function of the prompt); with None it never runs, as in vLLM."""
        st = StreamState(
            reasoning=self.reasoning.new_state() if self.reasoning is not None else None,
            tool=self.tool.new_state() if self.tool is not None else None,
            raw=raw_content.RawShadow() if self.raw_shadow else None,
        )
        if prompt_token_ids is not None:
            st.prompt_checked = True
            if self.reasoning is None or self.reasoning.stream_prompt_ends_reasoning(st.reasoning, prompt_token_ids):
                st.reasoning_ended = True
            else:
                self.reasoning.adjust_state_from_prompt(st.reasoning, prompt_token_ids)
        return st

    def load_state(self, obj: Any) -> StreamState:
        """A state from `StreamState.to_obj()`, possibly made by another process."""
        try:
            st = msgspec.convert(obj, StreamState)
        except msgspec.ValidationError as exc:
            raise ValueError(f"unsupported parser state: {exc}") from None
        self._load_substates(st)
        return st

    def _load_substates(self, st: StreamState) -> None:
        if (st.reasoning is None) != (self.reasoning is None) or (st.tool is None) != (self.tool is None):
            raise ValueError("parser state does not match this parser configuration")
        try:
            if self.reasoning is not None:
                st.reasoning = self.reasoning.load_state(st.reasoning)
            if self.tool is not None:
                st.tool = self.tool.load_state(st.tool)
            if (st.raw is not None) != self.raw_shadow:
                raise ValueError("parser state does not match this parser configuration")
            if st.raw is not None:
                st.raw = msgspec.convert(st.raw, raw_content.RawShadow, dec_hook=held.decode_hook)
        except msgspec.ValidationError as exc:
            raise ValueError(f"unsupported parser state: {exc}") from None

    # -- streaming ----------------------------------------------------------------------------------

    def keeps_tool_calls(self, opts: RequestOptions) -> bool:
        return keeps_tool_calls(opts, enable_auto_tools=self.enable_auto_tools, has_tool_parser=self.tool is not None)

    def step(
        self,
        st: StreamState,
        delta_text: str,
        delta_token_ids: Sequence[int],
        finish_reason: str | None,
        opts: RequestOptions,
        tool_id: ToolIdFn,
    ) -> tuple[Delta | None, str | None]:
        """`ChatStreamProcessor.step`: the (filtered) delta and the chat `finish_reason`."""
        delta: Delta | None
        if not delta_text and not delta_token_ids and not st.has_output:
            delta = Delta()  # finished without output: the final chunk goes out unparsed
        else:
            delta = self.parse_delta(st, delta_text, delta_token_ids, opts, tool_id, finished=finish_reason is not None)
            if delta is not None and delta.tool_calls:
                if self.keeps_tool_calls(opts):
                    st.tools_streamed = True
                else:
                    delta.tool_calls = []
                    if not delta.content and not delta.reasoning:
                        delta = None
        if delta_token_ids:
            st.has_output = True
        if delta is not None:
            delta = filter_parallel(delta, opts)
        if finish_reason is not None:
            finish_reason = resolve_finish_reason(finish_reason, opts, st.tools_streamed)
        return delta, finish_reason

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
        """`DelegatingParser.parse_delta` on the new text only."""
        rp, tp = self.reasoning, self.tool
        delta: Delta | None = None
        transitioned = False
        # What the tool parser consumes (vLLM: current_text / current_token_ids).
        tool_text, tool_ids_ = delta_text, delta_token_ids
        # Reasoning (or content) that batch still finds after reasoning ended (`after_end`).
        late_reasoning: str | None = None

        if rp is not None and rp.streams_whole_output:
            st.reasoning_ended = True  # batch's reasoning pass runs from the first chunk (`after_end`)
        if (
            rp is not None
            and st.reasoning_ended
            and rp.filters_after_end
            and (tp is None or not tp.engine_based_streaming or rp.streams_whole_output)
        ):
            # Batch runs the reasoning parser over the whole output: so does the stream (an
            # engine tool parser matches the same markers by id itself, and needs their text,
            # unless the reasoning parser streams the whole output: then, as in batch, the tool
            # parser reads the content it leaves, by text).
            late = rp.after_end(st.reasoning, delta_text, delta_token_ids, finished=finished)
            tool_text = delta_text = (late.content or "") if late else ""
            late_reasoning = late.reasoning if late else None
            if rp.streams_whole_output:
                tool_ids_ = ()
        elif rp is not None and not st.reasoning_ended:
            delta, ended = rp.stream(st.reasoning, delta_text, delta_token_ids)
            if ended:
                st.reasoning_ended = True
                transitioned = True
                # The engine buffers post-marker text (e.g. "<" of "<tool_call>"): flush it.
                flush = rp.flush_on_transition(st.reasoning) if rp.engine_based_streaming else None
                handed = ((delta.content if delta else None) or "") + ((flush.content if flush else None) or "")
                tool_ids_ = rp.extract_content_ids(delta_token_ids)
                if self.engine_based and tp is None:
                    if handed:  # no tool phase follows to consume it
                        if delta is None:
                            delta = Delta()
                        delta.content = handed
                else:
                    tool_text = handed

        if tp is not None and st.reasoning_ended:
            st.tool_started = True
            reasoning_from_batch = delta.reasoning if delta else None
            if opts.tool_choice == "none":
                if self.engine_based or tp.owns_content:  # the parser runs, its calls are dropped
                    delta = tp.feed_for_request(st.tool, tool_text, tool_ids_, tool_id, opts)
                    if delta is not None:
                        delta.tool_calls = []
                else:
                    delta = Delta(content=tool_text) if tool_text else None
            elif tp.supports_required_and_named and opts.forces_tool_calls:
                # A whole-output reasoning pass hands over no text while the output is still in
                # reasoning: the JSON paths start at the first content, as vLLM's tool phase does.
                if tool_text or rp is None or not rp.streams_whole_output:
                    delta = self._feed_forced(st, tool_text, opts, tool_id)
            else:  # auto, or required/named parsed like auto (supports_required_and_named=False)
                if st.raw is not None:
                    # Batch runs this parser on the content's text alone (no ids): so does the stream.
                    delta = tp.feed_for_request(st.tool, tool_text, (), tool_id, opts)
                    delta = raw_content.feed(st.raw, tool_text, delta)
                else:
                    delta = tp.feed_for_request(st.tool, tool_text, tool_ids_, tool_id, opts)
            if reasoning_from_batch:
                if delta is None:
                    delta = Delta(reasoning=reasoning_from_batch)
                elif not delta.reasoning:
                    delta.reasoning = reasoning_from_batch

        in_reasoning = rp is not None and not st.reasoning_ended
        in_tools = tp is not None and st.reasoning_ended
        if delta is None and not transitioned and not in_reasoning and not in_tools:
            delta = Delta(content=delta_text) if delta_text or late_reasoning is None else None
        if late_reasoning:
            if delta is None:
                delta = Delta()
            delta.reasoning = (delta.reasoning or "") + late_reasoning
        if rp is not None and tp is None and rp.unwraps_content and st.reasoning_ended:
            delta = self._unwrap(st, delta, opts, finished)

        if finished:
            # finalize_generation: a parser's fallback content for a stream still in reasoning
            if rp is not None and not st.reasoning_ended:
                promoted = rp.fallback_content(st.reasoning)
                if promoted:
                    if delta is None:
                        delta = Delta()
                    delta.content = (delta.content or "") + promoted
            # finalize_generation: append parsed-but-unstreamed tool arguments
            if tp is not None and delta is not None and delta.tool_calls:
                last = delta.tool_calls[-1]
                last.arguments = (last.arguments or "") + tp.remaining_args(st.tool)
            # _flush_engine_parsers: a reasoning engine still in reasoning, then a tool engine
            # (and a parser that holds a possible marker prefix flushes it here too)
            flushes: list[Delta | None] = []
            if rp is not None and not st.reasoning_ended:
                flushes.append(rp.finish(st.reasoning))
            if tp is not None and (tp.engine_based_streaming or tp.holds_until_finish):
                flush = tp.finish_for_request(st.tool, tool_id, opts)
                if st.raw is not None and st.tool_started and self._parses_like_auto(opts):
                    flush = raw_content.finish(st.raw, flush, forced=opts.forces_tool_calls)
                flushes.append(flush)
            for flush in flushes:
                if flush is None:
                    continue
                if delta is None:
                    delta = flush
                    continue
                if flush.content:
                    delta.content = (delta.content or "") + flush.content
                if flush.reasoning:
                    delta.reasoning = (delta.reasoning or "") + flush.reasoning
                if flush.tool_calls:
                    delta.tool_calls = delta.tool_calls + flush.tool_calls

        if delta is not None and not opts.include_reasoning:
            delta.reasoning = None
            if not delta.content and not delta.tool_calls:
                delta = None
        return delta

    def _parses_like_auto(self, opts: RequestOptions) -> bool:
        """Whether the tool phase runs the tool parser as for tool_choice auto."""
        tp = self.tool
        return (
            tp is not None
            and opts.tool_choice != "none"
            and not (tp.supports_required_and_named and opts.forces_tool_calls)
        )

    def _unwrap(self, st: StreamState, delta: Delta | None, opts: RequestOptions, finished: bool) -> Delta | None:
        """The content after reasoning through the reasoning family's unwrapping (no tool parser)."""
        assert self.reasoning is not None
        raw = delta.content if delta is not None else None
        if not raw and not finished:
            return delta if delta is not None and (delta.reasoning or delta.tool_calls) else None
        shown = self.reasoning.unwrap_stream(st.reasoning, raw or "", opts, finished=finished)
        if delta is None:
            delta = Delta()
        delta.content = shown or None
        return delta if delta.content or delta.reasoning or delta.tool_calls else None

    def _feed_forced(self, st: StreamState, text: str, opts: RequestOptions, tool_id: ToolIdFn) -> Delta | None:
        """`extract_named_tool_call_streaming` / `extract_required_tool_call_streaming`."""
        if st.forced is None:
            st.forced = forced.RequiredScan()
        if opts.tool_choice == "named":
            return forced.named_feed(st.forced, text, opts.tool_name or "", tool_id)
        if self.engine_based:
            # vLLM's engine-based stream state keeps no text: each chunk is scanned on its own.
            return forced.required_feed(forced.RequiredScan(), text, tool_id)
        return forced.required_feed(st.forced, text, tool_id)

    # -- batch --------------------------------------------------------------------------------------

    def parse(
        self,
        model_output: str,
        opts: RequestOptions,
        prompt_token_ids: Sequence[int] | None = None,
        output_token_ids: Sequence[int] = (),
    ) -> tuple[str | None, str | None, list[FunctionCall] | None]:
        """`DelegatingParser.parse`: (reasoning, content, tool_calls).

        `model_output` is the decoded text with special tokens kept. `prompt_token_ids` is what
        vLLM passes to `set_prompt_token_ids` (batch derender: `generate_response.prompt_token_ids`,
        possibly None); `qwen3` and the engine families read it, to start in content when the
        prompt closes reasoning. `output_token_ids` are the choice's ids
        (`model_output_token_ids`: Harmony parses those).
        """
        if self.reasoning is not None:
            reasoning, content = self.reasoning.extract(model_output, prompt_token_ids)
            # A tool parser that owns the content unwraps it itself (once, as the stream does).
            if self.reasoning.unwraps_content and not (self.tool is not None and self.tool.owns_content):
                content = self.reasoning.unwrap_content(content, opts)
        else:
            reasoning, content = None, model_output
        tool_calls, content = self._extract_tool_calls(content, opts)
        return reasoning, content, tool_calls

    def parse_batch(
        self,
        model_output: str,
        opts: RequestOptions,
        prompt_token_ids: Sequence[int] | None = None,
        output_token_ids: Sequence[int] = (),
        stream_prompt_token_ids: Sequence[int] | None = None,
    ) -> tuple[str | None, str | None, list[FunctionCall] | None]:
        """`parse` for the batch derender: where the reasoning parser sets
        `batch_follows_prompt_end` and `stream_prompt_token_ids` (the prompt a stream of the same
        request checks: the request's `prompt_token_ids`, else the generate response's) closes
        reasoning, the whole output is content, as the stream sends it (vLLM's batch would still
        read reasoning out of it: a deliberate difference, docs/parsers.md). Where it sets
        `batch_reads_stream_prompt`, its `extract` reads `stream_prompt_token_ids`."""
        rp = self.reasoning
        if (
            rp is not None
            and rp.batch_follows_prompt_end
            and stream_prompt_token_ids is not None
            and rp.stream_prompt_ends_reasoning(rp.new_state(), stream_prompt_token_ids)
        ):
            tool_calls, content = self._extract_tool_calls(model_output, opts)
            return None, content, tool_calls
        if rp is not None and rp.batch_reads_stream_prompt:
            prompt_token_ids = stream_prompt_token_ids
        return self.parse(model_output, opts, prompt_token_ids, output_token_ids)

    def _extract_tool_calls(
        self, content: str | None, opts: RequestOptions
    ) -> tuple[list[FunctionCall] | None, str | None]:
        tp = self.tool
        if tp is None:
            return [], content
        if opts.tool_choice == "none":
            if self.engine_based or tp.owns_content:  # the parser drops the calls' markup
                return [], tp.extract_for_request(content or "", opts)[2]
            return [], content
        forces = opts.forces_tool_calls
        if tp.owns_content:
            called, calls, parsed_content = tp.extract_for_request(content or "", opts)
            if not called:
                return None, parsed_content
            return calls, None if parsed_content is not None and parsed_content.strip() == "" else parsed_content
        if forces and tp.supports_required_and_named:
            # vLLM's JSON paths: the constrained output is the named call's arguments, or a JSON
            # array of {"name", "parameters"} objects for required.
            if opts.tool_choice == "named":
                if content is None or not content.strip():
                    return [], None
                return [FunctionCall(opts.tool_name or "", content)], None
            return forced.required_calls(content), None
        # Otherwise required/named are parsed like auto (supports_required_and_named=False).
        called, calls, parsed_content = tp.extract_for_request(content if content is not None else "", opts)
        if called:
            if parsed_content and parsed_content.strip() == "":
                parsed_content = None
            return calls, parsed_content
        if forces and (content is None or not content.strip()):
            return [], None
        if self.engine_based:  # incomplete call markup is dropped, as in streaming
            return None, parsed_content or None
        return None, content

    def assemble(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: list[FunctionCall] | None,
        opts: RequestOptions,
        tool_id: ToolIdFn,
    ) -> tuple[str | None, str | None, list[tuple[str, FunctionCall]]]:
        """`assemble_chat_message_fields`: the message's reasoning, content and (id, call)s."""
        if not opts.include_reasoning:
            reasoning = None
        if not self.keeps_tool_calls(opts):
            return reasoning, content, []
        if opts.forces_tool_calls:
            content = content or ""
        calls = list(tool_calls or [])
        if opts.parallel_tool_calls is False:
            calls = calls[:1]
        return reasoning, content, [(call.call_id(tool_id, i), call) for i, call in enumerate(calls)]


def _cached_parser(
    info: TokenizerInfo, reasoning: str | None, tool: str | None, enable_auto_tools: bool, thinking_enabled: bool
) -> ChatParser | None:
    """One parser per configuration, kept on the tokenizer's info (freed with the tokenizer; a
    process-wide LRU kept up to 64 tokenizers alive)."""
    if not reasoning and not (tool and enable_auto_tools):
        return None
    key = ("chat", reasoning, tool, enable_auto_tools, thinking_enabled)
    parser = info.parsers.get(key)
    if parser is None:
        parser = info.parsers[key] = ChatParser(
            info, reasoning, tool, enable_auto_tools=enable_auto_tools, thinking_enabled=thinking_enabled
        )
    return parser


def get_parser(
    tokenizer: Any,
    reasoning: str | None,
    tool: str | None,
    *,
    enable_auto_tools: bool,
    thinking_enabled: bool = True,
) -> ChatParser | None:
    """The composed parser for a server config, or None when no parser runs (plain path).

    `thinking_enabled` is what the reasoning parser class made of the request's chat template
    kwargs (`thinking_enabled(reasoning, kwargs)`: always True for families that do not read
    them, and only those that override `thinking_enabled_for` look at it).
    """
    if reasoning is not None:
        reasoning_parser_class(reasoning)  # unknown names fail here, not inside the cache
    if tool is not None:
        tool_parser_class(tool)
    # A family may return more than a flag from `thinking_enabled_for` (e.g. a small mode int).
    return _cached_parser(TokenizerInfo.of(tokenizer), reasoning, tool, enable_auto_tools, thinking_enabled)


def advance(
    parser: ChatParser,
    state: ParsedStreamState,
    text_token_ids: Sequence[int],
    delta_token_ids: Sequence[int],
    finish_reason: str | None,
    opts: RequestOptions,
    tool_id: ToolIdFn,
    *,
    spaces_between_special_tokens: bool = True,
    release_text: Callable[[str], str] | None = None,
) -> tuple[Delta | None, str | None]:
    """One chunk of the streaming parser path, as `_derender_chat_stream_parsed` runs it:
    detokenize `text_token_ids` (the chunk after `drop_stop_token`) with special tokens kept,
    then `step` with the chunk's full `delta_token_ids`. Updates `state` in place.

    `release_text` maps the decoded text to what the parser sees, as a detokenizing engine's
    stop-string handling does (held back, then cut at the stop string).

    A chunk with no tokens and no `finish_reason` is not stepped (vLLM skips it): (None, None).
    """
    if not delta_token_ids and finish_reason is None:
        return None, None
    text = ""
    reads_text = getattr(parser, "reads_text", True)  # Harmony parses ids only
    if delta_token_ids and reads_text:
        text, state.detok = detokenize_delta(
            parser.info,
            text_token_ids,
            state.detok,
            skip_special_tokens=False,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )
    if release_text is not None and reads_text:
        text = release_text(text)
    return parser.step(state.parser, text, delta_token_ids, finish_reason, opts, tool_id)


def new_parsed_stream(parser: ChatParser, prompt_token_ids: Sequence[int] | None) -> ParsedStreamState:
    """Detokenizer seeded from the prompt tail (special tokens kept) + a fresh parser state."""
    return ParsedStreamState(
        detok=seed_state(parser.info, prompt_token_ids, skip_special_tokens=False),
        parser=parser.new_state(prompt_token_ids),
    )


def load_parsed_stream(parser: ChatParser, obj: Any, stored: Sequence[held.StoredText] = ()) -> ParsedStreamState:
    """A state from `ParsedStreamState.to_obj()`, possibly made by another process; `stored`:
    the snapshot's verified held-text segments, which its held-text fields name by index."""
    try:
        state = msgspec.convert(obj, ParsedStreamState)
    except msgspec.ValidationError as exc:
        raise ValueError(f"unsupported stream state: {exc}") from None
    held.load_with(stored, lambda: parser._load_substates(state.parser))
    return state
