"""Native reasoning and tool parsers, registered under vLLM 0.33's names, and their composition.

- `protocols`: what a family implements (`ReasoningParser`, `ToolParser`, `ParserState`);
- `registry`: `@register_reasoning_parser` / `@register_tool_parser` and the name lookups;
  every module of this package is imported on first lookup, so a family is one module;
- `chat`: `ChatParser`, vLLM's `DelegatingParser` + `ChatStreamProcessor` over any two families,
  and the render-side questions (`adjust_request`, `prompt_ends_reasoning`, `thinking_enabled`);
- `base`: deltas, request options, tool-call ids, `finish_reason` rules, streaming matchers.

See README.md in this folder for how to add a family, and `tests/parity/compare_parsers.py`
for the comparison with vLLM's own parser classes. Deliberate or known differences from vLLM,
for every family:
- tool-call ids: `id_for(request_id, choice, index)` (`chatcmpl-tool-` + 16 hex, vLLM's shape)
  instead of random ids, the same in streaming and batch;
- the prompt check vLLM runs on the first `parse_delta` runs in `new_state` (same result: it is
  a pure function of the prompt); a stream must be created with the prompt ids it uses;
- parsers are treated as vLLM treats them with the default `VLLM_ENFORCE_STRICT_TOOL_CALLING=1`
  (`supports_required_and_named=False`: required/named tool_choice are parsed like auto); the
  JSON-list paths vLLM uses for required/named when that variable is 0 are not implemented;
- with a bare `tokenizers.Tokenizer` (no transformers wrapper) the special tokens are the added
  tokens flagged special, not transformers' `all_special_tokens`; pass the transformers tokenizer
  for vLLM's exact drop sets.
"""

from render_service.parsers.base import (
    Delta,
    FunctionCall,
    RequestOptions,
    ToolCallDelta,
    id_for,
    resolve_finish_reason,
    tool_ids,
)
from render_service.parsers.chat import (
    ChatParser,
    ParsedStreamState,
    StreamState,
    adjust_request,
    advance,
    get_parser,
    load_parsed_stream,
    new_parsed_stream,
    parser_versions,
    prompt_ends_reasoning,
    thinking_enabled,
)
from render_service.parsers.protocols import ParserState, ReasoningParser, RequestAdjustment, ToolParser
from render_service.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    reasoning_parser_class,
    reasoning_parser_names,
    register_reasoning_parser,
    register_tool_parser,
    tool_parser_class,
    tool_parser_names,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ChatParser",
    "Delta",
    "FunctionCall",
    "ParsedStreamState",
    "ParserState",
    "ReasoningParser",
    "RequestAdjustment",
    "RequestOptions",
    "StreamState",
    "ToolCallDelta",
    "ToolParser",
    "adjust_request",
    "advance",
    "get_parser",
    "id_for",
    "load_parsed_stream",
    "new_parsed_stream",
    "parser_versions",
    "prompt_ends_reasoning",
    "reasoning_parser_class",
    "reasoning_parser_names",
    "register_reasoning_parser",
    "register_tool_parser",
    "resolve_finish_reason",
    "thinking_enabled",
    "tool_ids",
    "tool_parser_class",
    "tool_parser_names",
]
