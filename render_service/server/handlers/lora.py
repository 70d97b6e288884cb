"""vLLM's runtime LoRA endpoints, mounted only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (as vLLM does):
POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter, with vLLM's bodies, checks, messages
and status codes. Success is vLLM's plain-text 200 ("Success: LoRA adapter 'x' added successfully.").

A load here checks the name and that the path holds an adapter (see `model.lora`); it does not
load weights (there are none on a render tier): load the same adapter on the engines too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from render_service.exceptions import RequestValidationError
from render_service.server.body import object_body
from render_service.server.middleware import json_endpoint
from render_service.server.state import State

logger = logging.getLogger("render_service.server.app")

# pydantic's lax bool: these strings (any case) and the ints 0/1.
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


@json_endpoint("load_lora_adapter")
async def load_lora_adapter(state: State, request: Request, body: Any) -> Response:
    """vLLM's `LoadLoRAAdapterRequest`: `lora_name`, `lora_path`, `load_inplace`, `is_3d_lora_weight`."""
    fields = _validate(
        object_body(body),
        required=("lora_name", "lora_path"),
        booleans=("load_inplace", "is_3d_lora_weight"),
    )
    name, path = fields["lora_name"], fields["lora_path"]
    # Off the event loop: the path check reads the file system (or the HF cache / hub).
    await asyncio.to_thread(state.adapters.load, name, path, load_inplace=fields["load_inplace"])
    logger.info("Loaded new LoRA adapter: name '%s', path '%s'", name, path)
    return Response(f"Success: LoRA adapter '{name}' added successfully.", status_code=200)


@json_endpoint("unload_lora_adapter")
async def unload_lora_adapter(state: State, request: Request, body: Any) -> Response:
    """vLLM's `UnloadLoRAAdapterRequest`: `lora_name` (and an ignored optional `lora_int_id`)."""
    fields = _validate(object_body(body), required=("lora_name",), integers=("lora_int_id",))
    name = fields["lora_name"]
    await asyncio.to_thread(state.adapters.unload, name)
    logger.info("Removed LoRA adapter: name '%s'", name)
    return Response(f"Success: LoRA adapter '{name}' removed successfully.", status_code=200)


def _validate(
    body: dict[str, Any],
    *,
    required: tuple[str, ...],
    booleans: tuple[str, ...] = (),
    integers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The fields, checked as pydantic checks the request model (lax mode): every error reported, in
    field order, in vLLM's validation-error shape; unknown keys ignored."""
    errors: list[dict[str, Any]] = []
    fields: dict[str, Any] = {}
    for name in required:
        if name not in body:
            errors.append(_error("missing", name, "Field required", body))
        elif not isinstance(body[name], str):
            errors.append(_error("string_type", name, "Input should be a valid string", body[name]))
        else:
            fields[name] = body[name]
    for name in booleans:
        value = body.get(name, False)
        if isinstance(value, bool):
            fields[name] = value
        elif isinstance(value, int) and value in (0, 1):
            fields[name] = bool(value)
        elif isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            fields[name] = value.lower() in _TRUE
        elif isinstance(value, str | int | float):
            errors.append(_error("bool_parsing", name, "Input should be a valid boolean, unable to interpret", value))
        else:
            errors.append(_error("bool_type", name, "Input should be a valid boolean", value))
    for name in integers:
        value = body.get(name)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            fields[name] = value
        elif isinstance(value, float) and value.is_integer():
            fields[name] = int(value)
        elif isinstance(value, float):
            errors.append(
                _error(
                    "int_from_float",
                    name,
                    "Input should be a valid integer, got a number with a fractional part",
                    value,
                )
            )
        elif isinstance(value, str):
            try:
                fields[name] = int(value.strip())
            except ValueError:
                errors.append(
                    _error(
                        "int_parsing",
                        name,
                        "Input should be a valid integer, unable to parse string as an integer",
                        value,
                    )
                )
        else:
            errors.append(_error("int_type", name, "Input should be a valid integer", value))
    if errors:
        count = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}"
        raise RequestValidationError(f"{count}:\n  " + "\n  ".join(map(str, errors)), param=errors[0]["loc"])
    return fields


def _error(kind: str, name: str, message: str, value: Any) -> dict[str, Any]:
    """One pydantic error as vLLM's handler prints it (containers shown by their size)."""
    return {"type": kind, "loc": f"body.{name}", "msg": message, "input": _shown(value)}


def _shown(value: Any) -> Any:
    """pydantic's input summary in vLLM's validation handler: containers by size, long strings cut."""
    if isinstance(value, list | tuple | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "...[truncated]"
    return value
