"""DeepSeek V4 and V4.1 (`deepseek_v4`, `deepseek_v41` tools and reasoning): vLLM 0.33's
`DeepSeekV4Parser` / `DeepSeekV41Parser` engine configs.

    <think>...</think>
    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">杭州</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

V4.1 spells the block `<｜DSML｜ calls>` and the tags with a space (`<｜DSML｜ invoke`,
`<｜DSML｜ parameter`); otherwise the two are one config. Like V3.2 (`deepseek_v32.py`, whose
engine hook this reuses): think markers and the block markers by token id (when the vocabulary
has them as single tokens), the rest by text; arguments by the DSML converter (`dsml.py`),
re-read only when a `>` arrives, unwrapped from an `arguments`/`input` wrapper for the call's
tool; text after the block is dropped; content whitespace around calls is kept. V4 also accepts
`<｜DSML｜toolcalls>` and `<｜DSML｜tool>` as the block opener.

Thinking (vLLM's `DeepSeekV4Parser.__init__`): on unless the template kwargs set `thinking` /
`enable_thinking` and neither is true, and off when `reasoning_effort` is "none". It only
chooses the initial state: `<think>` opens reasoning in content either way, a bare `</think>`
in content is dropped, a block opener inside reasoning ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import Any, ClassVar

from render_service.parsers.base import tool_schema_tags
from render_service.parsers.deepseek_v32 import DsmlEngine, DsmlToolState, dsml_call_transitions
from render_service.parsers.dsml import (
    INVOKE_END,
    INVOKE_NAME_END,
    INVOKE_PREFIX,
    PARAM_CLOSE,
    PARAM_START,
    THINK_MARKERS,
    calls_block_tag,
    make_dsml_arg_converter,
)
from render_service.parsers.engine import (
    CONTENT,
    EV_ARG,
    EV_REASONING,
    EV_REASONING_END,
    EV_REASONING_START,
    EV_TEXT,
    EV_TOOL_NAME,
    REASONING,
    TOOL_ARGS,
    TOOL_NAME,
    TOOL_PREAMBLE,
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    Transition,
)
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser
from render_service.render.renderers.dsml import DSML

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALLS_START = f"<{DSML}tool_calls>"
TOOL_CALLS_END = f"</{DSML}tool_calls>"
# Spellings of the block opener vLLM accepts (seen in production).
TOOL_CALLS_START_VARIANTS = (f"<{DSML}toolcalls>", f"<{DSML}tool>")

# V4.1: the spaced dialect.
V41_CALLS_START = f"<{DSML} calls>"
V41_CALLS_END = f"</{DSML} calls>"
V41_INVOKE_PREFIX = f'<{DSML} invoke name="'
V41_INVOKE_END = f"</{DSML} invoke>"
V41_PARAM_START = f"<{DSML} parameter"
V41_PARAM_CLOSE = f"</{DSML} parameter>"


@cache
def deepseek_v4_config(thinking: bool = False) -> EngineConfig:
    """vLLM's `deepseek_v4_config`."""
    return EngineConfig(
        name="deepseek_v4",
        initial_state=REASONING if thinking else CONTENT,
        wait_for_reasoning=thinking,
        terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": (TOOL_CALLS_START, *TOOL_CALLS_START_VARIANTS),
            "TOOL_END": TOOL_CALLS_END,
            "INVOKE_PREFIX": INVOKE_PREFIX,
            "INVOKE_NAME_END": INVOKE_NAME_END,
            "INVOKE_END": INVOKE_END,
            "PARAM_START": PARAM_START,
            "PARAM_CLOSE": PARAM_CLOSE,
        },
        token_id_terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": TOOL_CALLS_START,
            "TOOL_END": TOOL_CALLS_END,
        },
        transitions={
            (CONTENT, "THINK_START"): Transition(REASONING, (EV_REASONING_START,)),
            (CONTENT, "THINK_END"): Transition(CONTENT),  # a bare </think> is dropped
            (REASONING, "THINK_START"): Transition(REASONING),  # so is a second <think>
            (REASONING, "THINK_END"): Transition(CONTENT, (EV_REASONING_END,)),
            (REASONING, "TOOL_START"): Transition(TOOL_PREAMBLE, (EV_REASONING_END,)),
            **dsml_call_transitions(),
        },
        content_events={CONTENT: EV_TEXT, REASONING: EV_REASONING, TOOL_NAME: EV_TOOL_NAME, TOOL_ARGS: EV_ARG},
        arg_converter=make_dsml_arg_converter(PARAM_START, PARAM_CLOSE),
        arg_structural_chars=frozenset(">"),
        strip_content_whitespace_with_tools=False,
        tool_args_json=False,
    )


@cache
def deepseek_v41_config(thinking: bool = False) -> EngineConfig:
    """vLLM's `deepseek_v41_config`: V4's with the spaced tags (and no opener variants)."""
    config = deepseek_v4_config(thinking)
    overrides = {
        "TOOL_START": V41_CALLS_START,
        "TOOL_END": V41_CALLS_END,
        "INVOKE_PREFIX": V41_INVOKE_PREFIX,
        "INVOKE_END": V41_INVOKE_END,
        "PARAM_START": V41_PARAM_START,
        "PARAM_CLOSE": V41_PARAM_CLOSE,
    }
    return replace(
        config,
        name="deepseek_v41",
        terminals={**config.terminals, **overrides},
        token_id_terminals={key: overrides.get(key, value) for key, value in config.token_id_terminals.items()},
        arg_converter=make_dsml_arg_converter(V41_PARAM_START, V41_PARAM_CLOSE),
    )


def _thinking(template_kwargs: Mapping[str, Any]) -> bool:
    """`DeepSeekV4Parser.__init__`'s reading of the chat template kwargs."""
    if "thinking" not in template_kwargs and "enable_thinking" not in template_kwargs:
        thinking = True
    else:
        thinking = bool(template_kwargs.get("thinking") or template_kwargs.get("enable_thinking"))
    return thinking and template_kwargs.get("reasoning_effort") != "none"


def _structural_tag(
    tools: list[dict[str, Any]], strict: list[bool], choice: str, *, v4_1: bool
) -> dict[str, Any] | None:
    """xgrammar's builtin `deepseek_v4` / `deepseek_v4_1` tag as vLLM requests it (reasoning
    disabled): one `invoke` tag per tool inside the calls block."""
    invoke_prefix, invoke_end = (V41_INVOKE_PREFIX, V41_INVOKE_END) if v4_1 else (INVOKE_PREFIX, INVOKE_END)
    calls_start, calls_end = (V41_CALLS_START, V41_CALLS_END) if v4_1 else (TOOL_CALLS_START, TOOL_CALLS_END)
    style = "deepseek_v4_1_xml" if v4_1 else "deepseek_xml"
    tags = tool_schema_tags(
        tools, strict, lambda name: f"{invoke_prefix}{name}{INVOKE_NAME_END}\n", invoke_end + "\n", style
    )
    # V4.1: with no tools a calls block must not slip through as text.
    auto_excludes = [*THINK_MARKERS, calls_start] if v4_1 else THINK_MARKERS
    return calls_block_tag(tags, choice, calls_start, calls_end, auto_excludes)


class DeepSeekV4ReasoningState(EngineState, tag="deepseek_v4.reasoning/1"):
    pass


class DeepSeekV4ToolState(DsmlToolState, tag="deepseek_v4.tool/3"):
    pass


class DeepSeekV41ReasoningState(EngineState, tag="deepseek_v41.reasoning/1"):
    pass


class DeepSeekV41ToolState(DsmlToolState, tag="deepseek_v41.tool/3"):
    pass


@register_reasoning_parser("deepseek_v4")
class DeepSeekV4ReasoningParser(EngineReasoningParser):
    version = 3  # the stream is batch's engine pass over the whole output (accumulates to it)
    streams_whole_output = True
    state_type: ClassVar[type[EngineState]] = DeepSeekV4ReasoningState
    engine_type = DsmlEngine

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return deepseek_v4_config(thinking)

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _thinking(template_kwargs)


@register_tool_parser("deepseek_v4")
class DeepSeekV4ToolParser(EngineToolParser):
    version = 3  # state: held_args as held text (2); each call sent whole (3)
    calls_whole = True
    state_type: ClassVar[type[EngineState]] = DeepSeekV4ToolState
    engine_type = DsmlEngine
    structural_tag_model = "deepseek_v4"
    config = deepseek_v4_config(True)

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        return deepseek_v4_config(thinking)

    @classmethod
    def tool_thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """vLLM builds the tool adapter's engine from the template kwargs too."""
        return _thinking(template_kwargs)

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        return _structural_tag(tools, strict, choice, v4_1=False)


@register_reasoning_parser("deepseek_v41")
class DeepSeekV41ReasoningParser(DeepSeekV4ReasoningParser):
    state_type = DeepSeekV41ReasoningState

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return deepseek_v41_config(thinking)


@register_tool_parser("deepseek_v41")
class DeepSeekV41ToolParser(DeepSeekV4ToolParser):
    state_type = DeepSeekV41ToolState
    structural_tag_model = "deepseek_v4_1"
    config = deepseek_v41_config(True)

    @classmethod
    def config_for(cls, thinking: bool) -> EngineConfig:
        return deepseek_v41_config(thinking)

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        return _structural_tag(tools, strict, choice, v4_1=True)
