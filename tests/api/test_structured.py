"""render_service.api.structured against vLLM 0.33: every golden's `sampling_params.structured_outputs`
(or its absence), the structured-output error goldens, and cases recorded from the vLLM 0.33 oracle
(`vllm launch render` on the example model; configs below) for the branches the goldens miss."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from render_service.api import structured as S
from render_service.exceptions import BadRequestError, RenderServiceError, RequestValidationError
from tests.parity.corpus import CHAT, CMPL, CONFIGS, GOLDEN_DIR

CHAT_GOLDENS_OF_INTEREST = (
    "chat_parallel_tool_calls_false",
    "chat_tool_choice_named",
    "chat_tool_choice_required",
    "chat_tool_strict",
    "chat_response_format_json_object",
    "chat_response_format_json_schema",
    "chat_structured_outputs_choice",
    "cmpl_response_format_json_object",
    "plain_response_format_json_schema",
)

# Server configs of the oracle cases: the corpus's, plus two only recorded here.
EXTRA_CONFIGS: dict[str, dict[str, Any]] = {
    # VLLM_ENFORCE_STRICT_TOOL_CALLING=0 vllm launch render ... (same flags as `parsers`)
    "noenf": {
        "tool_parser": "hermes",
        "enable_auto_tool_choice": True,
        "reasoning_parser": "qwen3",
        "enforce_strict_tool_calling": False,
    },
    # `parsers` + --tool-strict-level parameter
    "param": {
        "tool_parser": "hermes",
        "enable_auto_tool_choice": True,
        "reasoning_parser": "qwen3",
        "tool_strict_level": "parameter",
    },
}


def config_kwargs(name: str) -> dict[str, Any]:
    if name in EXTRA_CONFIGS:
        return dict(EXTRA_CONFIGS[name])
    config = CONFIGS[name]
    return {
        "tool_parser": config.tool_call_parser,
        "enable_auto_tool_choice": config.enable_auto_tool_choice,
        "reasoning_parser": config.reasoning_parser,
    }


def run(body: dict[str, Any], config: str, chat: bool) -> S.StructuredOutputsResult:
    """What render does: vLLM's validators (check_tool_usage's "auto" default first), then the wire value."""
    body = copy.deepcopy(body)
    if chat and "tool_choice" not in body and body.get("tools"):
        body["tool_choice"] = "auto"
    S.validate_structured(body, chat=chat)
    return S.resolve_structured_outputs(body, chat=chat, **config_kwargs(config))


def full_so(values: dict[str, Any]) -> dict[str, Any]:
    out = {
        "json": None,
        "regex": None,
        "choice": None,
        "grammar": None,
        "json_object": None,
        "disable_any_whitespace": False,
        "disable_additional_properties": False,
        "whitespace_pattern": None,
        "structural_tag": None,
        "_backend": None,
        "_backend_was_auto": False,
    }
    out.update(values)
    return out


# -- goldens ------------------------------------------------------------------------------------


def _render_goldens() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        request = record["request"]
        if request.get("path") not in (CHAT, CMPL) or "json" not in request or record.get("status") != 200:
            continue
        out.append((path.stem, record))
    return out


RENDER_GOLDENS = _render_goldens()


def test_goldens_of_interest_present() -> None:
    names = {name for name, _ in RENDER_GOLDENS}
    assert set(CHAT_GOLDENS_OF_INTEREST) <= names


@pytest.mark.parametrize(("name", "record"), RENDER_GOLDENS, ids=[name for name, _ in RENDER_GOLDENS])
def test_golden_structured_outputs(name: str, record: dict[str, Any]) -> None:
    chat = record["request"]["path"] == CHAT
    responses = record["response"] if isinstance(record["response"], list) else [record["response"]]
    result = run(record["request"]["json"], record["config"], chat)
    for response in responses:
        sampling = response["sampling_params"]
        if "structured_outputs" in sampling:
            assert result.structured_outputs is not None, name
            assert list(result.structured_outputs) == list(sampling["structured_outputs"])
            assert result.structured_outputs == sampling["structured_outputs"]
            # byte-exact, the structural tag string included
            assert json.dumps(result.structured_outputs) == json.dumps(sampling["structured_outputs"])
        else:
            assert result.structured_outputs is None, name


def test_golden_tool_tags_clear_response_format() -> None:
    by_name = dict(RENDER_GOLDENS)
    for name in (
        "chat_parallel_tool_calls_false",
        "chat_tool_choice_named",
        "chat_tool_choice_required",
        "chat_tool_strict",
    ):
        assert run(by_name[name]["request"]["json"], "parsers", True).response_format_cleared, name
    for name in ("chat_response_format_json_object", "chat_tool_choice_auto", "chat_structured_outputs_choice"):
        assert not run(by_name[name]["request"]["json"], "parsers", True).response_format_cleared, name


def test_golden_json_schema_missing() -> None:
    record = json.loads((GOLDEN_DIR / "err_chat_json_schema_missing.json").read_text(encoding="utf-8"))
    with pytest.raises(BadRequestError) as info:
        run(record["request"]["json"], record["config"], True)
    assert info.value.body() == record["response"]
    assert info.value.status_code == record["status"]


# -- oracle-recorded cases ------------------------------------------------------------------------
# (name, config, "chat"|"cmpl", body without model/messages/prompt, expected): expected is the
# non-default fields of structured_outputs (None: omitted), or (status, error type, param, message);
# for "Bad Request" schema errors only the "N validation error(s)" prefix is kept.

ORACLE_CASES: list[tuple[str, str, str, dict[str, Any], Any]] = [
    (
        "so_regex_options",
        "parsers",
        "chat",
        {
            "structured_outputs": {
                "regex": "a+",
                "whitespace_pattern": " ",
                "disable_additional_properties": True,
                "_backend": "x",
            }
        },
        {"regex": "a+", "disable_additional_properties": True, "whitespace_pattern": " "},
    ),
    (
        "so_json_string",
        "parsers",
        "chat",
        {"structured_outputs": {"json": '{"type":"object"}'}},
        {"json": '{"type":"object"}'},
    ),
    ("so_json_object_false", "plain", "chat", {"structured_outputs": {"json_object": False}}, {"json_object": False}),
    ("so_json_object_lax_bool", "plain", "chat", {"structured_outputs": {"json_object": "yes"}}, {"json_object": True}),
    (
        "rf_text_keeps_so",
        "parsers",
        "chat",
        {"response_format": {"type": "text"}, "structured_outputs": {"regex": "a+"}},
        {"regex": "a+"},
    ),
    (
        "rf_json_schema_overrides_so",
        "parsers",
        "chat",
        {
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
            "structured_outputs": {"json": {"type": "string"}, "disable_any_whitespace": True},
        },
        {"json": {"type": "object"}, "disable_any_whitespace": True},
    ),
    (
        "rf_json_schema_strict_lax",
        "plain",
        "chat",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": "yes"},
            }
        },
        {"json": {"type": "object"}},
    ),
    (
        "rf_structural_tag_extras",
        "parsers",
        "chat",
        {
            "response_format": {
                "type": "structural_tag",
                "format": {"type": "const_string", "value": "hi", "junk": 2},
                "zz": 1,
            }
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "const_string", "value": "hi", "junk": 2}, "zz": 1}'
        },
    ),
    (
        "rf_structural_tag_legacy",
        "plain",
        "chat",
        {
            "response_format": {
                "type": "structural_tag",
                "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>", "q": 1}],
                "triggers": ["<a>"],
            }
        },
        {
            "structural_tag": '{"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>", "q": 1}], "triggers": ["<a>"]}'
        },
    ),
    (
        "so_structural_tag",
        "plain",
        "chat",
        {
            "structured_outputs": {
                "structural_tag": '{"type":"structural_tag","format":{"type":"const_string","value":"hi"}}'
            }
        },
        {"structural_tag": '{"type":"structural_tag","format":{"type":"const_string","value":"hi"}}'},
    ),
    (
        "err_rf_json_object_and_so_regex",
        "parsers",
        "chat",
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}},
        (
            400,
            "BadRequestError",
            None,
            "You can only use one kind of structured outputs constraint but multiple are specified: {'json': None, 'regex': 'a+', 'choice': None, 'grammar': None, 'json_object': True, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None, '_backend': None, '_backend_was_auto': False}",
        ),
    ),
    (
        "err_rf_json_schema_key_not_alias",
        "parsers",
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "json_schema": {"type": "object"}}}},
        (
            400,
            "BadRequestError",
            None,
            "You must use one kind of structured outputs constraint but none are specified: {'json': None, 'regex': None, 'choice': None, 'grammar': None, 'json_object': None, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None, '_backend': None, '_backend_was_auto': False}",
        ),
    ),
    (
        "err_so_empty",
        "parsers",
        "chat",
        {"structured_outputs": {}},
        (
            400,
            "BadRequestError",
            None,
            "You must use one kind of structured outputs constraint but none are specified: {'json': None, 'regex': None, 'choice': None, 'grammar': None, 'json_object': None, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None, '_backend': None, '_backend_was_auto': False}",
        ),
    ),
    (
        "err_so_two_constraints",
        "parsers",
        "chat",
        {"structured_outputs": {"grammar": 'root ::= "a"', "json_object": True}},
        (
            400,
            "BadRequestError",
            None,
            "You can only use one kind of structured outputs constraint but multiple are specified: {'json': None, 'regex': None, 'choice': None, 'grammar': 'root ::= \"a\"', 'json_object': True, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None, '_backend': None, '_backend_was_auto': False}",
        ),
    ),
    (
        "err_so_count_chat",
        "parsers",
        "chat",
        {"structured_outputs": {"json": {"type": "object"}, "regex": "a"}},
        (
            400,
            "BadRequestError",
            None,
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
        ),
    ),
    (
        "err_so_count_cmpl",
        "parsers",
        "cmpl",
        {"structured_outputs": {"json": {"type": "object"}, "regex": "a"}},
        (
            400,
            "BadRequestError",
            "structured_outputs",
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice'). (parameter=structured_outputs)",
        ),
    ),
    (
        "err_so_with_named_tool",
        "parsers",
        "chat",
        {
            "structured_outputs": {"json": {"type": "object"}},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        (
            400,
            "BadRequestError",
            None,
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
    ),
    (
        "err_so_with_null_tool_choice",
        "parsers",
        "chat",
        {
            "structured_outputs": {"regex": "a"},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": None,
        },
        (
            400,
            "BadRequestError",
            None,
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
    ),
    (
        "err_rf_structural_tag_invalid",
        "parsers",
        "chat",
        {
            "response_format": {
                "type": "structural_tag",
                "format": {
                    "type": "triggered_tags",
                    "triggers": ["<b>"],
                    "tags": [{"begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"}],
                },
            }
        },
        (
            400,
            "BadRequestError",
            "response_format",
            "Invalid response_format structural_tag specification. (parameter=response_format)",
        ),
    ),
    (
        "err_rf_structural_tag_legacy_no_schema",
        "parsers",
        "chat",
        {
            "response_format": {
                "type": "structural_tag",
                "structures": [{"begin": "<a>", "end": "</a>"}],
                "triggers": ["<a>"],
            }
        },
        (
            400,
            "BadRequestError",
            "response_format",
            "Invalid response_format structural_tag specification. (parameter=response_format)",
        ),
    ),
    (
        "err_so_structural_tag_invalid",
        "parsers",
        "chat",
        {"structured_outputs": {"structural_tag": "not json"}},
        (
            400,
            "BadRequestError",
            "structured_outputs",
            "Invalid structured_outputs structural_tag specification. (parameter=structured_outputs)",
        ),
    ),
    (
        "err_cmpl_json_schema_missing",
        "parsers",
        "cmpl",
        {"response_format": {"type": "json_schema"}},
        (
            400,
            "BadRequestError",
            "response_format",
            "When response_format type is 'json_schema', the 'json_schema' field must be provided. (parameter=response_format)",
        ),
    ),
    (
        "err_rf_bad_type",
        "parsers",
        "chat",
        {"response_format": {"type": "foo"}},
        (400, "Bad Request", "body.response_format.type", "6 validation errors"),
    ),
    (
        "err_rf_not_object",
        "parsers",
        "chat",
        {"response_format": "json_object"},
        (400, "Bad Request", "body.response_format", "3 validation errors"),
    ),
    (
        "err_rf_json_schema_no_name",
        "parsers",
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        (400, "Bad Request", "body.response_format.json_schema.name", "6 validation errors"),
    ),
    (
        "err_so_json_int",
        "parsers",
        "chat",
        {"structured_outputs": {"json": 5}},
        (400, "Bad Request", "body.structured_outputs.json", "2 validation errors"),
    ),
    (
        "err_so_choice_str",
        "parsers",
        "chat",
        {"structured_outputs": {"choice": "a"}},
        (400, "Bad Request", "body.structured_outputs.choice", "1 validation error"),
    ),
    (
        "err_so_not_object",
        "parsers",
        "chat",
        {"structured_outputs": "x"},
        # vLLM answers 500 (its validator calls .get on it); ours is the field's schema error
        (400, "Bad Request", "body.structured_outputs", "1 validation error"),
    ),
    (
        "tools_required_single_call",
        "parsers",
        "chat",
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "string", "default": None}}},
                    },
                }
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": true}}'
        },
    ),
    (
        "tools_strict_non_ascii",
        "parsers",
        "chat",
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "fé",
                        "description": "dé",
                        "strict": True,
                        "parameters": {
                            "type": "object",
                            "properties": {"é": {"description": "中", "default": None, "x": 1.0}},
                        },
                    },
                }
            ]
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\u00e9\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object", "properties": {"\\u00e9": {"description": "\\u4e2d", "default": null, "x": 1.0}}}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\u00e9\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object", "properties": {"\\u00e9": {"description": "\\u4e2d", "default": null, "x": 1.0}}}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "at_least_one": false, "stop_after_first": false, "excludes": []}}'
        },
    ),
    (
        "tools_strict_mixed",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True}},
                {"type": "function", "function": {"name": "g", "strict": False, "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "h", "strict": "true", "parameters": {}}},
            ],
            "tool_choice": "auto",
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}, {"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"g\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"g\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}, {"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"h\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"h\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "at_least_one": false, "stop_after_first": false, "excludes": []}}'
        },
    ),
    (
        "tools_auto_rf_json_schema",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"z": {"type": "integer"}}}},
            },
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "json_schema", "json_schema": {"type": "object", "properties": {"z": {"type": "integer"}}}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}]}}'
        },
    ),
    (
        "tools_auto_so_regex",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"regex": "a+"},
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "regex", "pattern": "a+"}]}}'
        },
    ),
    (
        "tools_auto_so_choice",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"choice": ["x", "y"]},
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "or", "elements": [{"type": "const_string", "value": "x"}, {"type": "const_string", "value": "y"}]}]}}'
        },
    ),
    (
        "tools_auto_so_grammar",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"grammar": 'root ::= "a"'},
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "grammar", "grammar": "root ::= \\"a\\""}]}}'
        },
    ),
    (
        "tools_auto_so_json_object",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"json_object": True, "disable_any_whitespace": True},
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}]}}'
        },
    ),
    (
        "tools_auto_so_structural_tag",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {
                "structural_tag": '{"type":"structural_tag","format":{"type":"sequence","elements":[{"type":"any_text","max_chars":3},{"type":"tag","begin":"a","content":{"type":"star","content":{"type":"regex","pattern":"b+","junk":1}},"end":["c","d"]}]}}'
            },
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "sequence", "elements": [{"type": "any_text", "excludes": [], "max_tokens": null, "max_chars": 3}, {"type": "tag", "begin": "a", "content": {"type": "star", "content": {"type": "regex", "pattern": "b+"}}, "end": ["c", "d"]}]}]}}'
        },
    ),
    (
        "tools_auto_rf_legacy_structural_tag",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "response_format": {
                "type": "structural_tag",
                "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}],
                "triggers": ["<a>"],
            },
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "triggered_tags", "triggers": ["<a>"], "tags": [{"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "</a>"}], "at_least_one": false, "stop_after_first": false, "excludes": []}]}}'
        },
    ),
    (
        "tools_auto_so_unsupported_json",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"json": {"type": "integer", "multipleOf": 2}},
        },
        {"json": {"type": "integer", "multipleOf": 2}},
    ),
    (
        "tools_auto_so_unsupported_regex",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"regex": "(?=a)b"},
        },
        {"regex": "(?=a)b"},
    ),
    (
        "tools_auto_so_json_object_false",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {"json_object": False},
        },
        {"json_object": False},
    ),
    (
        "tools_auto_single_call_rf",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}},
            ],
            "response_format": {"type": "json_object"},
            "parallel_tool_calls": False,
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}, {"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"g\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"g\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": true}, {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}]}}'
        },
    ),
    (
        "tools_auto_single_call_rf_not_strict",
        "parsers",
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "response_format": {"type": "json_object"},
            "parallel_tool_calls": False,
        },
        {"json_object": True},
    ),
    (
        "tools_named_single_call",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}},
            ],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
            "parallel_tool_calls": False,
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"g\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"g\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": true}}'
        },
    ),
    (
        "tools_required_rf_dropped",
        "parsers",
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "response_format": {"type": "json_object"},
            "tool_choice": "required",
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": true, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}}'
        },
    ),
    (
        "tools_none_rf_kept",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "response_format": {"type": "json_object"},
            "tool_choice": "none",
        },
        {"json_object": True},
    ),
    (
        "tools_null_choice",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "tool_choice": None,
        },
        None,
    ),
    (
        "err_tools_named_duplicate",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
            ],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        (400, "BadRequestError", None, "Forced tool choice must resolve to exactly one tool."),
    ),
    (
        "noauto_tools_none_rf",
        "plain",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "response_format": {"type": "json_object"},
            "tool_choice": "none",
        },
        {"json_object": True},
    ),
    (
        "cmpl_structural_tag",
        "plain",
        "cmpl",
        {"response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}},
        {"structural_tag": '{"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}'},
    ),
    (
        "noenf_required_defs",
        "noenf",
        "chat",
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "$defs": {"A": {"type": "string"}},
                            "type": "object",
                            "properties": {"a": {"$ref": "#/$defs/A"}},
                        },
                    },
                },
                {"type": "function", "function": {"name": "g"}},
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {
            "json": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "anyOf": [
                        {
                            "properties": {
                                "name": {"type": "string", "enum": ["f"]},
                                "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}},
                            },
                            "required": ["name", "parameters"],
                        },
                        {
                            "properties": {
                                "name": {"type": "string", "enum": ["g"]},
                                "parameters": {"type": "object", "properties": {}},
                            },
                            "required": ["name", "parameters"],
                        },
                    ],
                },
                "maxItems": 1,
                "$defs": {"A": {"type": "string"}},
            }
        },
    ),
    (
        "noenf_named_empty_params",
        "noenf",
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {"type": "json_object"},
        },
        {"json": {"type": "object", "properties": {}}},
    ),
    (
        "noenf_required_own_structural_tag",
        "noenf",
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "required",
            "structured_outputs": {
                "structural_tag": '{"type":"structural_tag","format":{"type":"const_string","value":"x"}}'
            },
        },
        {"structural_tag": '{"type":"structural_tag","format":{"type":"const_string","value":"x"}}'},
    ),
    (
        "noenf_auto_strict",
        "noenf",
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}]},
        None,
    ),
    (
        "param_auto",
        "param",
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "at_least_one": false, "stop_after_first": false, "excludes": []}}'
        },
    ),
    (
        "param_auto_rf_json_object",
        "param",
        "chat",
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "response_format": {"type": "json_object"},
        },
        {
            "structural_tag": '{"type": "structural_tag", "format": {"type": "or", "elements": [{"type": "tags_with_separator", "tags": [{"type": "tag", "begin": "<tool_call>\\n{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}\\n</tool_call>"}, {"type": "tag", "begin": "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": ", "content": {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}, "end": "}</tool_call>"}], "separator": "", "at_least_one": true, "stop_after_first": false}, {"type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": false, "max_whitespace_cnt": null, "excludes": []}]}}'
        },
    ),
    (
        "err_rf_and_so_schema_errors_combined",
        "parsers",
        "chat",
        {"response_format": {}, "structured_outputs": {"grammar": 5, "regex": "a"}},
        (400, "Bad Request", "body.response_format.type", "7 validation errors"),
    ),
    (
        "err_so_post_init_beats_rf_schema_errors",
        "parsers",
        "chat",
        {"response_format": 5, "structured_outputs": {"regex": None, "json": None}},
        (
            400,
            "BadRequestError",
            None,
            "You must use one kind of structured outputs constraint but none are specified: {'json': None, 'regex': None, 'choice': None, 'grammar': None, 'json_object': None, 'disable_any_whitespace': False, 'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None, '_backend': None, '_backend_was_auto': False}",
        ),
    ),
    (
        "err_tools_auto_so_structural_tag_missing_type",
        "parsers",
        "chat",
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}
            ],
            "structured_outputs": {
                "structural_tag": '{"type": "structural_tag", "format": {"type": '
                '"sequence", "elements": [{"type": "const_string", '
                '"value": "a"}, {"value": "b"}]}}'
            },
        },
        (
            400,
            "BadRequestError",
            None,
            "1 validation error for StructuralTag\nformat.sequence.elements.1\n  Unable to extract tag using discriminator 'type' [type=union_tag_not_found, input_value={'value': 'b'}, input_type=dict]\n    For further information visit https://errors.pydantic.dev/2.14/v/union_tag_not_found",
        ),
    ),
    (
        "err_so_structural_tag_unlimited_content",
        "parsers",
        "chat",
        {
            "structured_outputs": {
                "structural_tag": '{"type": "structural_tag", "format": {"type": "tag", '
                '"begin": "", "content": {"type": "optional", "content": '
                '{"type": "any_text"}}, "end": ""}}'
            }
        },
        (
            400,
            "BadRequestError",
            "structured_outputs",
            "Invalid structured_outputs structural_tag specification. (parameter=structured_outputs)",
        ),
    ),
    (
        "so_structural_tag_inferred_type",
        "plain",
        "chat",
        {"structured_outputs": {"structural_tag": '{"format": {"value": "a"}}'}},
        {"structural_tag": '{"format": {"value": "a"}}'},
    ),
]


def _case_body(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "tinyqwen3"}
    base.update({"messages": [{"role": "user", "content": "Hi"}]} if kind == "chat" else {"prompt": "Hi"})
    base.update(copy.deepcopy(body))
    return base


@pytest.mark.parametrize(
    ("name", "config", "kind", "body", "expected"), ORACLE_CASES, ids=[case[0] for case in ORACLE_CASES]
)
def test_oracle_case(name: str, config: str, kind: str, body: dict[str, Any], expected: Any) -> None:
    request = _case_body(kind, body)
    if isinstance(expected, tuple):
        status, error_type, param, message = expected
        with pytest.raises(RenderServiceError) as info:
            run(request, config, kind == "chat")
        error = info.value.body()["error"]
        assert (info.value.status_code, error["type"], error["param"]) == (status, error_type, param)
        if error_type == "Bad Request":
            assert error["message"].split(":", 1)[0] == message
        else:
            assert error["message"] == message
        return
    result = run(request, config, kind == "chat")
    if expected is None:
        assert result.structured_outputs is None
        return
    assert result.structured_outputs == full_so(expected)
    assert list(result.structured_outputs) == list(full_so({}))
    assert json.dumps(result.structured_outputs) == json.dumps(full_so(expected))


# -- behaviour details ----------------------------------------------------------------------------

STRICT_TOOL = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}


def test_body_not_modified() -> None:
    body = _case_body(
        "chat", {"tools": [STRICT_TOOL], "response_format": {"type": "json_object"}, "parallel_tool_calls": False}
    )
    before = copy.deepcopy(body)
    S.structured_outputs_wire(body, chat=True, **config_kwargs("parsers"))
    assert body == before


def test_tool_defs_popped_flag() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$defs": {"A": {}}, "type": "object"}}}
    required = run(_case_body("chat", {"tools": [tool], "tool_choice": "required"}), "noenf", True)
    assert required.response_format_cleared and required.tool_defs_popped
    named = run(
        _case_body("chat", {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        "noenf",
        True,
    )
    assert named.response_format_cleared and not named.tool_defs_popped
    assert not run(_case_body("chat", {"tools": [tool], "tool_choice": "required"}), "parsers", True).tool_defs_popped


def test_completions_never_get_tool_tags() -> None:
    body = _case_body("cmpl", {"response_format": {"type": "json_object"}})
    so = S.structured_outputs_wire(body, chat=False, **config_kwargs("parsers"))
    assert so == full_so({"json_object": True})


def test_no_tool_parser_without_auto_tool_choice() -> None:
    body = _case_body("chat", {"tools": [STRICT_TOOL], "tool_choice": "none"})
    assert S.structured_outputs_wire(body, chat=True, **config_kwargs("noauto")) is None


def test_unknown_tool_parser_rejected() -> None:
    with pytest.raises(ValueError):
        S.structured_outputs_wire(
            _case_body("chat", {"tools": [STRICT_TOOL]}),
            chat=True,
            tool_parser="muse_glimmer",
            enable_auto_tool_choice=True,
            reasoning_parser=None,
        )


def test_lark_grammar_with_strict_auto_tools_keeps_grammar() -> None:
    # Documented divergence: vLLM converts the Lark grammar to EBNF (xgrammar) and ORs it with the tool tag.
    body = _case_body("chat", {"tools": [STRICT_TOOL], "structured_outputs": {"grammar": 'start: "a"'}})
    result = run(body, "parsers", True)
    assert result.structured_outputs == full_so({"grammar": 'start: "a"'})
    assert not result.response_format_cleared


def _deep_format(levels: int) -> dict[str, Any]:
    fmt: dict[str, Any] = {"type": "const_string", "value": "x"}
    for _ in range(levels):
        fmt = {"type": "optional", "content": fmt}
    return fmt


@pytest.mark.parametrize("field", ["structured_outputs", "response_format"])
def test_structural_tag_nesting_limit(field: str) -> None:
    tag = {"type": "structural_tag", "format": _deep_format(90)}
    extra = (
        {"structured_outputs": {"structural_tag": json.dumps(tag)}}
        if field == "structured_outputs"
        else {"response_format": tag}
    )
    with pytest.raises(BadRequestError) as info:
        run(_case_body("chat", extra), "parsers", True)
    assert info.value.body()["error"] == {
        "message": "The JSON schema is nested too deeply: objects and arrays may nest at most 64 levels",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    shallow = {"type": "structural_tag", "format": _deep_format(10)}
    run(
        _case_body(
            "chat", {field: {"structural_tag": json.dumps(shallow)} if field == "structured_outputs" else shallow}
        ),
        "parsers",
        True,
    )


def test_deep_json_schema_passes_render_but_skips_tool_tag() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(70):
        schema = {"type": "object", "properties": {"a": schema}}
    body = _case_body(
        "chat",
        {
            "tools": [STRICT_TOOL],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        },
    )
    assert run(body, "parsers", True).structured_outputs == full_so({"json": schema})


def test_make_structured_outputs_post_init() -> None:
    assert S.make_structured_outputs(regex="a") == full_so({"regex": "a"})
    with pytest.raises(BadRequestError, match="none are specified"):
        S.make_structured_outputs()
    with pytest.raises(BadRequestError, match="multiple are specified"):
        S.make_structured_outputs(regex="a", choice=["b"])


def test_schema_errors_are_request_validation_errors() -> None:
    with pytest.raises(RequestValidationError) as info:
        S.validate_structured(
            _case_body("chat", {"structured_outputs": {"disable_any_whitespace": None, "regex": "a"}}), chat=True
        )
    assert info.value.param == "body.structured_outputs.disable_any_whitespace"
    assert info.value.message.startswith("1 validation error")
