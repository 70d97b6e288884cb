"""One request-validation engine that answers as pydantic (and so vLLM 0.33) answers.

vLLM's request models are pydantic models; FastAPI validates the decoded JSON body against them
and vLLM's validation handler turns the `ValidationError` into a 400 whose message lists the
errors (`{'type', 'loc', 'msg', 'input'[, 'ctx']}`, at most 10). This module reproduces that
without building objects: a request stays the orjson-decoded dict (its key order reaches the
chat template and the output bytes unchanged); validation walks it against a table of fields in
vLLM's declaration order, collects every error the way pydantic collects them, and writes lax
coercions back (`"stream": "true"` -> `True`, `"max_tokens": "5"` -> `5`).

Field types: `Str`, `Int`, `Float`, `Bool`, `Literal`, `ListOf`, `DictOf`, `AnyValue`,
`Nullable`, `Union` (pydantic's smart mode), `Tagged` (a discriminated union), `Model` (a
BaseModel, TypedDict or dataclass, with its `before`/`after` model validators) and `Check` (a
named function for shapes vLLM validates in code). Each type also describes itself as JSON
Schema, which `api/openapi.py` publishes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from render_service.exceptions import RequestValidationError

Loc = tuple[str | int, ...]
ErrorList = list[dict[str, Any]]


class _Invalid:
    """The result of a value that failed validation (its errors are in the error list)."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Any = _Invalid()
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()

# vLLM's validation handler (serve/exception_handling/handlers/validation.py)
_MAX_REPORTED_ERRORS = 10
_MAX_ERROR_INPUT_CHARS = 200
_MAX_ERROR_CHARS = 1000


def error(kind: str, loc: Loc, msg: str, value: Any, ctx: dict[str, Any] | None = None) -> dict[str, Any]:
    """One pydantic error, as `ValidationError.errors()` lists it."""
    err: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        err["ctx"] = ctx
    return err


def value_error(loc: Loc, message: str, value: Any) -> dict[str, Any]:
    """A `ValueError` raised inside a validator, as pydantic wraps it."""
    return error("value_error", loc, f"Value error, {message}", value, {"error": ValueError(message)})


def summarize_input(value: Any) -> Any:
    """vLLM's `_summarize_error_input`."""
    if isinstance(value, str):
        return value if len(value) <= _MAX_ERROR_INPUT_CHARS else value[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = str(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return f"<{type(value).__name__}>"
    return text if len(text) <= _MAX_ERROR_INPUT_CHARS else text[:_MAX_ERROR_INPUT_CHARS] + "...[truncated]"


def loc_text(loc: Loc) -> str:
    """A loc as vLLM prints it (`clean_loc_for_param`: our locs carry no internal markers)."""
    return ".".join(str(part) for part in loc)


def format_error(err: dict[str, Any]) -> str:
    shown = dict(err, loc=loc_text(err["loc"]), input=summarize_input(err["input"]))
    text = str(shown)
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "...[truncated]"


def validation_error(errors: ErrorList, unlisted: int = 0) -> RequestValidationError:
    """The 400 vLLM's validation handler answers for these errors (`unlisted`: errors pydantic
    would add after these that we count but do not spell out)."""
    count = len(errors) + unlisted
    label = "error" if count == 1 else "errors"
    reported = errors[:_MAX_REPORTED_ERRORS]
    message = f"{count} validation {label}:\n" + "".join(f"  {format_error(err)}\n" for err in reported)
    if count > len(reported):
        message += f"  ...and {count - len(reported)} more {label}\n"
    exc = RequestValidationError(message.rstrip(), param=loc_text(errors[0]["loc"]) if errors else None)
    exc.errors = errors  # type: ignore[attr-defined]
    exc.unlisted = unlisted  # type: ignore[attr-defined]
    return exc


def raise_if_errors(errors: ErrorList) -> None:
    if errors:
        raise validation_error(errors)


def errors_of(exc: RequestValidationError, loc: Loc = ()) -> tuple[ErrorList, int]:
    """The structured errors a `RequestValidationError` carries (re-rooted under `loc`)."""
    errors: ErrorList = getattr(exc, "errors", None) or []
    return [dict(e, loc=loc + tuple(e["loc"])) for e in errors], getattr(exc, "unlisted", 0)


def _number_text(value: float | int) -> str:
    """pydantic prints constraint bounds without a trailing `.0`."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# -- field types ------------------------------------------------------------------------------


class FieldType:
    """A value's type: `check` returns the (coerced) value, or INVALID after appending errors."""

    #: the union member label pydantic puts in `loc` (class names only: vLLM drops the others)
    tag: str | None = None

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        raise NotImplementedError

    def json_schema(self) -> dict[str, Any]:
        return {}

    def side_effect_free(self, seen: set[int]) -> bool:
        """Whether `check` only returns or appends errors, through every type it reaches (no
        validator that could raise): then a check whose result is known need not run.
        `seen`: the types already asked (definitions may refer to themselves)."""
        return False


class _Leaf:
    """A type whose check reaches no other type and runs no validator."""

    def side_effect_free(self, seen: set[int]) -> bool:
        return True


def side_effect_free(types: Any, seen: set[int]) -> bool:
    """`side_effect_free` of every type in `types` (a type already in `seen` counts as free: its
    own answer is the one being worked out)."""
    for node in types:
        if id(node) not in seen:
            seen.add(id(node))
            if not node.side_effect_free(seen):
                return False
    return True


def _bounds_errors(spec: Any, value: float | int, loc: Loc, errors: ErrorList, original: Any) -> bool:
    """The bound checks on the coerced `value` (errors show the `original` input, as pydantic's do)."""
    # pydantic-core's order (it matters for nan, which fails every bound)
    for name, kind, words, failed in (
        ("le", "less_than_equal", "less than or equal to", lambda v, b: not v <= b),
        ("lt", "less_than", "less than", lambda v, b: not v < b),
        ("ge", "greater_than_equal", "greater than or equal to", lambda v, b: not v >= b),
        ("gt", "greater_than", "greater than", lambda v, b: not v > b),
    ):
        bound = getattr(spec, name)
        if bound is not None and failed(value, bound):
            errors.append(error(kind, loc, f"Input should be {words} {_number_text(bound)}", original, {name: bound}))
            return False
    return True


def _bounds_schema(spec: Any, schema: dict[str, Any]) -> dict[str, Any]:
    for name, key in (("gt", "exclusiveMinimum"), ("ge", "minimum"), ("lt", "exclusiveMaximum"), ("le", "maximum")):
        if getattr(spec, name) is not None:
            schema[key] = getattr(spec, name)
    return schema


@dataclass(frozen=True)
class Str(_Leaf, FieldType):
    max_length: int | None = None
    min_length: int | None = None

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if not isinstance(value, str):
            errors.append(error("string_type", loc, "Input should be a valid string", value))
            return INVALID
        if self.min_length is not None and len(value) < self.min_length:
            noun = "character" if self.min_length == 1 else "characters"
            errors.append(
                error(
                    "string_too_short",
                    loc,
                    f"String should have at least {self.min_length} {noun}",
                    value,
                    {"min_length": self.min_length},
                )
            )
            return INVALID
        if self.max_length is not None and len(value) > self.max_length:
            noun = "character" if self.max_length == 1 else "characters"
            errors.append(
                error(
                    "string_too_long",
                    loc,
                    f"String should have at most {self.max_length} {noun}",
                    value,
                    {"max_length": self.max_length},
                )
            )
            return INVALID
        return value

    def json_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if self.min_length is not None:
            schema["minLength"] = self.min_length
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        return schema


# pydantic-core's lax str -> int: optional sign, digits with single underscores between them,
# an optional all-zero fraction; surrounding whitespace is stripped.
_INT_TEXT = re.compile(r"[+-]?\d+(?:_\d+)*(?:\.0+)?")
_INT_MAX_FROM_FLOAT = 2**63  # floats at or past i64 are refused ("exceeded maximum size")


@dataclass(frozen=True)
class Int(_Leaf, FieldType):
    ge: int | None = None
    le: int | None = None
    gt: int | None = None
    lt: int | None = None

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        coerced = _lax_int(value, loc, errors, strict)
        if coerced is INVALID:
            return INVALID
        return coerced if _bounds_errors(self, coerced, loc, errors, value) else INVALID

    def takes_all(self, items: list[Any]) -> bool:
        """Whether every item is a plain int within the bounds (a fast path for long id lists;
        False means "check them one by one")."""
        if not items or not set(map(type, items)) <= {int}:
            return False
        if self.ge is not None or self.gt is not None:
            low = min(items)
            if (self.ge is not None and low < self.ge) or (self.gt is not None and low <= self.gt):
                return False
        if self.le is not None or self.lt is not None:
            high = max(items)
            if (self.le is not None and high > self.le) or (self.lt is not None and high >= self.lt):
                return False
        return True

    def json_schema(self) -> dict[str, Any]:
        return _bounds_schema(self, {"type": "integer"})


def _lax_int(value: Any, loc: Loc, errors: ErrorList, strict: bool) -> Any:
    if isinstance(value, bool):
        if strict:
            errors.append(error("int_type", loc, "Input should be a valid integer", value))
            return INVALID
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and not strict:
        if not math.isfinite(value):
            errors.append(error("finite_number", loc, "Input should be a finite number", value))
            return INVALID
        if not value.is_integer():
            errors.append(
                error(
                    "int_from_float", loc, "Input should be a valid integer, got a number with a fractional part", value
                )
            )
            return INVALID
        if abs(value) >= _INT_MAX_FROM_FLOAT:
            errors.append(
                error(
                    "int_parsing_size", loc, "Unable to parse input string as an integer, exceeded maximum size", value
                )
            )
            return INVALID
        return int(value)
    if isinstance(value, str) and not strict:
        text = value.strip()
        if _INT_TEXT.fullmatch(text):
            return int(text.split(".", 1)[0].replace("_", ""))
        errors.append(
            error("int_parsing", loc, "Input should be a valid integer, unable to parse string as an integer", value)
        )
        return INVALID
    errors.append(error("int_type", loc, "Input should be a valid integer", value))
    return INVALID


# Python's float() on the stripped text, minus what pydantic-core refuses: no "infinity" words
# beyond inf/nan spellings it knows, no leading/trailing underscores.
_FLOAT_TEXT = re.compile(
    r"[+-]?(?:(?:\d+(?:_\d+)*)?\.?\d+(?:_\d+)*(?:[eE][+-]?\d+)?|\d+(?:_\d+)*\.|inf|infinity|nan)", re.IGNORECASE
)


@dataclass(frozen=True)
class Float(_Leaf, FieldType):
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    lt: float | None = None

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if isinstance(value, bool):
            if strict:
                errors.append(error("float_type", loc, "Input should be a valid number", value))
                return INVALID
            coerced: Any = float(value)
        elif isinstance(value, int):
            coerced = float(value) if abs(value) < 2**1023 else value
        elif isinstance(value, float):
            coerced = value
        elif isinstance(value, str) and not strict:
            text = value.strip()
            if not _FLOAT_TEXT.fullmatch(text):
                errors.append(
                    error(
                        "float_parsing",
                        loc,
                        "Input should be a valid number, unable to parse string as a number",
                        value,
                    )
                )
                return INVALID
            coerced = float(text.replace("_", ""))
        else:
            errors.append(error("float_type", loc, "Input should be a valid number", value))
            return INVALID
        return coerced if _bounds_errors(self, coerced, loc, errors, value) else INVALID

    def json_schema(self) -> dict[str, Any]:
        return _bounds_schema(self, {"type": "number"})


INT64_RANGE = (-(2**63), 2**63 - 1)
_TRUE_TEXT = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_TEXT = frozenset({"0", "off", "f", "false", "n", "no"})


@dataclass(frozen=True)
class Bool(_Leaf, FieldType):
    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if isinstance(value, bool):
            return value
        if not strict:
            # numbers: 0 and 1 are booleans; other integers pydantic can read as i64 are
            # "unable to interpret", anything else is not a boolean at all
            if isinstance(value, (int, float)):
                if value in (0, 1):
                    return bool(value)
                integral = isinstance(value, int) or (math.isfinite(value) and value.is_integer())
                if integral and INT64_RANGE[0] <= value <= INT64_RANGE[1]:
                    errors.append(
                        error("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value)
                    )
                    return INVALID
                errors.append(error("bool_type", loc, "Input should be a valid boolean", value))
                return INVALID
            if isinstance(value, str):
                lowered = value.lower()
                if lowered in _TRUE_TEXT:
                    return True
                if lowered in _FALSE_TEXT:
                    return False
                errors.append(
                    error("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value)
                )
                return INVALID
        errors.append(error("bool_type", loc, "Input should be a valid boolean", value))
        return INVALID

    def json_schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


def expected_text(values: Sequence[Any]) -> str:
    """pydantic's `expected` for a Literal: "'a', 'b' or 'c'"."""
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


class Literal(_Leaf, FieldType):
    def __init__(self, *values: Any) -> None:
        self.values = values
        self.expected = expected_text(values)

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        for allowed in self.values:
            # bool is an int subclass: strict, True must not match a literal 1 (and vice versa)
            if value == allowed and type(value) is type(allowed):
                return value
        if not strict and isinstance(value, (int, float)):
            # lax: a bool or int literal takes any number equal to it (0 and 0.0 are False,
            # True is 1), as pydantic-core's literal lookup does
            for allowed in self.values:
                if isinstance(allowed, int) and value == allowed:
                    return allowed
        errors.append(
            error("literal_error", loc, f"Input should be {self.expected}", value, {"expected": self.expected})
        )
        return INVALID

    def json_schema(self) -> dict[str, Any]:
        if len(self.values) == 1:
            return {"const": self.values[0]}
        return {"enum": list(self.values)}


class AnyValue(_Leaf, FieldType):
    def __init__(self, schema: dict[str, Any] | None = None) -> None:
        self.schema = schema or {}

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        return value

    def json_schema(self) -> dict[str, Any]:
        return dict(self.schema)


class ListOf(FieldType):
    """`list[X]` (`iterable=True`: `Iterable[X]`, which takes any iterable and reports
    "Input should be iterable")."""

    def __init__(
        self, item: FieldType, *, max_length: int | None = None, min_length: int | None = None, iterable: bool = False
    ) -> None:
        self.item = item
        self.max_length = max_length
        self.min_length = min_length
        self.iterable = iterable

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if not isinstance(value, list):
            if self.iterable and isinstance(value, (str, dict)) and not strict:
                value = list(value)
            elif self.iterable:
                errors.append(error("iterable_type", loc, "Input should be iterable", value))
                return INVALID
            else:
                errors.append(error("list_type", loc, "Input should be a valid list", value))
                return INVALID
        failed = False
        out: list[Any] | None = None
        if isinstance(self.item, Int) and self.item.takes_all(value):
            value_items: Any = ()  # token id lists: checked at C speed, nothing to coerce
        else:
            value_items = value
        for index, item in enumerate(value_items):
            result = self.item.check(item, (*loc, index), errors, strict)
            if result is INVALID:
                failed = True
            elif result is not item:
                if out is None:
                    out = list(value)
                out[index] = result
        if failed:
            return INVALID
        actual = len(value)
        if self.max_length is not None and actual > self.max_length:
            noun = "item" if self.max_length == 1 else "items"
            errors.append(
                error(
                    "too_long",
                    loc,
                    f"List should have at most {self.max_length} {noun} after validation, not {actual}",
                    value,
                    {"field_type": "List", "max_length": self.max_length, "actual_length": actual},
                )
            )
            return INVALID
        if self.min_length is not None and actual < self.min_length:
            noun = "item" if self.min_length == 1 else "items"
            errors.append(
                error(
                    "too_short",
                    loc,
                    f"List should have at least {self.min_length} {noun} after validation, not {actual}",
                    value,
                    {"field_type": "List", "min_length": self.min_length, "actual_length": actual},
                )
            )
            return INVALID
        return value if out is None else out

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free([self.item], seen)

    def json_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array", "items": self.item.json_schema()}
        if self.max_length is not None:
            schema["maxItems"] = self.max_length
        if self.min_length is not None:
            schema["minItems"] = self.min_length
        return schema


class DictOf(FieldType):
    """`dict[str, X]` (`value=None`: `dict[str, Any]`). JSON keys are always strings; with
    `key=Int()` (`dict[int, X]`) each key is validated as an int, its error before its value's,
    and written back in its canonical spelling ("007" -> "7", as vLLM's answer shows it)."""

    def __init__(self, value: FieldType | None = None, *, key: FieldType | None = None) -> None:
        self.value = value
        self.key = key

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if not isinstance(value, dict):
            errors.append(error("dict_type", loc, "Input should be a valid dictionary", value))
            return INVALID
        if self.value is None and self.key is None:
            return value
        failed = False
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            out_key = key
            if self.key is not None:
                coerced = self.key.check(key, (*loc, key), errors, strict)
                if coerced is INVALID:
                    failed = True
                else:
                    out_key = str(coerced)
                    changed |= out_key != key
            result = item if self.value is None else self.value.check(item, (*loc, key), errors, strict)
            if result is INVALID:
                failed = True
                continue
            changed |= result is not item
            out[out_key] = result
        if failed:
            return INVALID
        return out if changed else value

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free([t for t in (self.key, self.value) if t is not None], seen)

    def json_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object"}
        if self.value is not None:
            schema["additionalProperties"] = self.value.json_schema()
        return schema


class Nullable(FieldType):
    """`X | None`: None passes; anything else is validated as X (errors carry no member label)."""

    def __init__(self, inner: FieldType) -> None:
        self.inner = inner

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if value is None:
            return None
        return self.inner.check(value, loc, errors, strict)

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free([self.inner], seen)

    def json_schema(self) -> dict[str, Any]:
        inner = self.inner.json_schema()
        members = inner["anyOf"] if list(inner) == ["anyOf"] else [inner]
        return {"anyOf": [*members, {"type": "null"}]}


class Union(FieldType):
    """pydantic's smart-mode union: an exact (strict) match first, then the first lax match; when
    every member fails, every member's errors in member order, each under the member's label.

    The strict pass skips a model member whose discriminating literal (e.g. a message's `role`)
    the value does not hold: that check could only fail, and its errors are dropped anyway."""

    def __init__(self, *members: FieldType) -> None:
        self.members = members
        # Per member: its `tag` and `Model.discriminant` (None until first use: definitions
        # referred to by name are resolved by then).
        self._strict_plan: list[tuple[FieldType, str | None, tuple[str, tuple[Any, ...], bool] | None]] | None = None

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        return self.match(value, loc, errors, strict)[1]

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free(self.members, seen)

    def _plan(self) -> list[tuple[FieldType, str | None, tuple[str, tuple[Any, ...], bool] | None]]:
        plan = self._strict_plan
        if plan is None:
            plan = self._strict_plan = [
                (m, m.tag, m.discriminant() if isinstance(m, Model) else None) for m in self.members
            ]
        return plan

    def match(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> tuple[int | None, Any]:
        """(index of the member that validated, its result), or (None, INVALID)."""
        is_dict = isinstance(value, dict)
        for index, (member, tag, discriminant) in enumerate(self._plan()):
            if discriminant is not None and is_dict:
                key, allowed, required = discriminant
                if key in value:
                    held = value[key]
                    for literal in allowed:
                        if held == literal and type(held) is type(literal):
                            break
                    else:
                        continue  # Literal's strict check fails: so does the member's
                elif required:
                    continue  # "Field required"
            result = member.check(value, (*loc, tag) if tag else loc, [], True)
            if result is not INVALID:
                return index, result
        collected: ErrorList = []
        if not strict:
            for index, member in enumerate(self.members):
                found: ErrorList = []
                result = member.check(value, _member_loc(loc, member), found, False)
                if result is not INVALID:
                    return index, result
                collected += found
        else:
            for member in self.members:
                member.check(value, _member_loc(loc, member), collected, True)
        errors += collected
        return None, INVALID

    def json_schema(self) -> dict[str, Any]:
        return {"anyOf": [m.json_schema() for m in self.members]}


def _member_loc(loc: Loc, member: FieldType) -> Loc:
    return (*loc, member.tag) if member.tag else loc


@dataclass
class Field:
    name: str
    type: FieldType
    default: Any = None  # REQUIRED: "Field required" when absent
    description: str | None = None


ModelValidator = Callable[[dict[str, Any], Loc], None]


@dataclass
class Model(FieldType):
    """A pydantic BaseModel (`kind="model"`), TypedDict (`"typeddict"`) or dataclass.

    `before` validators run on the raw dict (in the order pydantic runs them: vLLM's last-defined
    first); `after` validators once every field validated. A validator raises (a
    `RenderServiceError`, e.g. vLLM's VLLMValidationError, which pydantic does not wrap) or appends
    nothing: pydantic-wrapped ValueErrors are reported by raising `validation_error([...])`.
    """

    name: str
    fields: list[Field]
    kind: str = "model"
    before: tuple[ModelValidator, ...] = ()
    after: tuple[ModelValidator, ...] = ()
    description: str | None = None
    # Whether pydantic labels this model's errors in a union with its class name: TypedDicts,
    # dataclasses and plain BaseModels are; vLLM's OpenAIBaseModel is not (its wrap validator
    # makes the label "function-wrap[...]", which vLLM's error handler drops). None: by kind.
    labelled: bool | None = None
    by_name: dict[str, Field] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_name = {f.name: f for f in self.fields}

    @property
    def tag(self) -> str | None:  # type: ignore[override]
        labelled = self.kind != "model" if self.labelled is None else self.labelled
        return self.name if labelled else None

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if not isinstance(value, dict):
            if self.kind == "typeddict":
                errors.append(error("dict_type", loc, "Input should be a valid dictionary", value))
            elif self.kind == "dataclass":
                errors.append(
                    error(
                        "dataclass_type",
                        loc,
                        f"Input should be a dictionary or an instance of {self.name}",
                        value,
                        {"class_name": self.name},
                    )
                )
            else:  # FastAPI validates bodies from attributes: pydantic's from_attributes error
                errors.append(
                    error(
                        "model_attributes_type",
                        loc,
                        "Input should be a valid dictionary or object to extract fields from",
                        value,
                    )
                )
            return INVALID
        for validator in self.before:
            validator(value, loc)
        found: ErrorList = []
        out: dict[str, Any] | None = None
        for spec in self.fields:
            if spec.name not in value:
                if spec.default is REQUIRED:
                    found.append(error("missing", (*loc, spec.name), "Field required", value))
                continue
            item = value[spec.name]
            result = spec.type.check(item, (*loc, spec.name), found, strict)
            if result is not INVALID and result is not item:
                if out is None:
                    out = dict(value)
                out[spec.name] = result
        if found:
            errors += found
            return INVALID
        result_dict = value if out is None else out
        if self.kind == "dataclass":  # the instance has every field (and no extra keys)
            result_dict = {
                spec.name: result_dict[spec.name] if spec.name in result_dict else spec.default for spec in self.fields
            }
        for validator in self.after:
            try:
                validator(result_dict, loc)
            except ValueError as exc:  # pydantic wraps it: "Value error, ..." at the model
                errors.append(value_error(loc, str(exc), value))
                return INVALID
        return result_dict

    def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """Validate a request body (loc root "body"); coercions are written back into `body`,
        keeping its key order. Raises vLLM's 400 on any error."""
        errors: ErrorList = []
        result = self.check(body, ("body",), errors)
        raise_if_errors(errors)
        if result is not body:
            for key, item in result.items():
                body[key] = item
        return body

    def side_effect_free(self, seen: set[int]) -> bool:
        return not self.before and not self.after and side_effect_free([f.type for f in self.fields], seen)

    def discriminant(self) -> tuple[str, tuple[Any, ...], bool] | None:
        """(field, its literal values, whether it is required) for the first field typed as a
        `Literal`, when this model's check has no side effects: a strict check of a dict whose
        field is absent (when required) or holds none of those values can only fail."""
        if not self.side_effect_free(set()):
            return None
        for spec in self.fields:
            if type(spec.type) is Literal:
                return spec.name, spec.type.values, spec.default is REQUIRED
        return None

    def json_schema(self) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{self.name}"}

    def models(self) -> dict[str, Model]:
        """This model and every model its fields reach, by name."""
        found: dict[str, Model] = {}
        _collect_models(self, found)
        return found


def _collect_models(node: Any, found: dict[str, Model]) -> None:
    if isinstance(node, Model):
        if node.name in found:
            return
        found[node.name] = node
        for spec in node.fields:
            _collect_models(spec.type, found)
        return
    for child in _children(node):
        _collect_models(child, found)


def _children(node: Any) -> list[Any]:
    if isinstance(node, (Nullable,)):
        return [node.inner]
    if isinstance(node, Union):
        return list(node.members)
    if isinstance(node, ListOf):
        return [node.item]
    if isinstance(node, DictOf):
        return [node.value] if node.value is not None else []
    if isinstance(node, Tagged):
        return list(node.choices.values())
    if isinstance(node, Check):
        return [node.schema] if isinstance(node.schema, FieldType) else []
    if isinstance(node, After):
        return [node.inner]
    return []


class Tagged(FieldType):
    """A discriminated union (`Field(discriminator=...)`): the tag picks the member, whose
    errors carry the tag value in `loc`."""

    def __init__(self, discriminator: str, choices: dict[str, FieldType]) -> None:
        self.discriminator = discriminator
        self.choices = choices

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        if not isinstance(value, dict):
            errors.append(
                error(
                    "model_attributes_type",
                    loc,
                    "Input should be a valid dictionary or object to extract fields from",
                    value,
                )
            )
            return INVALID
        if self.discriminator not in value:
            errors.append(
                error(
                    "union_tag_not_found",
                    loc,
                    f"Unable to extract tag using discriminator '{self.discriminator}'",
                    value,
                    {"discriminator": f"'{self.discriminator}'"},
                )
            )
            return INVALID
        tag = value[self.discriminator]
        member = self.choices.get(tag) if isinstance(tag, str) else None
        if member is None:
            expected = ", ".join(f"'{t}'" for t in self.choices)
            errors.append(
                error(
                    "union_tag_invalid",
                    loc,
                    f"Input tag '{tag}' found using '{self.discriminator}' does not match any of the expected tags: "
                    f"{expected}",
                    value,
                    {"discriminator": f"'{self.discriminator}'", "tag": str(tag), "expected_tags": expected},
                )
            )
            return INVALID
        return member.check(value, (*loc, tag), errors, strict)

    def side_effect_free(self, seen: set[int]) -> bool:
        return side_effect_free(self.choices.values(), seen)

    def json_schema(self) -> dict[str, Any]:
        return {
            "oneOf": [m.json_schema() for m in self.choices.values()],
            "discriminator": {"propertyName": self.discriminator},
        }


class After(FieldType):
    """A field validator (pydantic's default "after" mode): `func(value)` once the type passed; a
    ValueError it raises is reported at the field as "Value error, ..."."""

    def __init__(self, inner: FieldType, func: Callable[[Any], Any]) -> None:
        self.inner = inner
        self.func = func

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        result = self.inner.check(value, loc, errors, strict)
        if result is INVALID:
            return INVALID
        try:
            out = self.func(result)
        except ValueError as exc:
            errors.append(value_error(loc, str(exc), value))
            return INVALID
        return result if out is None else out

    def json_schema(self) -> dict[str, Any]:
        return self.inner.json_schema()


class Check(FieldType):
    """A shape vLLM validates in code, or one whose pydantic union we reduce to its first error:
    a named function `(value, loc, errors) -> value | INVALID`, described by `schema`."""

    def __init__(
        self,
        func: Callable[[Any, Loc, ErrorList], Any],
        schema: FieldType | dict[str, Any] | None = None,
    ) -> None:
        self.func = func
        self.schema = schema

    def check(self, value: Any, loc: Loc, errors: ErrorList, strict: bool = False) -> Any:
        return self.func(value, loc, errors)

    def json_schema(self) -> dict[str, Any]:
        if isinstance(self.schema, FieldType):
            return self.schema.json_schema()
        return dict(self.schema or {})


def legacy(func: Callable[[Any, Loc], Any]) -> Callable[[Any, Loc, ErrorList], Any]:
    """Adapt a check that raises `RequestValidationError` (first error only) to a `Check`."""

    def run(value: Any, loc: Loc, errors: ErrorList) -> Any:
        try:
            result = func(value, loc)
        except RequestValidationError as exc:
            found, _ = errors_of(exc)
            errors += found or [error("value_error", loc, exc.message, value)]
            return INVALID
        return value if result is None else result

    return run
