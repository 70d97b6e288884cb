"""A union's strict pass skips a model member whose discriminating literal the value does not hold,
and only when that member's check has no side effect; results and errors are the same either way."""

from __future__ import annotations

from typing import Any

from render_service.api import schema as s


class CountingStr(s.FieldType):
    """A string type that counts its checks (declared side-effect free or not)."""

    def __init__(self, free: bool) -> None:
        self.free = free
        self.calls = 0

    def check(self, value: Any, loc: s.Loc, errors: s.ErrorList, strict: bool = False) -> Any:
        self.calls += 1
        return s.Str().check(value, loc, errors, strict)

    def side_effect_free(self, seen: set[int]) -> bool:
        return self.free


def _union(free: bool) -> tuple[s.Union, CountingStr]:
    counted = CountingStr(free)
    first = s.Model(
        "A", [s.Field("x", counted, s.REQUIRED), s.Field("role", s.Literal("a"), s.REQUIRED)], kind="typeddict"
    )
    second = s.Model("B", [s.Field("x", s.Str(), s.REQUIRED), s.Field("role", s.Literal("b"), s.REQUIRED)])
    return s.Union(first, second), counted


def test_a_member_that_can_only_fail_is_skipped() -> None:
    union, counted = _union(free=True)
    assert union.match({"role": "b", "x": "hi"}, ("body",), []) == (1, {"role": "b", "x": "hi"})
    assert counted.calls == 0
    assert union.match({"x": "hi"}, ("body",), [])[0] is None  # role missing: every member fails...
    assert counted.calls > 0  # ...and the lax pass, whose errors are kept, checks each member


def test_a_member_with_side_effects_is_checked() -> None:
    union, counted = _union(free=False)
    assert union.match({"role": "b", "x": "hi"}, ("body",), []) == (1, {"role": "b", "x": "hi"})
    assert counted.calls == 1


def test_a_literal_of_another_type_does_not_match() -> None:
    union = s.Union(
        s.Model("One", [s.Field("kind", s.Literal(1), s.REQUIRED)], kind="typeddict"),
        s.Model("Flag", [s.Field("kind", s.Literal(True), s.REQUIRED)], kind="typeddict"),
    )
    assert union.match({"kind": True}, ("body",), [])[0] == 1  # True == 1, but strict wants a bool
    assert union.match({"kind": 1}, ("body",), [])[0] == 0


def test_errors_are_every_members_when_all_fail() -> None:
    union, _ = _union(free=True)
    errors: s.ErrorList = []
    assert union.check({"role": "c", "x": "hi"}, ("body",), errors) is s.INVALID
    assert [(e["type"], e["loc"]) for e in errors] == [
        ("literal_error", ("body", "A", "role")),
        ("literal_error", ("body", "role")),
    ]
