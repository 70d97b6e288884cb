"""DeepSeek's DSML tool-call markup, parser side (V3.2, V4, V4.1; the render side's pieces are
`render/renderers/dsml.py`):

    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>

vLLM 0.33's `_dsml_arg_converter` and `_unwrap_wrapper_args` (`parser/deepseek_v4.py`): a
`string="true"` value is kept as text, any other (or a missing `string`) is read as JSON when it
parses and kept as text otherwise; a still-open last parameter counts only when it is a string
or already valid JSON. Arguments that are one `arguments`/`input` wrapper object around the
tool's real parameters are unwrapped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from render_service.parsers.engine import find_tool_properties
from render_service.parsers.xml_args import ws_pattern
from render_service.render.renderers.dsml import DSML

# What a DSML structural tag keeps out of free text (xgrammar's builders exclude the think markers).
THINK_MARKERS = ["<think>", "</think>"]

INVOKE_PREFIX = f'<{DSML}invoke name="'
INVOKE_NAME_END = '">'
INVOKE_END = f"</{DSML}invoke>"
PARAM_START = f"<{DSML}parameter"
PARAM_CLOSE = f"</{DSML}parameter>"

_NOT_JSON = object()


def _json_or(value: str, default: Any) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return default


def make_dsml_arg_converter(param_start: str, param_close: str) -> Callable[[str, bool], str]:
    """vLLM's `_dsml_arg_converter` for one DSML dialect (V4.1 spells the tags with a space:
    `<｜DSML｜ parameter`)."""
    start, close = re.escape(param_start), re.escape(param_close)
    # The `string` attribute is optional (a parameter without it is read like string="false").
    head = start + r'\s+name="([^"]+)"(?:\s+string="([^"]*)")?\s*>'
    param_re = re.compile(ws_pattern(head + r"(.*?)(?:" + close + r"|(?=" + start + r"\s+name=))"), re.DOTALL)
    open_param_re = re.compile(ws_pattern(head + r"(.*)$"), re.DOTALL)

    def convert(raw_args: str, partial: bool) -> str:
        params: dict[str, Any] = {}
        end = 0
        for match in param_re.finditer(raw_args):
            name, is_string, value = match.groups()
            params[name] = value if is_string == "true" else _json_or(value, value)
            end = match.end()
        if partial:
            open_param = open_param_re.search(raw_args, end)
            if open_param:
                name, is_string, value = open_param.groups()
                parsed = value if is_string == "true" else _json_or(value, _NOT_JSON)
                if parsed is not _NOT_JSON:
                    params[name] = parsed
        return json.dumps(params, ensure_ascii=False)

    return convert


dsml_arg_converter = make_dsml_arg_converter(PARAM_START, PARAM_CLOSE)


def unwrap_wrapper_args(args_json: str, tools: Any, name: str | None) -> str:
    """`{"arguments": {...}}` / `{"input": {...}}` (or their JSON text) -> the inner object,
    when the tool has no parameter of that name and the inner keys are all its parameters."""
    args = _json_or(args_json, None) if tools and name else None
    properties = find_tool_properties(tools, name) if isinstance(args, dict) and name else None
    if not properties:
        return args_json
    assert isinstance(args, dict)
    allowed = set(properties)
    for wrapper in ("arguments", "input"):
        if set(args) != {wrapper} or wrapper in allowed:
            continue
        inner = args[wrapper]
        if isinstance(inner, str):
            inner = _json_or(inner, _NOT_JSON)
            if inner is _NOT_JSON:
                return args_json
        if isinstance(inner, dict) and set(inner) <= allowed:
            return json.dumps(inner, ensure_ascii=False)
    return args_json


def calls_block_tag(
    tags: list[dict[str, Any]], choice: str, calls_start: str, calls_end: str, auto_excludes: list[str]
) -> dict[str, Any]:
    """xgrammar's DSML structural tag around per-tool `invoke` tags, as its builtin
    `deepseek_v3_2` / `deepseek_v4` / `deepseek_v4_1` builders shape it (reasoning disabled):
    `auto` triggers on the calls block, `forced`/`required` emit it after a blank line."""
    begin = calls_start + "\n"
    if choice == "auto":
        if not tags:
            return {"type": "any_text", "excludes": auto_excludes}
        calls = {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True}
        return {
            "type": "triggered_tags",
            "triggers": [calls_start],
            "tags": [{"type": "tag", "begin": begin, "content": calls, "end": calls_end}],
            "excludes": THINK_MARKERS,
        }
    body = (
        tags[0]
        if choice == "forced"
        else {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True}
    )
    return {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": "\n\n" + begin},
            body,
            {"type": "const_string", "value": calls_end},
        ],
    }
