"""protocol: the helper checks left outside the engine (api/schema.py, tested against pydantic in
test_schema.py) report what pydantic (vLLM's request models) reports: the
first error's type and message, checked against pydantic itself."""

from __future__ import annotations

import ast
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from render_service.api import protocol
from render_service.exceptions import RequestValidationError


class Model(BaseModel):
    text: str | None = None
    mapping: dict[str, Any] | None = None
    items: list[Any] | None = None
    count: int | None = Field(default=None, ge=0, le=10)
    payload: Literal["tensors", "none"] = "tensors"


def _pydantic(body: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as raised:
        Model(**body)
    error = raised.value.errors()[0]
    return error["type"], error["msg"]


def _ours(check: Any) -> tuple[str, str]:
    with pytest.raises(RequestValidationError) as raised:
        check()
    detail = ast.literal_eval(raised.value.message.split("\n  ", 1)[1])
    return detail["type"], detail["msg"]


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ({"mapping": "x"}, lambda b: protocol.opt_dict(b, "mapping")),
    ],
    ids=["dict-from-opt_dict"],
)
def test_schema_errors_match_pydantic(body: dict[str, Any], check: Any) -> None:
    key = next(iter(body))
    renamed = {"mm_payload": body[key]} if key == "payload" else body
    assert _ours(lambda: check(dict(renamed))) == _pydantic(body)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Input should be 'auto' or 'disabled'", "literal_error"),
        ("Input should be False", "literal_error"),
        ("Input should be a valid string", "string_type"),
        ("Input should be a valid dictionary or object to extract fields from", "model_attributes_type"),
        ("Input should be greater than or equal to 1", "greater_than_equal"),
        ("Input should be a nice value", "value_error"),
        ("Value error, max_tokens must be positive", "value_error"),
    ],
)
def test_error_type_follows_the_message(message: str, kind: str) -> None:
    assert protocol._error_type(message) == kind
