"""What a reasoning or tool parser family implements, and the state struct its streams carry.

A family is one module in `render_service/parsers/` with a class that subclasses
`ReasoningParser` or `ToolParser` and is registered under vLLM's name
(`registry.register_reasoning_parser` / `register_tool_parser`). Everything that is particular
to the family lives on that class: its per-stream state struct, how it treats special tokens,
the prompt-ends-reasoning check, its `adjust_request` effects on the rendered request, whether
it reads `enable_thinking`, whether `tool_choice` required/named get vLLM's JSON paths, and the
structural tag it constrains tool calls with. Nothing outside `parsers/` names a family.

Parser objects hold only immutable tables built from the tokenizer, so one object serves every
stream; each stream's data is a `ParserState` (a msgspec struct encoded as a tagged array whose
tag is `"<family>/<version>"`) that resumes identically in another process.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers import held
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn


class ParserState(msgspec.Struct, array_like=True):
    """Base of every per-stream parser state.

    Subclasses pass `tag="<family>/<version>"`: the tag is the first array element on the wire,
    so a state from another family or another version is refused when decoded. Bump the version
    whenever the fields or their meaning change (the parser's `version` goes into the config
    fingerprint too, so snapshots of the old layout are never looked up).

    Text a family must hold until it can emit it (a call's text that vLLM emits only when the
    call ends) goes in a `held.HeldText` field: snapshots store it beside the state, so a chunk
    does not pay for it.
    """


class ToolStrictLevel(enum.IntEnum):
    """`--tool-strict-level` (vLLM `tool_parsers/tool_strict_level.py`)."""

    AUTO = 0
    FUNCTION = 1
    PARAMETER = 2


@dataclass(slots=True)
class RequestAdjustment:
    """The request fields a parser's `adjust_request` reads or changes (vLLM mutates the
    request object; render applies the result to the `GenerateRequest` it emits).

    `tool_choice` is the request's value ("none" | "auto" | "required" | None | a named-function
    dict); `skip_special_tokens` is None when the request leaves it to the defaults.
    """

    has_tools: bool
    tool_choice: Any
    skip_special_tokens: bool | None
    # None: left as the request has it (a parser that needs its markers unspaced sets False)
    spaces_between_special_tokens: bool | None = None


class ReasoningParser(ABC):
    """A reasoning parser family (vLLM's `ReasoningParser`), streaming over new text only.

    Subclasses set `state_type` and implement the abstract methods; `stream` returns the
    chunk's delta and whether reasoning has ended (after which the tool phase, or plain
    content, takes over).
    """

    name: ClassVar[str] = ""  # the registered name (set by the registry)
    version: ClassVar[int] = 1  # bump on any output or state change (config fingerprint)
    state_type: ClassVar[type[ParserState]]
    # vLLM's `engine_based_streaming`: the parser buffers text and must be flushed at the
    # reasoning -> tool hand-over and at the end of the stream.
    engine_based_streaming: ClassVar[bool] = False

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        self.info = tokenizer
        self.thinking_enabled = thinking_enabled

    # -- configuration --------------------------------------------------------------------------

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """What this family reads from the request's chat template kwargs (vLLM passes them as
        `reasoning_parser_kwargs`). Families that ignore them always think."""
        return True

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        """vLLM's `ReasoningParser.adjust_request`: nothing by default."""
        return None

    # -- per stream -------------------------------------------------------------------------------

    def new_state(self) -> ParserState:
        return self.state_type()

    def load_state(self, obj: Any) -> ParserState:
        return msgspec.convert(obj, self.state_type, dec_hook=held.decode_hook)

    @abstractmethod
    def prompt_ends_reasoning(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """`is_reasoning_end(prompt)`: the rendered prompt already closes reasoning (None when
        the family leaves vLLM's method unimplemented; render then sends null)."""

    def adjust_state_from_prompt(self, st: Any, prompt_token_ids: Sequence[int]) -> None:
        """`adjust_initial_state_from_prompt`: a prompt that leaves reasoning open may set the
        stream's starting state (called once, only when `prompt_ends_reasoning` said no)."""
        return None

    @abstractmethod
    def stream(self, st: Any, delta_text: str, delta_ids: Sequence[int]) -> tuple[Delta | None, bool]:
        """`extract_reasoning_streaming` for one chunk, and whether reasoning ended in it."""

    # Whether batch follows the stream's rule when the prompt already closed reasoning: the
    # stream then sends the whole output as content (vLLM's `is_reasoning_end(prompt)`), while
    # vLLM's batch `extract_reasoning` ignores the prompt and still reads reasoning out of the
    # output up to a `</think>` that may come last. Holding the stream until the end is no
    # option, so with this flag `ChatParser.parse` returns the whole output as content there
    # instead (a deliberate batch difference from vLLM, docs/parsers.md).
    batch_follows_prompt_end: ClassVar[bool] = False
    # Whether batch `extract` reads the prompt a stream of the same request checks
    # (`ChatParser.parse_batch`'s `stream_prompt_token_ids`) instead of the generate response's:
    # set by a family whose batch follows the stream's prompt rule (Gemma 4's thought channel).
    batch_reads_stream_prompt: ClassVar[bool] = False

    # Whether batch `extract` still transforms the text after reasoning has ended (e.g. an engine
    # that drops a stray `</think>` in content): then `after_end` filters that text in streaming
    # too, so the stream accumulates to the batch answer (vLLM streams it untouched).
    filters_after_end: ClassVar[bool] = False

    # Whether the content after reasoning is the family's to unwrap when no tool parser runs (Kimi
    # K3's response channel): batch answers go through `unwrap_content`, streamed content after
    # reasoning through `unwrap_stream` (both read the request: vLLM's rule depends on its tools).
    unwraps_content: ClassVar[bool] = False

    def unwrap_content(self, content: str | None, opts: RequestOptions) -> str | None:
        """With `unwraps_content`: the batch content after reasoning, as the family keeps it."""
        return content

    def unwrap_stream(self, st: Any, text: str, opts: RequestOptions, *, finished: bool) -> str:
        """With `unwraps_content`: a chunk's content after reasoning, as the family keeps it
        (held text included once decided; `finished` flushes)."""
        return text

    # Whether the stream runs batch's `extract` pass over the whole output, from the first chunk
    # (implies `filters_after_end`): `after_end` gets every chunk, its reasoning is the stream's
    # reasoning and its content goes on to the tool parser (as text: the ids no longer match it),
    # so the stream accumulates to the batch answer whatever markers the output repeats or spells
    # as text (vLLM's stream splits at marker ids once).
    streams_whole_output: ClassVar[bool] = False

    def stream_prompt_ends_reasoning(self, st: Any, prompt_token_ids: Sequence[int]) -> bool:
        """Whether a stream starts past reasoning, as batch `extract` reads the prompt (it may
        set `st` for `after_end`). Default: `prompt_ends_reasoning`, as vLLM's stream does."""
        return bool(self.prompt_ends_reasoning(prompt_token_ids))

    def after_end(self, st: Any, text: str, ids: Sequence[int], *, finished: bool) -> Delta | None:
        """With `filters_after_end`: what batch `extract` makes of `text`, a chunk after
        reasoning ended (its content goes on to the tool parser); `finished` flushes."""
        return Delta(content=text) if text else None

    def flush_on_transition(self, st: Any) -> Delta | None:
        """Buffered text to hand over when reasoning ends (engine-based parsers)."""
        return None

    def finish(self, st: Any) -> Delta | None:
        """Buffered text to flush when the stream finishes still in reasoning."""
        return None

    def fallback_content(self, st: Any) -> str | None:
        """`get_streaming_fallback_content`: content to add to the last delta of a stream that
        finishes still in reasoning (before `finish` runs)."""
        return None

    def extract_content_ids(self, delta_ids: Sequence[int]) -> Sequence[int]:
        """`extract_content_ids` of the chunk that ended reasoning: the ids the tool parser
        sees with the handed-over text."""
        return delta_ids

    @abstractmethod
    def extract(
        self, model_output: str, prompt_token_ids: Sequence[int] | None = None
    ) -> tuple[str | None, str | None]:
        """Batch `extract_reasoning`: (reasoning, content)."""


class ToolParser(ABC):
    """A tool-call parser family (vLLM's `ToolParser`), streaming over new text only."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    state_type: ClassVar[type[ParserState]]
    engine_based_streaming: ClassVar[bool] = False
    # The stream holds text until it ends (`held_calls`): `finish_for_request` is called at the
    # end of every stream, as for engine-based parsers.
    holds_until_finish: ClassVar[bool] = False
    # The parser unwraps the model's content itself (Kimi K3's response channel): its batch content
    # replaces the text even without calls, and with tool_choice "none" its stream still runs,
    # with the calls dropped (as engine-based parsers do).
    owns_content: ClassVar[bool] = False
    # vLLM's xgrammar structural tag model key; `structural_tag` builds its format.
    structural_tag_model: ClassVar[str | None] = None
    # vLLM's `supports_required_and_named`: when False, required/named tool_choice are parsed
    # like auto. vLLM forces it False for every parser with a structural tag model (under its
    # default VLLM_ENFORCE_STRICT_TOOL_CALLING=1), as `__init_subclass__` does here. When it is
    # True, required/named take vLLM's JSON paths (`forced.py`, wired by `ChatParser`).
    supports_required_and_named: ClassVar[bool] = True
    default_tool_strict_level: ClassVar[ToolStrictLevel] = ToolStrictLevel.AUTO
    # Set by the composition: whether a reasoning parser runs before this one (vLLM sets
    # `skip_reasoning_parsing` on engine-based tool parsers when none does).
    reasoning_configured: bool = True
    # Set by the composition: the request's thinking switch as the reasoning parser reads it
    # (families whose tool grammar depends on it, e.g. GLM, read this).
    thinking_enabled: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.structural_tag_model is not None:
            cls.supports_required_and_named = False

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self.info = tokenizer

    # -- render side ------------------------------------------------------------------------------

    @classmethod
    def adjust_request(cls, request: RequestAdjustment) -> None:
        """vLLM's `ToolParser.adjust_request` effects other than structured outputs."""
        return None

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """The xgrammar structural-tag `format` for `structural_tag_model` (as xgrammar's
        constructor arguments: fields left at their defaults may be omitted), or None when the
        family has none (or it is not implemented: the request then goes unconstrained). `tools` are the resolved function tools, `strict[i]` whether
        tool i's parameters are enforced, `choice` "auto" | "required" | "forced"."""
        return None

    # -- per stream -------------------------------------------------------------------------------

    def new_state(self) -> ParserState:
        return self.state_type()

    def load_state(self, obj: Any) -> ParserState:
        return msgspec.convert(obj, self.state_type, dec_hook=held.decode_hook)

    @abstractmethod
    def feed(self, st: Any, text: str, tool_id: ToolIdFn) -> Delta | None:
        """`extract_tool_calls_streaming` for the new text only."""

    def feed_for_request(
        self, st: Any, text: str, token_ids: Sequence[int], tool_id: ToolIdFn, opts: RequestOptions
    ) -> Delta | None:
        """`feed` for parsers that read the chunk's token ids or the request (its tools,
        `tool_choice`); the composition always calls this one."""
        return self.feed(st, text, tool_id)

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        """What an engine-based parser still holds when the stream finishes
        (`finish_streaming`)."""
        return None

    @abstractmethod
    def remaining_args(self, st: Any) -> str:
        """`get_remaining_unstreamed_args()` at the end of the stream."""

    @abstractmethod
    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        """Batch `extract_tool_calls`: (tools_called, calls, content)."""

    def extract_for_request(
        self, model_output: str, opts: RequestOptions
    ) -> tuple[bool, list[FunctionCall], str | None]:
        """`extract_tool_calls` for parsers that read the request; the composition calls this."""
        return self.extract_tool_calls(model_output)
