"""Step-3.5 / Step-3.7 (`step3p5` reasoning and tools): vLLM 0.33's `Step3p5Parser` adapters.

Step 3.5 writes Qwen3's `<think>` reasoning and Qwen3-Coder's XML tool calls unchanged
(`qwen3_coder.qwen3_config` with ChatML turn boundaries); two things differ (`parser/step3p5.py`):

- the chat template always prefills `<think>\\n` and has no switch to turn thinking off, so
  `enable_thinking` is ignored (the engine always starts in reasoning);
- the model closes reasoning with `\\n</think>\\n`, so the reasoning's trailing whitespace is
  stripped (`strip_trailing_reasoning_whitespace`).

The tool parser's structural tag is xgrammar's `qwen_3_coder` (vLLM's `Step3p5ToolParser`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

from render_service.parsers.engine import (
    EngineConfig,
    EngineReasoningParser,
    EngineState,
    EngineToolParser,
    WholeCallsState,
)
from render_service.parsers.qwen3_coder import CHATML_TURN_BOUNDARIES, Qwen3CoderToolParser, qwen3_config
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser


@cache
def step3p5_config() -> EngineConfig:
    """vLLM's `step3p5_config`: Qwen3's, thinking on, trailing reasoning whitespace stripped."""
    base = qwen3_config(True, name="step3p5", turn_boundary_tokens=CHATML_TURN_BOUNDARIES)
    return replace(base, strip_trailing_reasoning_whitespace=True)


class Step3p5ReasoningState(EngineState, tag="step3p5.reasoning/1"):
    pass


@register_reasoning_parser("step3p5")
class Step3p5ReasoningParser(EngineReasoningParser):
    version = 1
    state_type = Step3p5ReasoningState
    streams_whole_output = True  # the stream is batch's engine pass (accumulates to it)
    reads_enable_thinking = False  # Step3p5Parser sets thinking_enabled = True whatever the kwargs

    @staticmethod
    def config_for(thinking: bool) -> EngineConfig:
        return step3p5_config()


class Step3p5ToolState(WholeCallsState, tag="step3p5.tool/1"):
    pass


@register_tool_parser("step3p5")
class Step3p5ToolParser(EngineToolParser):
    """Qwen3-Coder's engine and structural tag with Step 3.5's config; calls sent whole."""

    version = 1
    calls_whole = True  # as qwen3_coder: the stream accumulates to the batch answer
    state_type = Step3p5ToolState
    structural_tag_model = "qwen_3_coder"
    config = step3p5_config()

    @classmethod
    def structural_tag(cls, tools: list[dict[str, Any]], strict: list[bool], choice: str) -> dict[str, Any] | None:
        return Qwen3CoderToolParser.structural_tag(tools, strict, choice)
