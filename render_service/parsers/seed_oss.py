"""Seed-OSS reasoning (`seed_oss`): vLLM 0.33's `SeedOssParser` reasoning adapter.

Seed-OSS shares the Qwen3 XML grammar exactly (`parser/seed_oss.py`); only the wrapper tokens
differ: `<seed:think>`/`</seed:think>`, `<seed:tool_call>`/`</seed:tool_call>`, and the turn
boundaries `<seed:bos>`/`<seed:eos>`. `enable_thinking=false` starts in content (and batch
returns the text untouched), as for Qwen3.

The `seed_oss` tool parser (`SeedOssEngineToolParser`) is the same engine with tool parsing
on. vLLM gives it no structural tag model, so `tool_choice` required/named take vLLM's JSON
paths (a JSON schema on render, `forced.py` on derender).
"""

from __future__ import annotations

from render_service.parsers.engine import (
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    WholeCallsState,
)
from render_service.parsers.qwen3_coder import qwen3_config
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

THINK_START, THINK_END = "<seed:think>", "</seed:think>"
TOOL_CALL_START, TOOL_CALL_END = "<seed:tool_call>", "</seed:tool_call>"
TURN_BOUNDARIES = frozenset(("<seed:bos>", "<seed:eos>"))


def seed_oss_config(thinking: bool) -> EngineConfig:
    return qwen3_config(
        thinking,
        name="seed_oss",
        think_start=THINK_START,
        think_end=THINK_END,
        tool_start=TOOL_CALL_START,
        tool_end=TOOL_CALL_END,
        turn_boundary_tokens=TURN_BOUNDARIES,
    )


class SeedOssReasoningState(EngineState, tag="seed_oss.reasoning/1"):
    pass


@register_reasoning_parser("seed_oss")
class SeedOssReasoningParser(EngineReasoningParser):
    version = 3  # the stream is batch's engine pass over the whole output (accumulates to it)
    state_type = SeedOssReasoningState
    streams_whole_output = True
    reads_enable_thinking = True

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return seed_oss_config(thinking)


class SeedOssToolState(WholeCallsState, tag="seed_oss.tool/2"):
    pass


@register_tool_parser("seed_oss")
class SeedOssToolParser(EngineToolParser):
    version = 2  # each call sent whole: the stream accumulates to the batch answer
    calls_whole = True
    state_type = SeedOssToolState
    config = seed_oss_config(True)
