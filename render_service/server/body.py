"""Request bodies: read within the size limit, parse as JSON, report failures as FastAPI does."""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from render_service.api.schema import Loc, error, validation_error
from render_service.exceptions import PayloadTooLargeError, RequestValidationError


async def read_body(scope: Scope, receive: Receive, limit: int) -> Any:
    """The parsed body of the request in `scope`: 400 for a non-JSON content type or body, 413
    past `limit` bytes. Read from the ASGI channel (no Request object: this is every JSON
    request's path)."""
    return parse_json(await read_raw_body(scope, receive, limit))


async def read_raw_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """`read_body`'s bytes, not yet parsed (`parse_json`): 400 for a non-JSON content type, 413
    past `limit` bytes."""
    content_type = declared = None
    for name, value in scope["headers"]:  # the first of each, as Starlette's Headers.get
        if name == b"content-type":
            if content_type is None:
                content_type = value
        elif name == b"content-length" and declared is None:
            declared = value
    media_type = (content_type or b"").decode("latin-1").lower().split(";", 1)[0].strip()
    if media_type != "application/json":
        raise RequestValidationError(
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
        )
    if declared is not None:
        length = declared.decode("latin-1")
        if length.isdigit() and int(length) > limit:
            raise PayloadTooLargeError(f"Request body of {length} bytes exceeds the limit of {limit} bytes.")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """A request body's JSON, or FastAPI's 400 for one that is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _json_error(raw, exc) from None


def _json_error(raw: bytes, parse_error: orjson.JSONDecodeError) -> RequestValidationError:
    """FastAPI's report of a body that is not JSON: stdlib json's message and offset."""
    if parse_error.msg.startswith("depth limit exceeded"):
        # orjson's bound (1024 levels); the stdlib would recurse until its own limit.
        reason, position = "JSON nested deeper than 1024 levels", parse_error.pos
    else:
        try:
            json.loads(raw)
            reason, position = "Invalid JSON", 0
        except json.JSONDecodeError as exc:
            reason, position = exc.msg, exc.pos
        except UnicodeDecodeError:
            reason, position = "Invalid UTF-8", 0
        except (RecursionError, ValueError):  # e.g. an integer of more than 4300 digits
            reason, position = parse_error.msg, parse_error.pos
    detail = {
        "type": "json_invalid",
        "loc": f"body.{position}",
        "msg": "JSON decode error",
        "input": "<dict of 0 items>",
        "ctx": {"error": reason},
    }
    return RequestValidationError(f"1 validation error:\n  {detail}", param=f"body.{position}")


def object_body(body: Any) -> dict[str, Any]:
    """The body as a JSON object, or pydantic's error for a model given something else (FastAPI
    reports a JSON `null` body as a missing one)."""
    if not isinstance(body, dict):
        raise validation_error([not_an_object(body, ("body",))])
    return body


def not_an_object(body: Any, loc: Loc) -> dict[str, Any]:
    """The error of a model at `loc` given `body`, which is not a JSON object."""
    if body is None:
        return error("missing", ("body",), "Field required", None)
    return error(
        "model_attributes_type", loc, "Input should be a valid dictionary or object to extract fields from", body
    )
