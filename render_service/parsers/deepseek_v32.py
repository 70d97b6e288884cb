"""DeepSeek V3.2 tool calls (`deepseek_v32`): vLLM 0.33's `DeepSeekV32Parser` engine config.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">杭州</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

`<｜DSML｜function_calls>` / `</｜DSML｜function_calls>` by token id, the rest of the markup by
text; arguments by the shared DSML converter (`dsml.py`), unwrapped from an `arguments`/`input`
wrapper for the call's tool, and re-read only when a `>` arrives (vLLM gives this family no
open-value extender, so a call's raw arguments stay in the state until it ends). A call ends the
turn: text after the block is dropped, in streaming and batch. Content whitespace around calls
is kept. `tool_choice` is constrained by xgrammar's builtin `deepseek_v3_2` structural tag.

vLLM names the call whose conversion it runs by the first earlier call with the same raw
arguments; here it is always the call being converted (they differ only when two calls of
different tools carry the same argument text and one of them is a wrapper to unwrap).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from render_service.parsers.base import ToolCallDelta, ToolIdFn, tool_schema_tags
from render_service.parsers.dsml import (
    INVOKE_END,
    INVOKE_NAME_END,
    INVOKE_PREFIX,
    PARAM_CLOSE,
    PARAM_START,
    THINK_MARKERS,
    calls_block_tag,
    dsml_arg_converter,
    unwrap_wrapper_args,
)
from render_service.parsers.engine import (
    CONTENT,
    EV_ARG,
    EV_TEXT,
    EV_TOOL_END,
    EV_TOOL_NAME,
    EV_TOOL_START,
    TOOL_ARGS,
    TOOL_BETWEEN,
    TOOL_NAME,
    TOOL_PREAMBLE,
    Engine,
    EngineConfig,
    EngineState,
    EngineToolParser,
    Slot,
    Transition,
    WholeCallsState,
)
from render_service.parsers.held import HeldText
from render_service.parsers.registry import register_tool_parser
from render_service.render.renderers.dsml import DSML

FUNCTION_CALLS_START = f"<{DSML}function_calls>"
FUNCTION_CALLS_END = f"</{DSML}function_calls>"


def dsml_call_transitions() -> dict[tuple[int, str], Transition]:
    """The DSML calls block's transitions, shared by DeepSeek V3.2, V4 and V4.1."""
    start_call = Transition(TOOL_NAME, (EV_TOOL_START,))
    end_call = Transition(TOOL_BETWEEN, (EV_TOOL_END,))
    return {
        (CONTENT, "TOOL_START"): Transition(TOOL_PREAMBLE),
        (TOOL_PREAMBLE, "INVOKE_PREFIX"): start_call,
        (CONTENT, "INVOKE_PREFIX"): start_call,
        (TOOL_NAME, "INVOKE_NAME_END"): Transition(TOOL_ARGS),
        (TOOL_ARGS, "INVOKE_END"): end_call,
        (TOOL_ARGS, "TOOL_END"): end_call,
        (TOOL_BETWEEN, "INVOKE_PREFIX"): start_call,
        # The block ends the turn: stay between calls, so what follows is dropped.
        (TOOL_BETWEEN, "TOOL_END"): Transition(TOOL_BETWEEN),
        (TOOL_BETWEEN, "TOOL_START"): Transition(TOOL_PREAMBLE),
    }


@cache
def deepseek_v32_config() -> EngineConfig:
    """vLLM's `deepseek_v32_config`."""
    return EngineConfig(
        name="deepseek_v32",
        initial_state=CONTENT,
        wait_for_reasoning=False,
        terminals={
            "TOOL_START": FUNCTION_CALLS_START,
            "TOOL_END": FUNCTION_CALLS_END,
            "INVOKE_PREFIX": INVOKE_PREFIX,
            "INVOKE_NAME_END": INVOKE_NAME_END,
            "INVOKE_END": INVOKE_END,
            "PARAM_START": PARAM_START,
            "PARAM_CLOSE": PARAM_CLOSE,
        },
        token_id_terminals={"TOOL_START": FUNCTION_CALLS_START, "TOOL_END": FUNCTION_CALLS_END},
        transitions=dsml_call_transitions(),
        content_events={CONTENT: EV_TEXT, TOOL_NAME: EV_TOOL_NAME, TOOL_ARGS: EV_ARG},
        arg_converter=dsml_arg_converter,
        arg_structural_chars=frozenset(">"),
        strip_content_whitespace_with_tools=False,
        tool_args_json=False,
    )


class DsmlToolState(WholeCallsState):
    """The engine state plus `held_args`: argument text that arrived after the call's last
    conversion, kept apart from the slot's raw arguments until a conversion reads them.

    vLLM re-reads a DSML call only when a `>` arrives, so the text in between (typically a long
    string value) is only kept: held text (`HeldText`), which a snapshot stores beside the state
    and appends to, so a chunk does not pay for what is held.
    """

    held_args: HeldText = msgspec.field(default_factory=HeldText)


class DsmlEngine(Engine):
    """The engine with vLLM's `_convert_args`: the DSML converter, then the call's tool unwraps
    an `arguments`/`input` wrapper."""

    def convert_args(self, slot: Slot, partial: bool, tools: Any) -> str:
        return unwrap_wrapper_args(super().convert_args(slot, partial, tools), tools, slot.name)

    def _arg_chunk(
        self,
        st: EngineState,
        index: int,
        value: str,
        calls: list[ToolCallDelta],
        tool_id: ToolIdFn,
        tools: Any,
        *,
        elide: bool = False,
    ) -> None:
        slot = self._slot(st, index)
        # Streaming only (batch keeps every slot's text in place): a chunk without a structural
        # character after the name is out gets no delta (`_arg_delta` returns before reading).
        structural = self.config.arg_structural_chars
        if (
            elide
            and isinstance(st, DsmlToolState)
            and value
            and slot.name_sent
            and slot.ext is None
            and not slot.in_open_string
            and structural is not None
            and structural.isdisjoint(value)
        ):
            st.held_args.append(value)
            return
        self._merge_held(st)
        super()._arg_chunk(st, index, value, calls, tool_id, tools, elide=elide)

    def _tool_end(self, st: EngineState, index: int, calls: list[ToolCallDelta], tool_id: ToolIdFn, tools: Any) -> None:
        self._merge_held(st)
        super()._tool_end(st, index, calls, tool_id, tools)

    def _ensure_slot(self, st: EngineState, index: int, done: list[Slot] | None) -> None:
        self._merge_held(st)
        super()._ensure_slot(st, index, done)

    @staticmethod
    def _merge_held(st: EngineState) -> None:
        if isinstance(st, DsmlToolState) and st.held_args:
            assert st.slot is not None
            st.slot.args += st.held_args.text()
            st.held_args = HeldText()


class DeepSeekV32ToolState(DsmlToolState, tag="deepseek_v32.tool/4"):
    pass


@register_tool_parser("deepseek_v32")
class DeepSeekV32ToolParser(EngineToolParser):
    version = 4  # state: held_args (2), as held text (3); each call sent whole (4)
    calls_whole = True
    state_type = DeepSeekV32ToolState
    engine_type = DsmlEngine
    structural_tag_model = "deepseek_v3_2"
    config = deepseek_v32_config()

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        """xgrammar's builtin `deepseek_v3_2` tag as vLLM requests it (reasoning disabled): one
        `invoke` tag per tool with `deepseek_xml` arguments, inside the `function_calls` block."""
        tags = tool_schema_tags(
            tools, strict, lambda name: f"{INVOKE_PREFIX}{name}{INVOKE_NAME_END}\n", INVOKE_END + "\n", "deepseek_xml"
        )
        return calls_block_tag(tags, choice, FUNCTION_CALLS_START, FUNCTION_CALLS_END, THINK_MARKERS)
