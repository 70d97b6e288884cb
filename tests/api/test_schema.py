"""The engine's field types against pydantic itself (a test dependency), value by value.

Each engine type is paired with the annotation vLLM declares; both validate the same values
(numbers, numeric and boolean strings, containers, edge spellings, random mixes) and must agree
on the result: the coerced value, or the errors pydantic lists (type, loc, msg, ctx), in order.
"""

from __future__ import annotations

import random
import re
from typing import Annotated, Any
from typing import Literal as L

import pytest
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from render_service.api import schema as s

SAMPLES: list[Any] = [
    None, True, False, 0, 1, 2, -1, 7, 2**63 - 1, 2**63, -(2**63), 10**30, 0.0, 1.0, 1.5, -2.5, 1e300, 9.3e18,
    "", " ", "0", "1", "2", "-3", "+4", " 5 ", "6.0", "6.5", "1e3", "1_000", "1__0", "_1", "1_", "0x10", ".5", "5.",
    "inf", "-inf", "nan", "Infinity", "true", "True", "TRUE", "yes", "Y", "on", "off", "no", "f", "maybe", "abc",
    "tensors", "none", "left", [], [1], ["1"], [1.0], [None], [[1]], ["a", "b"], {}, {"a": 1}, {"a": "x"}, {"type": "x"},
]  # fmt: skip


def _random_values(count: int) -> list[Any]:
    rng = random.Random(7)
    alphabet = "0123456789 ._-+eEinfatruyso"
    values: list[Any] = []
    for _ in range(count):
        values.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))))
        values.append(rng.choice([rng.randint(-10, 10), rng.uniform(-3, 3), float(rng.randint(-5, 5))]))
    return values


VALUES = SAMPLES + _random_values(300)


class _Fn(BaseModel):
    name: str
    strict: bool | None = None


PAIRS: list[tuple[str, s.FieldType, Any]] = [
    ("int", s.Int(), int),
    ("int_bounds", s.Int(ge=-1, le=100), Annotated[int, Field(ge=-1, le=100)]),
    ("int_gt", s.Int(gt=0), Annotated[int, Field(gt=0)]),
    ("float", s.Float(), float),
    ("float_bounds", s.Float(ge=-2.0, le=2.0), Annotated[float, Field(ge=-2.0, le=2.0)]),
    ("bool", s.Bool(), bool),
    ("str", s.Str(), str),
    ("str_len", s.Str(min_length=1, max_length=3), Annotated[str, Field(min_length=1, max_length=3)]),
    ("literal", s.Literal("tensors", "none"), L["tensors", "none"]),
    ("opt_int", s.Nullable(s.Int()), int | None),
    ("list_int", s.ListOf(s.Int(ge=0)), list[Annotated[int, Field(ge=0)]]),
    ("list_max", s.ListOf(s.Str(), max_length=1), Annotated[list[str], Field(max_length=1)]),
    ("dict_float", s.DictOf(s.Float()), dict[str, float]),
    ("stop", s.Nullable(s.Union(s.Str(), s.ListOf(s.Str(), max_length=2))), str | Annotated[list[str], Field(max_length=2)] | None),
    ("prompt", s.Union(s.ListOf(s.Int(ge=0)), s.ListOf(s.ListOf(s.Int(ge=0))), s.Str(), s.ListOf(s.Str())),
     list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str]),
    ("int_or_str", s.Union(s.Int(), s.Str()), int | str),
    ("model", s.Model("_Fn", [s.Field("name", s.Str(), s.REQUIRED), s.Field("strict", s.Nullable(s.Bool()))], labelled=True), _Fn),
]  # fmt: skip


def _ours(kind: s.FieldType, value: Any) -> tuple[str, Any]:
    errors: s.ErrorList = []
    result = kind.check(value, (), errors)
    if result is s.INVALID:
        return "errors", [(e["type"], tuple(e["loc"]), e["msg"], e.get("ctx")) for e in errors]
    return "ok", result


_INTERNAL = re.compile(r"[\[\]{}()]")
_MARKERS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "function-wrap", "function-after"})


def _clean(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """vLLM's `clean_loc_for_param`: union labels of non-model members are dropped."""
    return tuple(p for p in loc if not (_INTERNAL.search(str(p)) or str(p).lower() in _MARKERS))


def _theirs(adapter: TypeAdapter[Any], value: Any) -> tuple[str, Any]:
    try:
        # FastAPI validates request bodies from attributes (model_attributes_type errors)
        result = adapter.validate_python(value, from_attributes=True)
    except ValidationError as exc:
        return "errors", [(e["type"], _clean(tuple(e["loc"])), e["msg"], e.get("ctx")) for e in exc.errors()]
    return "ok", result.model_dump(exclude_unset=True) if isinstance(result, BaseModel) else result


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "ok":
        return a[1] == b[1] or (a[1] != a[1] and b[1] != b[1])  # nan
    return a[1] == b[1]


@pytest.mark.parametrize(("name", "kind", "annotation"), PAIRS, ids=[p[0] for p in PAIRS])
def test_field_type_matches_pydantic(name: str, kind: s.FieldType, annotation: Any) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    model_values = [{"name": v} for v in VALUES[:60]] + [{"name": "f", "strict": v} for v in VALUES[:60]]
    values = VALUES + (model_values if name == "model" else [])
    differ = []
    for value in values:
        ours, theirs = _ours(kind, value), _theirs(adapter, value)
        if not _same(ours, theirs):
            differ.append(f"{value!r}: ours {ours}, pydantic {theirs}")
    assert not differ, f"{len(differ)} of {len(values)} differ:\n" + "\n".join(differ[:20])


def test_validation_error_message_as_vllm_formats_it() -> None:
    errors = [s.error("int_parsing", ("body", "n"), "Input should be a valid integer", "x" * 300)] * 12
    exc = s.validation_error(errors)
    lines = exc.message.split("\n")
    assert lines[0] == "12 validation errors:"
    assert len(lines) == 12 and lines[-1] == "  ...and 2 more errors"
    assert "...[truncated]" in lines[1] and exc.param == "body.n"
