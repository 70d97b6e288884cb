"""Validation tables for vLLM's union-typed fields, built from its own pydantic schemas.

Chat `messages` and the Responses `input`, `tools`, `tool_choice` and `text` are openai's large
unions (the Responses input item alone has ~50 members, nested several levels deep); pydantic
lists every member's errors. Rather than hand-type them, `tests/api/record_vllm_schemas.py`
writes vLLM 0.33's core schema for these fields to `vllm_schemas.json` (member order, union
labels, required fields, literals, bounds) and this module turns it into `schema.py` types. The
few validators inside those schemas are implemented here by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from render_service.api.schema import (
    INVALID,
    REQUIRED,
    AnyValue,
    Bool,
    DictOf,
    ErrorList,
    Field,
    FieldType,
    Float,
    Int,
    ListOf,
    Literal,
    Loc,
    Model,
    Nullable,
    Str,
    Union,
    error,
    side_effect_free,
)

SCHEMAS = Path(__file__).resolve().parent / "vllm_schemas.json"


class Ref(FieldType):
    """A shared definition, resolved on first use (definitions may refer to themselves)."""

    def __init__(self, name: str, defs: dict[str, FieldType]) -> None:
        self.name = name
        self.defs = defs

    @property
    def target(self) -> FieldType:
        return self.defs[self.name]

    @property
    def tag(self) -> str | None:  # type: ignore[override]
        return self.target.tag

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        return self.target.check(value, loc, errors, strict)

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free([self.target], seen)

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object"}


class LazyIterable(FieldType):
    """`Iterable[X]`: pydantic checks only that the value is iterable; the items are validated
    when the request is read (vLLM's parsing), not here. The value is kept as sent."""

    def __init__(self, item: FieldType) -> None:
        self.item = item

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if isinstance(value, (list, str, dict)):
            return value
        errors.append(error("iterable_type", loc, "Input should be iterable", value))
        return INVALID

    def side_effect_free(self, seen: set[int]) -> bool:
        return True  # checks the value's type only

    def json_schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.item.json_schema()}


class NoneValue(FieldType):
    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if value is None:
            return None
        errors.append(error("none_required", loc, "Input should be None", value))
        return INVALID

    def side_effect_free(self, seen: set[int]) -> bool:
        return True  # checks the value's type only

    def json_schema(self) -> dict[str, Any]:
        return {"type": "null"}


class SequenceOf(FieldType):
    """`Sequence[X]` (openai's): an instance of Sequence (a str is one, and then refused), then
    validated as a list."""

    def __init__(self, items: FieldType) -> None:
        self.items = items

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if not isinstance(value, (list, str)):
            errors.append(
                error("is_instance_of", loc, "Input should be an instance of Sequence", value, {"class": "Sequence"})
            )
            return INVALID
        if isinstance(value, str):
            errors.append(error("sequence_str", loc, "'str' instances are not allowed as a Sequence value", value))
            return INVALID
        return self.items.check(value, loc, errors, strict)

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free([self.items], seen)

    def json_schema(self) -> dict[str, Any]:
        return self.items.json_schema()


class InstanceOf(FieldType):
    """`isinstance(value, cls)` for a Python class (e.g. a PIL Image): no JSON value is one."""

    def __init__(self, cls: str) -> None:
        self.cls = cls

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        errors.append(
            error("is_instance_of", loc, f"Input should be an instance of {self.cls}", value, {"class": self.cls})
        )
        return INVALID

    def side_effect_free(self, seen: set[int]) -> bool:
        return True  # checks the value's type only

    def json_schema(self) -> dict[str, Any]:
        return {"not": {}}


class Before(FieldType):
    """A before validator (named, implemented below) ahead of the inner type."""

    def __init__(self, func: Callable[[Any], Any], inner: FieldType) -> None:
        self.func = func
        self.inner = inner

    @property
    def tag(self) -> str | None:  # type: ignore[override]
        return None  # pydantic labels it `function-before[...]`, which vLLM's error cleaner drops

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        return self.inner.check(self.func(value), loc, errors, strict)

    def json_schema(self) -> dict[str, Any]:
        return self.inner.json_schema()


def default_input_image_details(value: Any) -> Any:
    """vLLM's `_default_input_image_details`: an `input_image` part without `detail` gets "auto"."""
    if not isinstance(value, dict) or not isinstance(value.get("content"), list):
        return value
    parts = value["content"]
    fixed = [
        {**part, "detail": "auto"}
        if isinstance(part, dict) and part.get("type") == "input_image" and "detail" not in part
        else part
        for part in parts
    ]
    return value if fixed == parts else {**value, "content": fixed}


_FUNCTIONS: dict[str, Callable[[Any], Any]] = {"_default_input_image_details": default_input_image_details}


class _Builder:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.raw_defs = defs
        self.defs: dict[str, FieldType] = {}

    def build(self, node: dict[str, Any]) -> FieldType:
        kind = node["k"]
        if kind == "str":
            return Str(max_length=node.get("max_length"), min_length=node.get("min_length"))
        if kind == "int":
            return Int(ge=node.get("ge"), le=node.get("le"), gt=node.get("gt"), lt=node.get("lt"))
        if kind == "float":
            return Float(ge=node.get("ge"), le=node.get("le"), gt=node.get("gt"), lt=node.get("lt"))
        if kind == "bool":
            return Bool()
        if kind == "any":
            return AnyValue()
        if kind == "none":
            return NoneValue()
        if kind == "literal":
            return Literal(*node["v"])
        if kind == "nullable":
            return Nullable(self.build(node["s"]))
        if kind == "list":
            return ListOf(self.build(node["s"]), max_length=node.get("max_length"), min_length=node.get("min_length"))
        if kind == "iter":
            return LazyIterable(self.build(node["s"]))
        if kind == "dict":
            return DictOf(self.build(node["val"]) if node["val"] else None)
        if kind == "union":
            return Union(*(self.build(choice) for choice in node["c"]))
        if kind == "chain":  # [is-instance Sequence, sequence_validator(list)]
            return SequenceOf(self.build(node["steps"][1]["s"]))
        if kind == "instance":
            return InstanceOf(node["cls"])
        if kind == "fn" and node["mode"] == "before":
            return Before(_FUNCTIONS[node["fn"]], self.build(node["s"]))
        if kind == "model":
            fields = [
                Field(name, self.build(spec), REQUIRED if required else None) for name, spec, required in node["f"]
            ]
            return Model(node["name"], fields, kind=node["kind"], labelled=not node.get("wrapped", False))
        if kind == "ref":
            name = node["r"]
            if name not in self.defs:
                self.defs[name] = AnyValue()  # a placeholder while the definition builds (recursion)
                self.defs[name] = self.build(self.raw_defs[name])
            return Ref(name, self.defs)
        raise ValueError(f"unknown schema node {kind!r}")


@cache
def _payload() -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(SCHEMAS.read_text(encoding="utf-8"))
    return payload


@cache
def field_type(root: str) -> FieldType:
    """The validation type of one recorded field ("chat.messages", "responses.input", ...)."""
    payload = _payload()
    return _Builder(payload["defs"]).build(payload["roots"][root])


@cache
def model_named(root: str, name: str) -> Model:
    """The table of the model `name` somewhere inside the recorded field `root` (cached: Responses
    input items look theirs up per item, and the walk covers the whole schema)."""
    seen: set[int] = set()
    stack: list[Any] = [field_type(root)]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Ref):
            node = node.target
        if isinstance(node, Model):
            if node.name == name:
                return node
            stack.extend(spec.type for spec in node.fields)
        elif isinstance(node, Union):
            stack.extend(node.members)
        elif isinstance(node, (Nullable, Before)):
            stack.append(node.inner)
        elif isinstance(node, (ListOf, LazyIterable)):
            stack.append(node.item)
        elif isinstance(node, SequenceOf):
            stack.append(node.items)
    raise KeyError(name)
