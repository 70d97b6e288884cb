"""Generated bad bodies for the schema parity goldens (tests/parity/golden_schema/).

For every field of a route's request table: values of the wrong type, the strings and numbers
pydantic's lax mode coerces or refuses, values past the declared bounds, and pairs of bad fields
sent in reverse declaration order (pydantic reports in declaration order). `record_schema.py`
sends them to vLLM 0.33 and stores its answers; `test_schema_parity.py` compares ours with them
error for error (status, message, type, param, code).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from render_service.api import messages, requests, responses
from render_service.api.schema import (
    AnyValue,
    Bool,
    Check,
    DictOf,
    FieldType,
    Float,
    Int,
    ListOf,
    Literal,
    Model,
    Nullable,
    Str,
    Union,
)

GOLDEN_DIR = Path(__file__).resolve().parent / "golden_schema"
SEED = 20261130

HI = [{"role": "user", "content": "Hi"}]
# (path, the table, a valid base body, fields we leave alone: they need a model feature, e.g.
# multimodal kwargs the oracle refuses for a text model, or change nothing but a log line)
ROUTES: dict[str, tuple[str, Model, dict[str, Any], frozenset[str]]] = {
    "chat": (
        "/v1/chat/completions/render",
        requests.CHAT_COMPLETION_REQUEST,
        {"model": "tinyqwen3", "messages": HI},
        frozenset({"messages", "media_io_kwargs", "mm_processor_kwargs", "chat_template", "kv_transfer_params"}),
    ),
    "completions": (
        "/v1/completions/render",
        requests.COMPLETION_REQUEST,
        {"model": "tinyqwen3", "prompt": "Hi"},
        frozenset({"prompt_embeds", "kv_transfer_params"}),
    ),
    "tokenize": (
        "/tokenize",
        requests.TOKENIZE_COMPLETION_REQUEST,
        {"model": "tinyqwen3", "prompt": "Hi"},
        frozenset(),
    ),
    "tokenize_chat": (
        "/tokenize",
        requests.TOKENIZE_CHAT_REQUEST,
        {"model": "tinyqwen3", "messages": HI},
        frozenset({"messages", "media_io_kwargs", "mm_processor_kwargs", "chat_template"}),
    ),
    "messages": (
        "/v1/messages/render",
        messages.MESSAGES_REQUEST,
        {"model": "tinyqwen3", "messages": HI, "max_tokens": 8},
        frozenset({"kv_transfer_params"}),
    ),
    "responses": (
        "/v1/responses/render",
        responses.RESPONSES_REQUEST,
        {"model": "tinyqwen3", "input": "Hi"},
        # openai's item, tool, tool-choice and text unions are reduced to their first error (README)
        frozenset(
            {
                "input",
                "tools",
                "tool_choice",
                "text",
                "prompt",
                "prompt_cache_options",
                "prompt_cache_retention",
                "previous_input_messages",
                "kv_transfer_params",
                "media_io_kwargs",
                "mm_processor_kwargs",
            }
        ),
    ),
    "detokenize": ("/detokenize", requests.DETOKENIZE_REQUEST, {"model": "tinyqwen3", "tokens": [1, 2]}, frozenset()),
}


def _unwrap(kind: FieldType) -> FieldType:
    while isinstance(kind, (Nullable, Check)):
        inner = kind.inner if isinstance(kind, Nullable) else kind.schema
        if not isinstance(inner, FieldType):
            break
        kind = inner
    return kind


def bad_values(kind: FieldType) -> list[Any]:
    """Values worth sending to a field of this type: refused ones and lax-coerced ones."""
    common: list[Any] = [None, [], {}, "x"]
    kind = _unwrap(kind)
    if isinstance(kind, Int):
        return [*common, True, 1.5, 2.0, "3", " 4 ", "1_000", "5.0", "5.5", "1e3", -2, 2**63, 1e300]
    if isinstance(kind, Float):
        return [*common, True, "0.5", " 1 ", "1e-3", "inf", "nan", "1_0", "abc", "", 3, -3, 1e300]
    if isinstance(kind, Bool):
        return [*common, "true", "yes", "off", "F", "maybe", 0, 1, 2, 0.0, 1.0, 0.5]
    if isinstance(kind, Str):
        return [*common, 5, 1.5, True, ""]
    if isinstance(kind, Literal):
        return [*common, "bogus", 1, True, *[str(v).upper() for v in kind.values[:1]]]
    if isinstance(kind, ListOf):
        return [*common, [None], ["1"], [1.5], [{}], [True]]
    if isinstance(kind, DictOf):
        return [*common, 5, {"a": None}, {"a": "x"}, {"1": "2"}]
    if isinstance(kind, (Union, Model, AnyValue)):
        return [*common, 5, True, ["a"], {"type": "bogus"}, {"type": "json_schema"}]
    return common


def cases(route: str) -> list[dict[str, Any]]:
    """The request bodies for one route, in a fixed order."""
    _, table, base, skip = ROUTES[route]
    rng = random.Random(SEED)
    fields = [f for f in table.fields if f.name not in skip]
    bodies: list[dict[str, Any]] = []
    for spec in fields:
        for value in bad_values(spec.type):
            bodies.append({**base, spec.name: value})
    # pairs of refused values, the later field first in the body
    refused = {
        spec.name: [v for v in bad_values(spec.type) if isinstance(v, (list, dict)) or v == "x"] for spec in fields
    }
    for _ in range(40 if len(fields) > 1 else 0):
        first, second = sorted(rng.sample(range(len(fields)), 2), reverse=True)
        a, b = fields[first], fields[second]
        bodies.append({**base, a.name: rng.choice(refused[a.name]), b.name: rng.choice(refused[b.name])})
    return bodies


def request(route: str, body: dict[str, Any]) -> dict[str, Any]:
    # vLLM's Responses render ignores X-Request-Id (its ids are random: the comparison normalizes them)
    headers = {} if route == "responses" else {"X-Request-Id": "schema"}
    return {"method": "POST", "path": ROUTES[route][0], "headers": headers, "json": body}
