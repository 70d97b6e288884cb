"""Record the validation tables of vLLM's union-typed request fields from vLLM 0.33's own pydantic
schemas (render_service/api/vllm_schemas.json).

    VLLM_TARGET_DEVICE=cpu $VLLM_ORACLE_PYTHON -m tests.api.record_vllm_schemas

Run with the python of a vLLM 0.33 environment (it imports vllm, openai and pydantic; the service
never does). Fields whose types are openai's large unions (chat `messages`, Responses `input`,
`tools`, `tool_choice`, `text`) are written as a JSON tree of pydantic's core schema, reduced to
what validation needs: member order, union labels, required fields, literals, bounds and the
named validators the service implements (api/generated.py reads the file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "render_service" / "api" / "vllm_schemas.json"

# validators the service implements itself, by name (api/generated.py)
KNOWN_FUNCTIONS = {"_default_input_image_details", "sequence_validator", "__log_extra_fields__"}


class Converter:
    def __init__(self, definitions: dict[str, Any]) -> None:
        self.definitions = definitions
        self.defs: dict[str, Any] = {}

    def node(self, schema: dict[str, Any]) -> Any:
        kind = schema["type"]
        if kind == "definitions":
            for item in schema["definitions"]:
                self.definitions[item["ref"]] = item
            return self.node(schema["schema"])
        if kind == "definition-ref":
            ref = schema["schema_ref"]
            name = ref.rsplit(":", 1)[0]  # drop the run-dependent id
            if name not in self.defs:
                self.defs[name] = None  # recursion guard
                self.defs[name] = self.node(self.definitions[ref])
            return {"k": "ref", "r": name}
        if "ref" in schema and kind in ("typed-dict", "model", "dataclass"):
            self.definitions.setdefault(schema["ref"], schema)
        if kind in ("str", "int", "float"):
            out = {"k": kind}
            for bound in ("min_length", "max_length", "ge", "gt", "le", "lt"):
                if schema.get(bound) is not None:
                    out[bound] = schema[bound]
            return out
        if kind in ("bool", "any", "none"):
            return {"k": kind}
        if kind == "literal":
            return {"k": "literal", "v": list(schema["expected"])}
        if kind == "enum":
            return {"k": "literal", "v": [m.value for m in schema["members"]]}
        if kind == "nullable":
            return {"k": "nullable", "s": self.node(schema["schema"])}
        if kind == "default":
            return self.node(schema["schema"])
        if kind in ("list", "set", "tuple"):
            out = {"k": "list", "s": self.node(schema.get("items_schema") or {"type": "any"})}
            for bound in ("min_length", "max_length"):
                if schema.get(bound) is not None:
                    out[bound] = schema[bound]
            return out
        if kind == "generator":
            return {"k": "iter", "s": self.node(schema.get("items_schema") or {"type": "any"})}
        if kind == "dict":
            keys, values = schema.get("keys_schema"), schema.get("values_schema")
            return {
                "k": "dict",
                "key": self.node(keys) if keys else None,
                "val": self.node(values) if values else None,
            }
        if kind == "union":
            choices = []
            for choice in schema["choices"]:
                if isinstance(choice, tuple):
                    choice, label = choice
                    choices.append({**self.node(choice), "label": label})
                else:
                    choices.append(self.node(choice))
            return {"k": "union", "c": choices}
        if kind == "json-or-python":
            return self.node(schema["python_schema"])
        if kind == "chain":
            steps = [self.node(step) for step in schema["steps"]]
            return {"k": "chain", "steps": steps}
        if kind == "is-instance":
            return {"k": "instance", "cls": schema["cls_repr"] if "cls_repr" in schema else schema["cls"].__name__}
        if kind in ("function-wrap", "function-before", "function-after"):
            name = _function_name(schema["function"])
            if name not in KNOWN_FUNCTIONS:
                raise ValueError(f"unknown validator {name} ({kind})")
            inner = self.node(schema["schema"])
            if name in ("__log_extra_fields__",):
                return {**inner, "wrapped": True} if isinstance(inner, dict) else inner
            return {"k": "fn", "mode": kind.removeprefix("function-"), "fn": name, "s": inner}
        if kind == "typed-dict":
            fields = [
                [_alias(name, field), self.node(field["schema"]), bool(field.get("required", True))]
                for name, field in schema["fields"].items()
            ]
            return {
                "k": "model",
                "kind": "typeddict",
                "name": schema["cls"].__name__,
                "f": fields,
                "extra": schema.get("extra_behavior") or "ignore",
            }
        if kind == "model":
            inner = schema["schema"]
            while inner["type"] != "model-fields":
                inner = inner["schema"]
            fields = [
                [_alias(name, field), self.node(field["schema"]), field["schema"]["type"] != "default"]
                for name, field in inner["fields"].items()
            ]
            config = schema.get("config") or {}
            return {
                "k": "model",
                "kind": "model",
                "name": schema["cls"].__name__,
                "f": fields,
                "extra": config.get("extra_fields_behavior") or "ignore",
            }
        raise ValueError(f"unsupported core schema kind {kind}")


def _alias(name: str, field: dict[str, Any]) -> str:
    """The key a field is read from (and named by in errors): its validation alias if it has one."""
    alias = field.get("validation_alias")
    if alias is None:
        return name
    if not isinstance(alias, str):
        raise ValueError(f"unsupported alias {alias!r} for {name}")
    return alias


def _function_name(function: dict[str, Any]) -> str:
    return getattr(function["function"], "__name__", repr(function["function"]))


def _field(model: Any, name: str) -> dict[str, Any]:
    schema = model.__pydantic_core_schema__
    definitions: dict[str, Any] = {}
    while schema["type"] != "model-fields":
        if schema["type"] == "definitions":
            for item in schema["definitions"]:
                definitions[item["ref"]] = item
        schema = schema["schema"]
    return schema["fields"][name]["schema"], definitions


def main() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    roots: dict[str, Any] = {}
    all_defs: dict[str, Any] = {}
    for label, model, name in (
        ("chat.messages", ChatCompletionRequest, "messages"),
        ("responses.input", ResponsesRequest, "input"),
        ("responses.tools", ResponsesRequest, "tools"),
        ("responses.tool_choice", ResponsesRequest, "tool_choice"),
        ("responses.text", ResponsesRequest, "text"),
    ):
        schema, definitions = _field(model, name)
        converter = Converter(definitions)
        roots[label] = converter.node(schema)
        all_defs.update(converter.defs)
    payload = {"vllm_version": "0.33.0", "roots": roots, "defs": dict(sorted(all_defs.items()))}
    OUT.write_text(json.dumps(payload, separators=(",", ":"), sort_keys=False) + "\n", encoding="utf-8")
    print(f"{OUT.name}: {len(roots)} fields, {len(all_defs)} shared definitions, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
