"""Hunyuan V3 / V4 parsers: `hy_v3` reasoning and tools, `hy_v4` reasoning (vLLM 0.33's
`HYV3ReasoningParser`, `HYV3ToolParser`, `HYV4ReasoningParser`).

The structural tokens carry a per-checkpoint suffix (`<think:6124c78e>`): `hy_v3` reads it from the
tokenizer config's `token_suffix`, `hy_v4` from the first structural token in the vocabulary.

Reasoning is `deepseek_r1`'s rule on the suffixed markers (markers matched as text across chunks,
its deliberate differences included, `deepseek_r1.py`), or vLLM's identity parser (all content)
when the request's `reasoning_effort` (chat template kwargs first) is `no_think`: `hy_v3`'s default
when none is given, `hy_v4`'s is `high`.

Tools (`hy_v3`): `<tool_calls>` holds `<tool_call>NAME<tool_sep><arg_key>K</arg_key><arg_value>V
</arg_value>...</tool_call>` (suffixed), each value typed by the request's schema for that argument
as vLLM does (bool, integer, number, JSON for other types, string, else JSON or a Python literal).
Batch makes calls of every region after the first `<tool_calls>` marker (the last one may be
unclosed) and keeps the text before the marker as content; vLLM's stream types a value only once it
closes, keeps the first of two equal keys where batch keeps the last and escapes partial strings
its own way, so the stream holds everything from the `<tool_calls>` marker on
(`held_calls.CallsHolder`) and the calls arrive whole when it ends.
"""

from __future__ import annotations

import ast
import json
import warnings
from collections.abc import Mapping
from typing import Any

import regex  # type: ignore[import-untyped]

from render_service.derender.detokenize import TokenizerInfo
from render_service.parsers.base import Delta, FunctionCall, RequestOptions, ToolIdFn
from render_service.parsers.deepseek_r1 import DeepSeekR1State
from render_service.parsers.deepseek_v3 import DeepSeekV3ReasoningParser
from render_service.parsers.held_calls import CallsHolder, HeldCallsState
from render_service.parsers.protocols import ToolParser
from render_service.parsers.registry import register_reasoning_parser, register_tool_parser

NO_THINK = "no_think"
_STRUCTURAL_TOKEN = regex.compile(r"<(?:think|tool_calls|tool_call|arg_key|arg_value)(:[^\s>]+)?>")


def config_suffix(tokenizer: TokenizerInfo) -> str:
    """`hy_v3`: the tokenizer config's `token_suffix`."""
    init_kwargs = getattr(tokenizer.tokenizer, "init_kwargs", None) or {}
    return init_kwargs.get("token_suffix") or ""


def vocab_suffix(tokenizer: TokenizerInfo) -> str:
    """`hy_v4`'s `detect_token_suffix`: the suffix of the first structural token in the vocabulary."""
    init_kwargs = getattr(tokenizer.tokenizer, "init_kwargs", None) or {}
    if init_kwargs.get("model_specific_special_tokens", {}).get("think_begin_token", ""):
        raise RuntimeError(
            "This checkpoint declares HYV4 structural tokens in tokenizer_config.json "
            "(model_specific_special_tokens), which transformers 5 no longer supports"
        )
    for token in tokenizer.tokenizer.get_vocab():
        match = _STRUCTURAL_TOKEN.fullmatch(token)
        if match:
            return match.group(1) or ""
    return ""


def _effort(template_kwargs: Mapping[str, Any], default: str) -> str:
    return template_kwargs.get("reasoning_effort") or default


class _HYReasoningParser(DeepSeekV3ReasoningParser):
    """`deepseek_r1` on `<think{suffix}>` / `</think{suffix}>` while thinking, else all content."""

    state_type = DeepSeekR1State
    default_effort = NO_THINK

    def __init__(self, tokenizer: TokenizerInfo, *, thinking_enabled: bool = True) -> None:
        suffix = self.suffix_of(tokenizer)
        self.start_token = f"<think{suffix}>"
        self.end_token = f"</think{suffix}>"
        super().__init__(tokenizer, thinking_enabled=thinking_enabled)

    @staticmethod
    def suffix_of(tokenizer: TokenizerInfo) -> str:
        return config_suffix(tokenizer)

    @classmethod
    def thinking_enabled_for(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return _effort(template_kwargs, cls.default_effort) != NO_THINK


@register_reasoning_parser("hy_v3")
class HYV3ReasoningParser(_HYReasoningParser):
    default_effort = NO_THINK  # vLLM: no effort given is `no_think`


@register_reasoning_parser("hy_v4")
class HYV4ReasoningParser(_HYReasoningParser):
    default_effort = "high"  # the chat template's own default

    @staticmethod
    def suffix_of(tokenizer: TokenizerInfo) -> str:
        return vocab_suffix(tokenizer)


# -- tools: argument values typed by the request's schema ------------------------------------------

_TYPE_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "bool": "boolean",
    "binary": "boolean",
    "int": "integer",
    "float": "number",
    "double": "number",
    "list": "array",
    "dict": "object",
    "map": "object",
}
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")


def _normalize_type(raw_type: Any) -> Any:
    exact = _TYPE_ALIASES.get(raw_type)
    if exact is not None:
        return exact
    lower = raw_type.lower()
    if any(lower.startswith(p) for p in _INTEGER_PREFIXES):
        return "integer"
    if any(lower.startswith(p) for p in _NUMBER_PREFIXES):
        return "number"
    return raw_type


def _arg_schema(function_name: str, key: str, tools: Any) -> Any:
    if tools is None:
        return {}
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == function_name:
            parameters = function.get("parameters")
            if parameters is None:
                return {}
            return parameters.get("properties", {}).get(key, {})
    return {}


def _types(schema: Any) -> set[Any]:
    if "type" in schema:
        options = [{"type": t} for t in schema["type"]] if isinstance(schema["type"], list) else [schema]
    elif "anyOf" in schema:
        options = schema["anyOf"]
    elif "oneOf" in schema:
        options = schema["oneOf"]
    else:
        options = [{"type": "string"}]
    return {_normalize_type(s.get("type", "string")) for s in options} - {"null"}


def _deserialize(value: str) -> Any:
    try:
        return json.loads(value)
    except Exception:  # vLLM falls through on any error
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.literal_eval(value)
    except Exception:
        pass
    return value


def parse_value(value: str, function_name: str, key: str, tools: Any) -> Any:
    """vLLM's `HYV3ToolParser._parse_value`: bool, integer, number, JSON, string, else literal."""
    types = _types(_arg_schema(function_name, key, tools))
    if "boolean" in types:
        lower = value.lower()
        if lower in ("true", "false"):
            return lower == "true"
    if "integer" in types:
        try:
            return int(value)
        except (ValueError, TypeError):
            pass
    if "number" in types:
        try:
            return float(value) if ("." in value or "e" in value or "E" in value) else int(value)
        except (ValueError, TypeError):
            pass
    if types - {"string", "boolean", "integer", "number"}:
        try:
            return json.loads(value)
        except ValueError:
            pass
    if "string" in types:
        return value
    return _deserialize(value)


class HYV3ToolState(HeldCallsState, tag="hy_v3.tool/1"):
    pass


@register_tool_parser("hy_v3")
class HYV3ToolParser(ToolParser):
    state_type = HYV3ToolState
    holds_until_finish = True

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        super().__init__(tokenizer)
        s = config_suffix(tokenizer)
        self.calls_start = f"<tool_calls{s}>"
        if tokenizer.token_to_id(self.calls_start) is None or tokenizer.token_to_id(f"</tool_calls{s}>") is None:
            raise RuntimeError("HYV3 Tool parser could not locate tool call start/end tokens in the tokenizer!")
        call, end, sep = (
            regex.escape(f"<tool_call{s}>"),
            regex.escape(f"</tool_call{s}>"),
            regex.escape(f"<tool_sep{s}>"),
        )
        self.call_end = f"</tool_call{s}>"
        self._call_re = regex.compile(rf"{call}(.*?){sep}(.*?){end}", regex.DOTALL)
        self._portion_re = regex.compile(rf"{call}(.*?){sep}(.*)", regex.DOTALL)
        key_open, key_close = regex.escape(f"<arg_key{s}>"), regex.escape(f"</arg_key{s}>")
        value_open, value_close = regex.escape(f"<arg_value{s}>"), regex.escape(f"</arg_value{s}>")
        self._args_re = regex.compile(rf"{key_open}(.*?){key_close}\s*{value_open}(.*?){value_close}", regex.DOTALL)
        self.holder = CallsHolder(self.calls_start, self.extract_tool_calls)

    def _calls(self, text: str, tools: Any) -> list[FunctionCall]:
        """vLLM's `_extract_tool_calls` (any error: no calls)."""
        try:
            found = self._call_re.findall(text)
            if found:
                found += self._portion_re.findall(text.split(self.call_end)[-1])
            else:
                found = self._portion_re.findall(text)
            calls = []
            for name, args in found:
                name = name.strip()
                values = {
                    key: parse_value(value, name, key, tools) for key, value in self._args_re.findall(args.strip())
                }
                calls.append(FunctionCall(name=name, arguments=json.dumps(values, ensure_ascii=False)))
            return calls
        except Exception:  # vLLM logs and returns no calls
            return []

    def _extract(self, text: str, tools: Any) -> tuple[bool, list[FunctionCall], str | None]:
        at = text.find(self.calls_start)
        if at == -1:
            return False, [], text
        return True, self._calls(text, tools), text[:at] or None

    def extract_tool_calls(self, model_output: str) -> tuple[bool, list[FunctionCall], str | None]:
        return self._extract(model_output, None)

    def extract_for_request(
        self, model_output: str, opts: RequestOptions
    ) -> tuple[bool, list[FunctionCall], str | None]:
        return self._extract(model_output, opts.tools)

    def feed(self, st: Any, text: str, tool_id: ToolIdFn) -> Delta | None:
        return self.holder.feed(st, text)

    def finish_for_request(self, st: Any, tool_id: ToolIdFn, opts: RequestOptions) -> Delta | None:
        holder = CallsHolder(self.calls_start, lambda text: self._extract(text, opts.tools))
        return holder.finish(st, tool_id, opts)

    def remaining_args(self, st: Any) -> str:
        return ""
