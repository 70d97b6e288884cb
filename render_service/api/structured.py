"""Structured outputs of vLLM 0.33's render tier, as pure functions of the raw request dict.

Covers what ends up in `sampling_params.structured_outputs`:

* the request validators (`ChatCompletionRequest` / `CompletionRequest`): `validate_response_format`,
  `check_structured_outputs_count` and the pydantic schema of the `response_format` and
  `structured_outputs` fields (`validate_structured_fields`);
* `structured_outputs_from_response_format` (generate/base/protocol.py): `response_format`
  overrides the request's own `structured_outputs`;
* the tool-calling structural tag that the composed parser's `adjust_request` injects for the
  tool parser's structural tag model (parser/abstract_parser.py `_apply_structural_tag`,
  tool_parsers/structural_tag_registry.py), and the JSON-schema fallback of
  `ToolParser.adjust_request` when `VLLM_ENFORCE_STRICT_TOOL_CALLING=0`.

The wire value is `StructuredOutputsParams` serialized whole: every field in declaration order,
nulls included, then `_backend` / `_backend_was_auto`. The structural tag string is
`json.dumps(StructuralTag.model_dump())`, rebuilt here with xgrammar's field order and defaults.

xgrammar's own compile-time checks (`validate_xgrammar_grammar`) cannot be run without
xgrammar; `_xgrammar_accepts` and `_structural_tag_valid` approximate them (schema shape,
the checks of its structural-tag parser, vLLM's unsupported JSON-schema features, Python `re`
for regexes). EBNF grammars are taken as valid; a Lark grammar cannot be converted to EBNF
here, so `tool_choice="auto"` + a strict tool + a Lark `grammar` keeps the grammar alone
(vLLM would OR it with the tool tag).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple, TypeGuard

from render_service.api.protocol import handler_error, schema_error
from render_service.exceptions import RequestValidationError
from render_service.parsers.base import json_schema_format
from render_service.parsers.protocols import ToolParser, ToolStrictLevel
from render_service.parsers.registry import tool_parser_class

__all__ = [
    "StructuredOutputsResult",
    "ToolStrictLevel",
    "check_structured_outputs_count",
    "make_structured_outputs",
    "resolve_structured_outputs",
    "structured_outputs_wire",
    "validate_response_format",
    "validate_structured",
    "validate_structured_fields",
]

# StructuredOutputsParams declaration order (sampling_params.py).
SO_FIELDS = (
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
    "structural_tag",
)
_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_SO_DEFAULTS: dict[str, Any] = {
    "json": None,
    "regex": None,
    "choice": None,
    "grammar": None,
    "json_object": None,
    "disable_any_whitespace": False,
    "disable_additional_properties": False,
    "whitespace_pattern": None,
    "structural_tag": None,
}

MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64
STRUCTURAL_TAG_WRAPPER_NESTING = 16
_NESTING_MESSAGE = (
    "The JSON schema is nested too deeply: objects and arrays may nest at most "
    f"{MAX_STRUCTURED_OUTPUT_JSON_NESTING} levels"
)


class StructuredOutputsResult(NamedTuple):
    """What render puts on the wire, and what `adjust_request` did to the request."""

    structured_outputs: dict[str, Any] | None
    # adjust_request set `request.response_format = None` (it also replaced structured_outputs).
    response_format_cleared: bool
    # VLLM_ENFORCE_STRICT_TOOL_CALLING=0 with tool_choice="required" only: vLLM popped "$defs"
    # from every tool's `parameters` in place, so parse_context.tools lacks them too.
    tool_defs_popped: bool = False


# -- pydantic-style errors ----------------------------------------------------------------------

_MAX_REPORTED_ERRORS = 10


def _summarize_input(value: Any) -> Any:
    """vLLM's `_summarize_error_input`."""
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "...[truncated]"


def _err(kind: str, loc: str, msg: str, value: Any, ctx: dict[str, Any] | None = None) -> dict[str, Any]:
    err = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        err["ctx"] = ctx
    return err


def _raise_errors(errors: list[dict[str, Any]]) -> None:
    """Raise pydantic validation errors as vLLM's validation handler reports them."""
    if not errors:
        return
    if len(errors) == 1 and "ctx" not in errors[0]:
        first = errors[0]
        raise schema_error(first["loc"], first["msg"], first["input"])
    count = len(errors)
    label = "error" if count == 1 else "errors"
    lines = []
    for err in errors[:_MAX_REPORTED_ERRORS]:
        shown = dict(err, input=_summarize_input(err["input"]))
        text = str(shown)
        lines.append(text if len(text) <= 1000 else text[:1000] + "...[truncated]")
    message = f"{count} validation {label}:\n" + "".join(f"  {line}\n" for line in lines)
    if count > _MAX_REPORTED_ERRORS:
        message += f"  ...and {count - _MAX_REPORTED_ERRORS} more {label}\n"
    raise RequestValidationError(message.rstrip(), param=errors[0]["loc"])


_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})


def _lax_bool(value: Any) -> tuple[bool | None, dict[str, Any] | None]:
    """pydantic's lax `bool`: (value, None) or (None, error parts)."""
    if isinstance(value, bool):
        return value, None
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value), None
        return None, {"type": "bool_parsing", "msg": "Input should be a valid boolean, unable to interpret input"}
    if isinstance(value, float):
        if value in (0.0, 1.0):
            return bool(value), None
        kind = "bool_parsing" if value.is_integer() else "bool_type"
        msg = (
            "Input should be a valid boolean, unable to interpret input"
            if kind == "bool_parsing"
            else "Input should be a valid boolean"
        )
        return None, {"type": kind, "msg": msg}
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE_STRINGS:
            return True, None
        if lowered in _FALSE_STRINGS:
            return False, None
        return None, {"type": "bool_parsing", "msg": "Input should be a valid boolean, unable to interpret input"}
    return None, {"type": "bool_type", "msg": "Input should be a valid boolean"}


def _as_bool(value: Any) -> bool | None:
    """The value a lax `bool | None` field ends up with (None when absent or invalid)."""
    if value is None:
        return None
    return _lax_bool(value)[0]


def _check_bool(errors: list[dict[str, Any]], obj: dict[str, Any], name: str, loc: str, nullable: bool = True) -> Any:
    value = obj.get(name)
    if value is None:
        if not nullable and name in obj:
            errors.append(_err("bool_type", f"{loc}.{name}", "Input should be a valid boolean", value))
        return value
    coerced, problem = _lax_bool(value)
    if problem is not None:
        errors.append(_err(problem["type"], f"{loc}.{name}", problem["msg"], value))
    return coerced


def _check_str(errors: list[dict[str, Any]], obj: dict[str, Any], name: str, loc: str, required: bool = False) -> None:
    if name not in obj:
        if required:
            errors.append(_err("missing", f"{loc}.{name}", "Field required", obj))
        return
    value = obj[name]
    if value is None and not required:
        return
    if not isinstance(value, str):
        errors.append(_err("string_type", f"{loc}.{name}", "Input should be a valid string", value))


def _check_literal(errors: list[dict[str, Any]], obj: dict[str, Any], loc: str, choices: tuple[str, ...]) -> None:
    if "type" not in obj:
        errors.append(_err("missing", f"{loc}.type", "Field required", obj))
        return
    if obj["type"] in choices and isinstance(obj["type"], str):
        return
    quoted = [f"'{c}'" for c in choices]
    expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    errors.append(
        _err("literal_error", f"{loc}.type", f"Input should be {expected}", obj["type"], {"expected": expected})
    )


def _not_a_model(loc: str, value: Any) -> dict[str, Any]:
    return _err(
        "model_attributes_type", loc, "Input should be a valid dictionary or object to extract fields from", value
    )


# -- response_format ----------------------------------------------------------------------------

_RF_LOC = "body.response_format"


def _response_format_member_errors(rf: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Errors of the three members of `AnyResponseFormat` (ResponseFormat, StructuralTag..., Legacy...)."""
    if not isinstance(rf, dict):
        return [_not_a_model(_RF_LOC, rf)], [_not_a_model(_RF_LOC, rf)], [_not_a_model(_RF_LOC, rf)]

    plain: list[dict[str, Any]] = []
    _check_literal(plain, rf, _RF_LOC, ("text", "json_object", "json_schema"))
    schema = rf.get("json_schema")
    if schema is not None:
        loc = f"{_RF_LOC}.json_schema"
        if not isinstance(schema, dict):
            plain.append(_not_a_model(loc, schema))
        else:
            _check_str(plain, schema, "name", loc, required=True)
            _check_str(plain, schema, "description", loc)
            if schema.get("schema") is not None and not isinstance(schema["schema"], dict):
                plain.append(_err("dict_type", f"{loc}.schema", "Input should be a valid dictionary", schema["schema"]))
            _check_bool(plain, schema, "strict", loc)

    tag: list[dict[str, Any]] = []
    _check_literal(tag, rf, _RF_LOC, ("structural_tag",))
    if "format" not in rf:
        tag.append(_err("missing", f"{_RF_LOC}.format", "Field required", rf))

    legacy: list[dict[str, Any]] = []
    _check_literal(legacy, rf, _RF_LOC, ("structural_tag",))
    if "structures" not in rf:
        legacy.append(_err("missing", f"{_RF_LOC}.structures", "Field required", rf))
    elif not isinstance(rf["structures"], list):
        legacy.append(_err("list_type", f"{_RF_LOC}.structures", "Input should be a valid list", rf["structures"]))
    else:
        for index, item in enumerate(rf["structures"]):
            loc = f"{_RF_LOC}.structures.{index}"
            if not isinstance(item, dict):
                legacy.append(_not_a_model(loc, item))
                continue
            _check_str(legacy, item, "begin", loc, required=True)
            if item.get("schema") is not None and not isinstance(item["schema"], dict):
                legacy.append(_err("dict_type", f"{loc}.schema", "Input should be a valid dictionary", item["schema"]))
            _check_str(legacy, item, "end", loc, required=True)
    if "triggers" not in rf:
        legacy.append(_err("missing", f"{_RF_LOC}.triggers", "Field required", rf))
    elif not isinstance(rf["triggers"], list):
        legacy.append(_err("list_type", f"{_RF_LOC}.triggers", "Input should be a valid list", rf["triggers"]))
    else:
        for index, item in enumerate(rf["triggers"]):
            if not isinstance(item, str):
                legacy.append(
                    _err("string_type", f"{_RF_LOC}.triggers.{index}", "Input should be a valid string", item)
                )
    return plain, tag, legacy


def _structural_tag_dump(rf: dict[str, Any]) -> dict[str, Any] | None:
    """`model_dump(by_alias=True)` of the structural-tag member `rf` validates as, else None.

    pydantic's smart union prefers the legacy shape (more fields set) when both validate.
    Declared fields come first, then the extra keys (`extra="allow"`) in request order.
    """
    _, tag_errors, legacy_errors = _response_format_member_errors(rf)
    if not legacy_errors:
        structures = []
        for item in rf["structures"]:
            dumped = {"begin": item["begin"], "schema": item.get("schema"), "end": item["end"]}
            dumped.update({k: v for k, v in item.items() if k not in dumped})
            structures.append(dumped)
        out: dict[str, Any] = {"type": "structural_tag", "structures": structures, "triggers": rf["triggers"]}
    elif not tag_errors:
        out = {"type": "structural_tag", "format": rf["format"]}
    else:
        return None
    out.update({k: v for k, v in rf.items() if k not in out})
    return out


def validate_response_format(body: dict[str, Any]) -> None:
    """The `validate_response_format` model validator (chat and completions alike)."""
    rf = body.get("response_format")
    if rf is None:
        return
    rf_type = rf.get("type") if isinstance(rf, dict) else None
    if rf_type == "json_schema" and rf.get("json_schema") is None:
        raise handler_error(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.", "response_format"
        )
    if rf_type == "structural_tag":
        dumped = _structural_tag_dump(rf)
        if dumped is None:
            raise handler_error("Invalid response_format structural_tag specification.", "response_format")
        _validate_structural_tag_payload(json.dumps(dumped), "response_format")


def _validate_structural_tag_payload(payload: Any, parameter: str) -> None:
    """`validate_structural_tag_payload` (generate/base/protocol.py)."""
    invalid = f"Invalid {parameter} structural_tag specification."
    if isinstance(payload, str) and not payload:
        raise handler_error(invalid, parameter)
    if isinstance(payload, str):
        check_json_nesting(payload, structural_tag=True)
    if not _structural_tag_valid(payload):
        raise handler_error(invalid, parameter)


def check_structured_outputs_count(body: dict[str, Any], *, chat: bool) -> None:
    """The `check_structured_outputs_count` model validator."""
    so = body.get("structured_outputs")
    if so is None:
        return
    if not isinstance(so, dict):
        # vLLM calls `.get` on it and answers 500; field validation reports it (a 400).
        return
    count = sum(so.get(k) is not None for k in ("json", "regex", "choice"))
    if count > 1:
        message = "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice')."
        raise handler_error(message, None if chat else "structured_outputs")
    if chat and count > 0 and body.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise handler_error("You can only either use constraints for structured outputs or tools, not both.")
    if so.get("structural_tag") is not None:
        _validate_structural_tag_payload(so["structural_tag"], "structured_outputs")


def _structured_outputs_fields(so: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """pydantic's field validation of `structured_outputs` (a `StructuredOutputsParams`
    dataclass): (errors, the coerced init values)."""
    loc = "body.structured_outputs"
    if not isinstance(so, dict):
        return [
            _err("dataclass_type", loc, "Input should be a dictionary or an instance of StructuredOutputsParams", so)
        ], {}
    errors: list[dict[str, Any]] = []
    values: dict[str, Any] = {}
    json_value = so.get("json")
    if json_value is not None and not isinstance(json_value, (str, dict)):
        errors.append(_err("string_type", f"{loc}.json", "Input should be a valid string", json_value))
        errors.append(_err("dict_type", f"{loc}.json", "Input should be a valid dictionary", json_value))
    values["json"] = json_value
    _check_str(errors, so, "regex", loc)
    values["regex"] = so.get("regex")
    choice = so.get("choice")
    if choice is not None:
        if not isinstance(choice, list):
            errors.append(_err("list_type", f"{loc}.choice", "Input should be a valid list", choice))
        else:
            for index, item in enumerate(choice):
                if not isinstance(item, str):
                    errors.append(_err("string_type", f"{loc}.choice.{index}", "Input should be a valid string", item))
    values["choice"] = choice
    _check_str(errors, so, "grammar", loc)
    values["grammar"] = so.get("grammar")
    values["json_object"] = _check_bool(errors, so, "json_object", loc)
    for name in ("disable_any_whitespace", "disable_additional_properties"):
        coerced = _check_bool(errors, so, name, loc, nullable=False)
        values[name] = False if coerced is None else coerced
    _check_str(errors, so, "whitespace_pattern", loc)
    values["whitespace_pattern"] = so.get("whitespace_pattern")
    _check_str(errors, so, "structural_tag", loc)
    values["structural_tag"] = so.get("structural_tag")
    return errors, values


def _request_structured_outputs(so: Any) -> dict[str, Any] | None:
    """The request's `structured_outputs` as `StructuredOutputsParams` (body already validated)."""
    if so is None:
        return None
    errors, values = _structured_outputs_fields(so)
    _raise_errors(errors)
    return make_structured_outputs(**values)


def validate_structured_fields(body: dict[str, Any]) -> None:
    """pydantic's field validation of `response_format` and `structured_outputs`.

    Runs after the model validators. Errors of both fields are reported together (vLLM also
    reports them with the other fields' errors, in declaration order: `response_format` after
    `presence_penalty`, `structured_outputs` after `mm_processor_kwargs`). Once
    `structured_outputs` validates, constructing `StructuredOutputsParams` runs its
    constraint-count check, whose error escapes pydantic and wins over any collected error.
    """
    errors: list[dict[str, Any]] = []
    rf = body.get("response_format")
    if rf is not None:
        plain, tag, legacy = _response_format_member_errors(rf)
        if plain and tag and legacy:
            errors += plain + tag + legacy
    so = body.get("structured_outputs")
    if so is not None:
        so_errors, values = _structured_outputs_fields(so)
        errors += so_errors
        if not so_errors:
            make_structured_outputs(**values)
    _raise_errors(errors)


def validate_structured(body: dict[str, Any], *, chat: bool) -> None:
    """The three checks above, in vLLM's relative order.

    pydantic runs "before" model validators last-defined first, then the fields. Full order:
    chat: check_system_message_content_type, drop_prompt_token_ids_with_media,
    check_generation_prompt, check_tool_usage (sets the "auto" default),
    **check_structured_outputs_count**, check_logprobs, validate_stream_options,
    **validate_response_format**, _normalize_messages_before, check_cache_salt_support, ...,
    then field validation (**validate_structured_fields** among the other fields).
    completions: validate_prompt_list_length, validate_prompt_and_prompt_embeds,
    validate_stream_options, check_logprobs, **check_structured_outputs_count**,
    **validate_response_format**, normalize_null_max_tokens, ..., then fields.
    """
    check_structured_outputs_count(body, chat=chat)
    validate_response_format(body)
    validate_structured_fields(body)


# -- StructuredOutputsParams ----------------------------------------------------------------------


def make_structured_outputs(**values: Any) -> dict[str, Any]:
    """`StructuredOutputsParams(**values)` serialized, with its `__post_init__` check."""
    params = dict(_SO_DEFAULTS)
    params.update(values)
    params["_backend"] = None
    params["_backend_was_auto"] = False
    count = sum(params[k] is not None for k in _CONSTRAINTS)
    if count > 1:
        raise handler_error(
            f"You can only use one kind of structured outputs constraint but multiple are specified: {params}"
        )
    if count < 1:
        raise handler_error(f"You must use one kind of structured outputs constraint but none are specified: {params}")
    return params


def _exceeds_json_nesting(spec: Any, limit: int) -> bool:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except RecursionError:
            return True
        except ValueError:
            return False
    level = [spec]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, (dict, list))
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return False
    return True


def check_json_nesting(spec: Any, *, structural_tag: bool = False) -> None:
    """`sampling_params.check_json_nesting`."""
    limit = MAX_STRUCTURED_OUTPUT_JSON_NESTING + (STRUCTURAL_TAG_WRAPPER_NESTING if structural_tag else 0)
    if spec and _exceeds_json_nesting(spec, limit):
        raise handler_error(_NESTING_MESSAGE)


def _from_response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """`extract_structured_outputs()`: `structured_outputs_from_response_format`."""
    so = _request_structured_outputs(body.get("structured_outputs"))
    rf = body.get("response_format")
    if rf is None or rf.get("type") == "text":
        return so
    rf_type = rf.get("type")
    if rf_type == "json_object":
        overrides: dict[str, Any] = {"json_object": True}
    elif rf_type == "json_schema":
        overrides = {"json": rf["json_schema"].get("schema")}
    else:
        overrides = {"structural_tag": json.dumps(_structural_tag_dump(rf))}
    if so is None:
        return make_structured_outputs(**overrides)
    base = {k: so[k] for k in SO_FIELDS}
    base.update(overrides)
    return make_structured_outputs(**base)


# -- tool calling ---------------------------------------------------------------------------------


def _tool_is_strict(tool: dict[str, Any]) -> bool:
    return _as_bool(tool["function"].get("strict")) is True


def _tools_structural_tag(
    tools: list[dict[str, Any]], tool_choice: Any, strict_level: ToolStrictLevel, parser: type[ToolParser]
) -> dict[str, Any] | None:
    """`get_model_structural_tag` for the parser's structural tag model, dumped
    (`StructuralTag.model_dump()`)."""
    if not tools or tool_choice == "none":
        return None
    if tool_choice == "auto" and strict_level == ToolStrictLevel.AUTO and not any(map(_tool_is_strict, tools)):
        return None
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise handler_error(f"The tool with name '{name}' is not found in the tools list.")
        if len(picked) != 1:
            raise handler_error("Forced tool choice must resolve to exactly one tool.")
        tools, choice = picked, "forced"
    else:
        choice = "auto" if tool_choice in (None, "auto") else "required"
    strict = [strict_level >= ToolStrictLevel.PARAMETER or _tool_is_strict(t) for t in tools]
    tag_format = parser.structural_tag(tools, strict, choice)
    # Families give xgrammar's constructor arguments; model_dump() fills the defaults.
    return None if tag_format is None else {"type": "structural_tag", "format": _normalize_format(tag_format)}


_TOOL_CALL_LIST_FORMATS = frozenset({"triggered_tags", "token_triggered_tags", "tags_with_separator"})


def _limit_to_single_tool_call(node: Any) -> None:
    """`limit_to_single_tool_call`, on the dumped format tree."""
    if isinstance(node, dict):
        if node.get("type") in _TOOL_CALL_LIST_FORMATS:
            node["stop_after_first"] = True
        for key, value in node.items():
            if key != "json_schema":
                _limit_to_single_tool_call(value)
    elif isinstance(node, list):
        for item in node:
            _limit_to_single_tool_call(item)


def _params_or_empty_object(params: Any) -> Any:
    return params if params else {"type": "object", "properties": {}}


def _json_schema_from_tools(tools: list[dict[str, Any]], tool_choice: Any, parallel_tool_calls: bool | None) -> Any:
    """`get_json_schema_from_tools` (the VLLM_ENFORCE_STRICT_TOOL_CALLING=0 path)."""
    if tool_choice in ("none", None) or tools is None:
        return None
    if isinstance(tool_choice, dict):
        by_name = {t["function"]["name"]: t for t in tools}
        name = tool_choice["function"]["name"]
        if name not in by_name:
            raise handler_error(f"Tool '{name}' has not been passed in `tools`.")
        return _params_or_empty_object(by_name[name]["function"].get("parameters"))
    if tool_choice != "required":
        return None
    schemas = []
    all_defs: dict[str, Any] = {}
    for tool in tools:
        name = tool["function"]["name"]
        params = tool["function"].get("parameters")
        if params is not None:
            defs = params.get("$defs", {})
            if not isinstance(defs, dict):
                raise handler_error(
                    f"`$defs` in the parameters of tool '{name}' must be an object, got {type(defs).__name__}.", "tools"
                )
            for def_name, def_schema in defs.items():
                if def_name in all_defs and all_defs[def_name] != def_schema:
                    raise handler_error(
                        f"Tool definition '{def_name}' has multiple schemas, which is not supported.", "tools"
                    )
                all_defs[def_name] = def_schema
            params = {k: v for k, v in params.items() if k != "$defs"}
        schemas.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": _params_or_empty_object(params),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": schemas}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if all_defs:
        schema["$defs"] = all_defs
    return schema


def _output_format(so: dict[str, Any]) -> dict[str, Any] | None:
    """`structured_outputs_to_format` (parser/abstract_parser.py), dumped."""
    if so["json_object"]:
        return json_schema_format({"type": "object"})
    if so["json"] is not None:
        schema = so["json"]
        if isinstance(schema, str):
            check_json_nesting(schema)
            schema = json.loads(schema)
        return json_schema_format(schema)
    if so["regex"] is not None:
        return {"type": "regex", "pattern": so["regex"]}
    if so["choice"] is not None:
        return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in so["choice"]]}
    if so["grammar"] is not None:
        return {"type": "grammar", "grammar": so["grammar"]}
    if so["structural_tag"] is not None:
        check_json_nesting(so["structural_tag"], structural_tag=True)
        s_tag = json.loads(so["structural_tag"])
        if "structures" in s_tag:
            return {
                "type": "triggered_tags",
                "triggers": s_tag["triggers"],
                "tags": [
                    {"type": "tag", "begin": s["begin"], "content": json_schema_format(s["schema"]), "end": s["end"]}
                    for s in s_tag["structures"]
                ],
                "at_least_one": False,
                "stop_after_first": False,
                "excludes": [],
            }
        return _normalize_format(s_tag["format"])
    return None


def _apply_structural_tag(
    body: dict[str, Any],
    tools: list[dict[str, Any]],
    tool_choice: Any,
    structured_outputs: dict[str, Any] | None,
    parser: type[ToolParser],
    enforce_strict_tool_calling: bool,
    tool_strict_level: str | None,
) -> dict[str, Any] | None:
    """`Parser._apply_structural_tag`: the dumped structural tag it sets, or None if it leaves the request."""
    if not (tool_choice in ("auto", "required") or isinstance(tool_choice, dict)):
        return None
    if parser.structural_tag_model is None:  # no tools to resolve: the request is left alone
        return None
    is_auto = tool_choice == "auto"
    single_call = _as_bool(body.get("parallel_tool_calls", True)) is False
    strict_level = (
        parser.default_tool_strict_level
        if tool_strict_level is None
        else ToolStrictLevel[tool_strict_level.strip().upper()]
    )
    if single_call and not (is_auto and structured_outputs is not None):
        # Limiting the call count needs the call envelope in the grammar.
        strict_level = max(strict_level, ToolStrictLevel.FUNCTION)
    # resolve_tool_strictness(...) is None: no structural tag.
    if is_auto and strict_level == ToolStrictLevel.AUTO and not any(map(_tool_is_strict, tools)):
        return None
    output_format = None
    if is_auto and structured_outputs is not None:
        if not _xgrammar_accepts(structured_outputs):
            return None
        output_format = _output_format(structured_outputs)
    if not enforce_strict_tool_calling:  # ToolParser.get_structural_tag returns None
        return None
    # With an output format the tools part is "required": the structured output is the other branch.
    tag = _tools_structural_tag(tools, "required" if output_format is not None else tool_choice, strict_level, parser)
    if tag is None:
        return None
    if single_call:
        _limit_to_single_tool_call(tag["format"])
    if output_format is not None:
        tag = {"type": "structural_tag", "format": {"type": "or", "elements": [tag["format"], output_format]}}
    return tag


def resolve_structured_outputs(
    body: dict[str, Any],
    *,
    chat: bool,
    tool_parser: str | None,
    enable_auto_tool_choice: bool,
    reasoning_parser: str | None,
    enforce_strict_tool_calling: bool = True,
    tool_strict_level: str | None = None,
) -> StructuredOutputsResult:
    """`sampling_params.structured_outputs` after `adjust_request` + `to_sampling_params`.

    `body` must have passed `validate_structured` and vLLM's tool checks (check_tool_usage).
    It is not modified. `reasoning_parser` only decides whether adjust_request runs at all,
    which never changes structured outputs (only the tool parser touches them).
    """
    del reasoning_parser
    tool_choice = body.get("tool_choice", "auto" if body.get("tools") else "none")
    has_tool_parser = chat and enable_auto_tool_choice and tool_parser is not None
    parser = tool_parser_class(tool_parser) if has_tool_parser and tool_parser is not None else None
    if parser is None or not body.get("tools") or tool_choice == "none":
        return StructuredOutputsResult(_from_response_format(body), False)
    tools: list[dict[str, Any]] = body["tools"]
    structured_outputs = _from_response_format(body)  # request.extract_structured_outputs()

    # Parser._apply_structural_tag
    tag = _apply_structural_tag(
        body,
        tools,
        tool_choice,
        structured_outputs,
        parser,
        enforce_strict_tool_calling,
        tool_strict_level,
    )
    if tag is not None:
        return StructuredOutputsResult(make_structured_outputs(structural_tag=json.dumps(tag)), True)

    # ToolParser.adjust_request: the JSON-schema path only runs while the parser still "supports
    # required and named", i.e. with VLLM_ENFORCE_STRICT_TOOL_CALLING=0 or no structural tag model.
    if enforce_strict_tool_calling and not parser.supports_required_and_named:
        return StructuredOutputsResult(structured_outputs, False)
    own = body.get("structured_outputs")
    if own is not None and own.get("structural_tag") is not None:
        return StructuredOutputsResult(structured_outputs, False)
    parallel = _as_bool(body.get("parallel_tool_calls", True))
    schema = _json_schema_from_tools(tools, tool_choice, parallel)
    if schema is None:
        return StructuredOutputsResult(structured_outputs, False)
    return StructuredOutputsResult(make_structured_outputs(json=schema), True, tool_choice == "required")


def structured_outputs_wire(
    body: dict[str, Any],
    *,
    chat: bool,
    tool_parser: str | None,
    enable_auto_tool_choice: bool,
    reasoning_parser: str | None,
    enforce_strict_tool_calling: bool = True,
    tool_strict_level: str | None = None,
) -> dict[str, Any] | None:
    """The `sampling_params.structured_outputs` object vLLM emits, or None when it omits it."""
    return resolve_structured_outputs(
        body,
        chat=chat,
        tool_parser=tool_parser,
        enable_auto_tool_choice=enable_auto_tool_choice,
        reasoning_parser=reasoning_parser,
        enforce_strict_tool_calling=enforce_strict_tool_calling,
        tool_strict_level=tool_strict_level,
    ).structured_outputs


# -- what xgrammar would accept --------------------------------------------------------------------

_STRING_SUPPORTED_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


def _schema_types(schema: dict[str, Any]) -> set[str]:
    schema_type = schema.get("type")
    if isinstance(schema_type, str):
        return {schema_type}
    if isinstance(schema_type, list):
        return {item for item in schema_type if isinstance(item, str)}
    return set()


def _has_pattern_and_length_bounds(schema: dict[str, Any]) -> bool:
    return ("pattern" in schema or "format" in schema) and ("minLength" in schema or "maxLength" in schema)


def has_xgrammar_unsupported_json_features(schema: Any) -> bool:
    """`backend_xgrammar.has_xgrammar_unsupported_json_features`."""

    def check_object(obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        types = _schema_types(obj)
        if (types & {"integer", "number"}) and "multipleOf" in obj:
            return True
        if "array" in types and any(k in obj for k in ("uniqueItems", "contains", "minContains", "maxContains")):
            return True
        if "string" in types and "format" in obj and obj["format"] not in _STRING_SUPPORTED_FORMATS:
            return True
        if "string" in types and _has_pattern_and_length_bounds(obj):
            return True
        if "object" in types and "propertyNames" in obj:
            names = obj.get("propertyNames")
            if isinstance(names, dict) and _has_pattern_and_length_bounds(names):
                return True
            if "patternProperties" in obj or "properties" in obj:
                return True
            if obj.get("unevaluatedProperties", True) is not True:
                return True
        if "object" in types and isinstance(obj.get("patternProperties"), dict):
            if "properties" in obj or len(obj["patternProperties"]) > 1:
                return True
        all_of = obj.get("allOf")
        if isinstance(all_of, list) and len(all_of) >= 2:
            return True
        for value in obj.values():
            if isinstance(value, dict):
                if check_object(value):
                    return True
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, dict) and check_object(item):
                        return True
        return False

    return check_object(schema)


def _json_schema_compiles(schema: Any) -> bool:
    """A rough stand-in for `xgr.Grammar.from_json_schema`: the schema's shape and its types."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        if not all(isinstance(t, str) and t in _JSON_TYPES for t in names):
            return False
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames"):
        sub = schema.get(key)
        if isinstance(sub, dict) and not _json_schema_compiles(sub):
            return False
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        subs = schema.get(key)
        if isinstance(subs, dict) and not all(_json_schema_compiles(s) for s in subs.values() if isinstance(s, dict)):
            return False
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        subs = schema.get(key)
        if isinstance(subs, list) and not all(_json_schema_compiles(s) for s in subs if isinstance(s, dict)):
            return False
    return True


_UNSUPPORTED_REGEX = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]")


def _regex_compiles(pattern: Any) -> bool:
    """A rough stand-in for `xgr.Grammar.from_regex` (no lookaround, no backreferences)."""
    if not isinstance(pattern, str) or not pattern or "\x00" in pattern:
        return False
    if _UNSUPPORTED_REGEX.search(pattern):
        return False
    try:
        re.compile(pattern)
    except (re.error, RecursionError):
        return False
    return True


def _grammar_is_likely_lark(grammar: Any) -> bool:
    if not grammar or not isinstance(grammar, str):
        return False
    for line in grammar.split("\n"):
        line = re.sub(r"(#|//).*$", "", line).strip()
        if line and "::=" in line:
            return False
    return True


def _xgrammar_accepts(so: dict[str, Any]) -> bool:
    """`_xgrammar_supports`: `validate_xgrammar_grammar` on a copy, errors -> False."""
    if so["regex"] is not None:
        return _regex_compiles(so["regex"])
    if so["choice"]:
        return True
    if so["json"] is not None:
        if _exceeds_json_nesting(so["json"], MAX_STRUCTURED_OUTPUT_JSON_NESTING):
            return False
        schema = so["json"]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                return False
        return not has_xgrammar_unsupported_json_features(schema) and _json_schema_compiles(schema)
    if so["json_object"]:
        return True
    if so["grammar"]:
        # EBNF is taken as valid. A Lark grammar would have to be converted to EBNF for the tool
        # tag (xgrammar's Grammar.from_lark), which needs xgrammar: keep the grammar alone.
        return not _grammar_is_likely_lark(so["grammar"])
    if so["structural_tag"]:
        if _exceeds_json_nesting(
            so["structural_tag"], MAX_STRUCTURED_OUTPUT_JSON_NESTING + STRUCTURAL_TAG_WRAPPER_NESTING
        ):
            return False
        return _structural_tag_valid(so["structural_tag"])
    # json_object=False or choice=[]: "XGrammar structured outputs backend does not support this".
    return False


# -- structural tags: validation (xgrammar's parser) and normalization (its pydantic models) -------

_STYLES = frozenset(
    {
        "json",
        "qwen_xml",
        "minimax_xml",
        "minimax_m3_xml",
        "deepseek_xml",
        "glm_xml",
        "cohere_xml",
        "kimi_k3_xml",
        "deepseek_v4_1_xml",
    }
)
_INT32_MAX = 2_147_483_647


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(value: Any, non_empty_items: bool = False) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and (v or not non_empty_items) for v in value)


def _token_ok(value: Any) -> bool:
    # String tokens need tokenizer_info, which vLLM's validation does not pass.
    return _is_int(value)


def _infer_format_type(fmt: dict[str, Any]) -> str | None:
    """The format xgrammar's structural-tag parser assumes for an object without "type"."""
    for key, kind in (
        ("value", "const_string"),
        ("json_schema", "json_schema"),
        ("triggers", "triggered_tags"),
        ("separator", "tags_with_separator"),
        ("begin", "tag"),
        ("elements", "sequence"),
        ("rules", "dispatch"),
        ("min", "repeat"),
        ("content", "optional"),
        ("excludes", "any_text"),
    ):
        if key in fmt:
            return kind
    return None


_ALWAYS_UNLIMITED = frozenset(
    {
        "any_text",
        "any_tokens",
        "triggered_tags",
        "token_triggered_tags",
        "tags_with_separator",
        "dispatch",
        "token_dispatch",
        "star",
        "plus",
    }
)


def _unlimited(fmt: Any) -> bool:
    """Whether a tag's content can run on forever (then one of its ends must be non-empty)."""
    if not isinstance(fmt, dict):
        return False
    kind = fmt.get("type") or _infer_format_type(fmt)
    if kind in _ALWAYS_UNLIMITED:
        return True
    if kind in ("optional", "repeat"):
        return _unlimited(fmt.get("content"))
    if kind in ("or", "sequence"):
        elements = fmt.get("elements")
        return isinstance(elements, list) and any(_unlimited(e) for e in elements)
    return False


def _tag_valid(tag: Any) -> bool:
    if not isinstance(tag, dict) or tag.get("type", "tag") != "tag":
        return False
    begin, end = tag.get("begin"), tag.get("end")
    if isinstance(begin, dict):
        if not _token_ok(begin.get("token")):
            return False
    elif not isinstance(begin, str):
        return False
    if isinstance(end, list):
        if not end or not _str_list(end):
            return False
        ends = end
    elif isinstance(end, dict):
        if not _token_ok(end.get("token")):
            return False
        ends = ["<token>"]
    elif isinstance(end, str):
        ends = [end]
    else:
        return False
    content = tag.get("content")
    if not _format_valid(content):
        return False
    return not (_unlimited(content) and not any(ends))


def _opt_int_ok(fmt: dict[str, Any], name: str) -> bool:
    value = fmt.get(name)
    return value is None or (_is_int(value) and 0 <= value <= _INT32_MAX)


def _format_valid(fmt: Any, depth: int = 0) -> bool:
    if not isinstance(fmt, dict) or depth > 200:
        return False
    kind = fmt.get("type") if "type" in fmt else _infer_format_type(fmt)
    if kind == "any_text":
        return _str_list(fmt.get("excludes", [])) and _opt_int_ok(fmt, "max_tokens") and _opt_int_ok(fmt, "max_chars")
    if kind == "const_string":
        return isinstance(fmt.get("value"), str)
    if kind in ("json_schema", "qwen_xml_parameter"):
        schema = fmt.get("json_schema")
        if not isinstance(schema, (dict, bool)):
            return False
        if kind == "json_schema":
            if fmt.get("style", "json") not in _STYLES or not isinstance(fmt.get("any_order", False), bool):
                return False
            whitespace = fmt.get("max_whitespace_cnt")
            if whitespace is not None and not (_is_int(whitespace) and whitespace > 0):
                return False
            if not _str_list(fmt.get("excludes", [])):
                return False
        return _json_schema_compiles(schema)
    if kind == "grammar":
        return isinstance(fmt.get("grammar"), str) and bool(fmt["grammar"])
    if kind == "regex":
        return _regex_compiles(fmt.get("pattern"))
    if kind in ("or", "sequence"):
        elements = fmt.get("elements")
        return isinstance(elements, list) and bool(elements) and all(_format_valid(e, depth + 1) for e in elements)
    if kind == "tag":
        return _tag_valid(dict(fmt, type="tag"))
    if kind in ("triggered_tags", "token_triggered_tags", "tags_with_separator"):
        tags = fmt.get("tags")
        if not isinstance(tags, list) or not tags or not all(_tag_valid(t) for t in tags):
            return False
        if not all(isinstance(fmt.get(k, False), bool) for k in ("at_least_one", "stop_after_first")):
            return False
        if kind == "tags_with_separator":
            return isinstance(fmt.get("separator"), str)
        if kind == "token_triggered_tags":
            triggers = fmt.get("trigger_tokens")
            return isinstance(triggers, list) and bool(triggers) and all(_token_ok(t) for t in triggers)
        triggers = fmt.get("triggers")
        if not isinstance(triggers, list) or not triggers or not _str_list(triggers, non_empty_items=True):
            return False
        if not _str_list(fmt.get("excludes", [])):
            return False
        return all(isinstance(t["begin"], str) and any(t["begin"].startswith(tr) for tr in triggers) for t in tags)
    if kind in ("optional", "plus", "star"):
        return _format_valid(fmt.get("content"), depth + 1)
    if kind == "repeat":
        low, high = fmt.get("min"), fmt.get("max")
        return _is_int(low) and _is_int(high) and 0 <= low <= high and _format_valid(fmt.get("content"), depth + 1)
    if kind == "dispatch":
        rules = fmt.get("rules")
        return (
            isinstance(rules, list)
            and bool(rules)
            and all(
                isinstance(r, list)
                and len(r) == 2
                and isinstance(r[0], str)
                and r[0]
                and _format_valid(r[1], depth + 1)
                for r in rules
            )
            and isinstance(fmt.get("loop", True), bool)
            and _str_list(fmt.get("excludes", []))
        )
    if kind == "token":
        return _token_ok(fmt.get("token"))
    if kind in ("exclude_token", "any_tokens"):
        return all(_token_ok(t) for t in fmt.get("exclude_tokens", [])) and _opt_int_ok(fmt, "max_tokens")
    if kind == "token_dispatch":
        rules = fmt.get("rules")
        return (
            isinstance(rules, list)
            and bool(rules)
            and all(
                isinstance(r, list) and len(r) == 2 and _token_ok(r[0]) and _format_valid(r[1], depth + 1)
                for r in rules
            )
        )
    return False


def _structural_tag_valid(payload: Any) -> bool:
    """Whether `validate_xgrammar_grammar` accepts a `structural_tag` payload (approximated)."""
    if not isinstance(payload, str) or not payload:
        return False
    try:
        s_tag = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    if not isinstance(s_tag, dict):
        return False
    if "structures" in s_tag:  # legacy: StructuralTagItem list + triggers
        structures, triggers = s_tag.get("structures"), s_tag.get("triggers")
        if not isinstance(structures, list) or not structures or not _str_list(triggers, non_empty_items=True):
            return False
        if not triggers:
            return False
        for item in structures:
            if not isinstance(item, dict) or not all(k in item for k in ("begin", "schema", "end")):
                return False
            if not isinstance(item["begin"], str) or not isinstance(item["end"], str):
                return False
            if not isinstance(item["schema"], (dict, bool)):
                return False
            if not any(item["begin"].startswith(t) for t in triggers):
                return False
            if not _json_schema_compiles(item["schema"]):
                return False
        return True
    if s_tag.get("type", "structural_tag") != "structural_tag" or "format" not in s_tag:
        return False
    return _format_valid(s_tag["format"])


# xgrammar's pydantic format models: (type, [(field, default or _REQUIRED)...]) in declaration order.
_REQUIRED = object()
_FORMAT_FIELDS: dict[str, tuple[tuple[str, Any], ...]] = {
    "any_text": (("excludes", []), ("max_tokens", None), ("max_chars", None)),
    "const_string": (("value", _REQUIRED),),
    "json_schema": (
        ("json_schema", _REQUIRED),
        ("style", "json"),
        ("any_order", False),
        ("max_whitespace_cnt", None),
        ("excludes", []),
    ),
    "grammar": (("grammar", _REQUIRED),),
    "regex": (("pattern", _REQUIRED),),
    "qwen_xml_parameter": (("json_schema", _REQUIRED),),
    "or": (("elements", _REQUIRED),),
    "sequence": (("elements", _REQUIRED),),
    "tag": (("begin", _REQUIRED), ("content", _REQUIRED), ("end", _REQUIRED)),
    "triggered_tags": (
        ("triggers", _REQUIRED),
        ("tags", _REQUIRED),
        ("at_least_one", False),
        ("stop_after_first", False),
        ("excludes", []),
    ),
    "token_triggered_tags": (
        ("trigger_tokens", _REQUIRED),
        ("tags", _REQUIRED),
        ("exclude_tokens", []),
        ("at_least_one", False),
        ("stop_after_first", False),
    ),
    "tags_with_separator": (
        ("tags", _REQUIRED),
        ("separator", _REQUIRED),
        ("at_least_one", False),
        ("stop_after_first", False),
    ),
    "optional": (("content", _REQUIRED),),
    "plus": (("content", _REQUIRED),),
    "star": (("content", _REQUIRED),),
    "token": (("token", _REQUIRED),),
    "exclude_token": (("exclude_tokens", []),),
    "any_tokens": (("exclude_tokens", []), ("max_tokens", None)),
    "repeat": (("min", _REQUIRED), ("max", _REQUIRED), ("content", _REQUIRED)),
    "dispatch": (("rules", _REQUIRED), ("loop", True), ("excludes", [])),
    "token_dispatch": (("rules", _REQUIRED), ("loop", True), ("exclude_tokens", [])),
}


def _pydantic_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 50 else f"{text[:25]}...{text[-24:]}"


def _normalize_format(
    fmt: dict[str, Any], kind: str | None = None, loc: str = "format", missing: list[str] | None = None
) -> dict[str, Any]:
    """`StructuralTag.model_validate(...).format.model_dump()`: defaults filled, extras dropped.

    A format without "type" fails pydantic's discriminated union; `missing` collects those
    errors (the top-level call raises them as vLLM reports the ValidationError).
    """
    top = missing is None
    errors: list[str] = [] if missing is None else missing
    if kind is None and "type" not in fmt:
        errors.append(
            f"{loc}\n  Unable to extract tag using discriminator 'type' [type=union_tag_not_found, "
            f"input_value={_pydantic_repr(fmt)}, input_type=dict]\n    For further information visit "
            "https://errors.pydantic.dev/2.14/v/union_tag_not_found"
        )
        kind = _infer_format_type(fmt) or "any_text"
    elif kind is None:
        kind = fmt["type"]
        loc = f"{loc}.{kind}"
    assert kind is not None
    out: dict[str, Any] = {"type": kind}
    for name, default in _FORMAT_FIELDS[kind]:
        value = fmt.get(name, default)
        if value is _REQUIRED:
            continue
        if name == "content":
            value = _normalize_format(value, None, f"{loc}.content", errors)
        elif name in ("begin", "end") and isinstance(value, dict):
            value = _normalize_format(value, "token", f"{loc}.{name}", errors)
        elif name == "elements":
            value = [_normalize_format(e, None, f"{loc}.elements.{i}", errors) for i, e in enumerate(value)]
        elif name == "tags":
            value = [_normalize_format(t, "tag", f"{loc}.tags.{i}", errors) for i, t in enumerate(value)]
        elif name == "rules":
            value = [[r[0], _normalize_format(r[1], None, f"{loc}.rules.{i}.1", errors)] for i, r in enumerate(value)]
        elif isinstance(value, list):
            value = list(value)
        out[name] = value
    if top and errors:
        count = len(errors)
        head = f"{count} validation error{'s' if count > 1 else ''} for StructuralTag"
        raise handler_error("\n".join([head, *errors]))
    return out
