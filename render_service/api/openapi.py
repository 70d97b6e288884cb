"""`GET /openapi.json`: the OpenAPI 3.1 description `vllm launch render` (FastAPI) serves, for
the paths we serve, generated from the request tables the handlers validate with (requests.py).

Layout as FastAPI writes it: `info` FastAPI's defaults, one operation per route with its
`operationId`, the request body as a `$ref` (a union for /tokenize), vLLM's `ErrorResponse` for
its error statuses and FastAPI's `HTTPValidationError` for 422. Component schemas list fields in
declaration order with FastAPI's titles, defaults and bounds. The Anthropic Messages, Responses
bodies are validated by code that has no table yet: they are described as objects with their
required fields.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from render_service.api import derender, requests
from render_service.api.schema import REQUIRED, Model

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_PHRASES = {
    "400": "Bad Request",
    "404": "Not Found",
    "409": "Conflict",
    "422": "Unprocessable Entity",
    "500": "Internal Server Error",
    "501": "Not Implemented",
}

# (path, method, FastAPI endpoint name, request body schema or None, error statuses, 200 schema)
_RENDER_ERRORS = ("400", "404", "501", "500")
_GENERATE = {"$ref": "#/components/schemas/GenerateRequest"}
_OPERATIONS: tuple[tuple[str, str, str, Any, tuple[str, ...], dict[str, Any] | None], ...] = (
    ("/load", "get", "get_server_load_metrics", None, (), {}),
    ("/version", "get", "show_version", None, (), {}),
    ("/kv_event_sources", "get", "kv_event_sources", None, (), {}),
    ("/health", "get", "health", None, (), None),
    ("/metrics", "get", "metrics", None, (), {}),
    (
        "/tokenize",
        "post",
        "tokenize",
        {
            "anyOf": [
                {"$ref": "#/components/schemas/TokenizeCompletionRequest"},
                {"$ref": "#/components/schemas/TokenizeChatRequest"},
            ],
            "title": "Request",
        },
        ("400", "404", "500", "501"),
        {},
    ),
    ("/detokenize", "post", "detokenize", "DetokenizeRequest", ("400", "404", "500"), {}),
    ("/v1/models", "get", "show_available_models", None, (), {}),
    ("/ping", "get", "ping", None, (), {}),
    ("/ping", "post", "ping", None, (), {}),
    (
        "/v1/chat/completions/render",
        "post",
        "render_chat_completion",
        "ChatCompletionRequest",
        _RENDER_ERRORS,
        _GENERATE,
    ),
    ("/v1/messages/render", "post", "render_messages", "AnthropicMessagesRequest", _RENDER_ERRORS, _GENERATE),
    (
        "/v1/completions/render",
        "post",
        "render_completion",
        "CompletionRequest",
        ("400", "404", "500"),
        {"type": "array", "items": _GENERATE, "title": "Response Render Completion V1 Completions Render Post"},
    ),
    ("/v1/responses/render", "post", "render_responses", "ResponsesRequest", _RENDER_ERRORS, _GENERATE),
    (
        "/v1/chat/completions/derender",
        "post",
        "derender_chat_completion",
        {
            "anyOf": [
                {"$ref": "#/components/schemas/DerenderChatRequest"},
                {"$ref": "#/components/schemas/DerenderChatStreamRequest"},
            ],
            "title": "Request",
        },
        ("400", "404", "500"),
        {},
    ),
    (
        "/v1/completions/derender",
        "post",
        "derender_completion",
        {
            "anyOf": [
                {"$ref": "#/components/schemas/DerenderCompletionRequest"},
                {"$ref": "#/components/schemas/DerenderCompletionStreamRequest"},
            ],
            "title": "Request",
        },
        ("400", "404", "500"),
        {},
    ),
)

# Bodies validated by code without a table yet: (name, required fields)
_UNTABLED = (
    ("AnthropicMessagesRequest", ("model", "messages", "max_tokens")),
    ("ResponsesRequest", ()),
)
_TABLES: tuple[Model, ...] = (
    requests.CHAT_COMPLETION_REQUEST,
    requests.COMPLETION_REQUEST,
    requests.TOKENIZE_COMPLETION_REQUEST,
    requests.TOKENIZE_CHAT_REQUEST,
    requests.DETOKENIZE_REQUEST,
    derender.DERENDER_CHAT_REQUEST,
    derender.DERENDER_CHAT_STREAM_REQUEST,
    derender.DERENDER_COMPLETION_REQUEST,
    derender.DERENDER_COMPLETION_STREAM_REQUEST,
)
# vLLM's GenerateRequest (token_in_token_out/protocol.py), the render routes' answer
_GENERATE_FIELDS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("request_id", {"type": "string"}, True),
    ("token_ids", {"type": "array", "items": {"type": "integer"}}, True),
    ("token_offsets", {"anyOf": [{"type": "array", "items": {"type": "array"}}, {"type": "null"}]}, False),
    ("features", {"anyOf": [{"type": "object"}, {"type": "null"}]}, False),
    ("content_parts", {"anyOf": [{"type": "array"}, {"type": "null"}]}, False),
    ("sampling_params", {"type": "object"}, True),
    ("model", {"anyOf": [{"type": "string"}, {"type": "null"}]}, False),
    ("reasoning_ended", {"anyOf": [{"type": "boolean"}, {"type": "null"}]}, False),
    ("reasoning_parser_kwargs", {"anyOf": [{"type": "object"}, {"type": "null"}]}, False),
    ("return_token_ids", {"anyOf": [{"type": "boolean"}, {"type": "null"}]}, False),
    ("output_mode", {"type": "string", "enum": ["tokens"]}, False),
    ("parse_context", {"anyOf": [{"type": "object"}, {"type": "null"}]}, False),
    ("stream", {"type": "boolean"}, False),
    ("stream_options", {"anyOf": [{"type": "object"}, {"type": "null"}]}, False),
    ("cache_salt", {"anyOf": [{"type": "string"}, {"type": "null"}]}, False),
    ("priority", {"type": "integer"}, False),
    ("kv_transfer_params", {"anyOf": [{"type": "object"}, {"type": "null"}]}, False),
    ("ec_transfer_params", {"anyOf": [{"type": "object"}, {"type": "null"}]}, False),
)


_NON_WORD = re.compile(r"\W")


def _title(name: str) -> str:
    """FastAPI's (pydantic's) default title for a field or endpoint name."""
    return " ".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def _operation_id(name: str, path: str, method: str) -> str:
    return f"{name}{_NON_WORD.sub('_', path)}_{method}"


def _component(model: Model) -> dict[str, Any]:
    """A table as FastAPI's component schema: properties, extra keys allowed, required, title."""
    properties: dict[str, Any] = {}
    required = []
    for spec in model.fields:
        prop = dict(spec.type.json_schema(), title=_title(spec.name))
        if spec.default is REQUIRED:
            required.append(spec.name)
        elif spec.default is None or isinstance(spec.default, (str, int, float, bool, list)):
            if spec.default is not None:
                prop["default"] = spec.default
        properties[spec.name] = prop
    schema: dict[str, Any] = {"properties": properties}
    if model.kind == "model":
        schema["additionalProperties"] = True
    schema["type"] = "object"
    if required:
        schema["required"] = required
    schema["title"] = model.name
    return schema


def _components() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for table in _TABLES:
        for name, model in table.models().items():
            schemas.setdefault(name, _component(model))
    for name, required in _UNTABLED:
        schema: dict[str, Any] = {"properties": {}, "additionalProperties": True, "type": "object"}
        if required:
            schema["required"] = list(required)
        schemas[name] = dict(schema, title=name)
    schemas["GenerateRequest"] = {
        "properties": {name: dict(prop, title=_title(name)) for name, prop, _ in _GENERATE_FIELDS},
        "type": "object",
        "required": [name for name, _, req in _GENERATE_FIELDS if req],
        "title": "GenerateRequest",
    }
    schemas["ErrorInfo"] = {
        "properties": {
            "message": {"type": "string", "title": "Message"},
            "type": {"type": "string", "title": "Type"},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Param"},
            "code": {"type": "integer", "title": "Code"},
        },
        "additionalProperties": True,
        "type": "object",
        "required": ["message", "type", "code"],
        "title": "ErrorInfo",
    }
    schemas["ErrorResponse"] = {
        "properties": {"error": {"$ref": "#/components/schemas/ErrorInfo"}},
        "additionalProperties": True,
        "type": "object",
        "required": ["error"],
        "title": "ErrorResponse",
    }
    schemas["HTTPValidationError"] = {
        "properties": {
            "detail": {"items": {"$ref": "#/components/schemas/ValidationError"}, "type": "array", "title": "Detail"}
        },
        "type": "object",
        "title": "HTTPValidationError",
    }
    schemas["ValidationError"] = {
        "properties": {
            "loc": {
                "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "type": "array",
                "title": "Location",
            },
            "msg": {"type": "string", "title": "Message"},
            "type": {"type": "string", "title": "Error Type"},
            "input": {"title": "Input"},
            "ctx": {"type": "object", "title": "Context"},
        },
        "type": "object",
        "required": ["loc", "msg", "type"],
        "title": "ValidationError",
    }
    return dict(sorted(schemas.items()))


def _operation(name: str, path: str, method: str, body: Any, errors: tuple[str, ...], ok: Any) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": _title(name), "operationId": _operation_id(name, path, method)}
    if body is not None:
        schema = {"$ref": f"#/components/schemas/{body}"} if isinstance(body, str) else body
        operation["requestBody"] = {"content": {"application/json": {"schema": schema}}, "required": True}
    responses: dict[str, Any] = {"200": {"description": "Successful Response"}}
    if ok is not None:
        responses["200"]["content"] = {"application/json": {"schema": ok}}
    for status in errors:
        responses[status] = {"description": _PHRASES[status], **_ERROR}
    if body is not None:
        responses["422"] = {
            "description": "Validation Error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
        }
    operation["responses"] = responses
    return operation


@cache
def openapi_document() -> dict[str, Any]:
    """The whole description (built once: the tables do not change at run time)."""
    paths: dict[str, dict[str, Any]] = {}
    for path, method, name, body, errors, ok in _OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(name, path, method, body, errors, ok)
    return {
        "openapi": "3.1.0",
        "info": {"title": "FastAPI", "version": "0.1.0"},
        "paths": paths,
        "components": {"schemas": _components()},
    }


async def openapi_endpoint(request: Request) -> JSONResponse:
    """`GET /openapi.json` (unauthenticated, as FastAPI serves it)."""
    return JSONResponse(openapi_document())
