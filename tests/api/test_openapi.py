"""/openapi.json: generated from the request tables, shaped as vLLM's (FastAPI's) description.

openapi_vllm.json holds, from vLLM 0.33's own /openapi.json, the paths and, for every request
model we have a table for, its property names in declaration order and its required fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from starlette.routing import Route
from starlette.testclient import TestClient

from render_service.api.openapi import openapi_document
from render_service.server.app import create_app
from render_service.settings import Settings

VLLM = json.loads((Path(__file__).with_name("openapi_vllm.json")).read_text(encoding="utf-8"))
# pydantic dataclass internals vLLM's description shows (`_backend`...): not request fields
PRIVATE = {"_backend", "_backend_was_auto"}


def test_tables_list_vllm_fields_in_declaration_order() -> None:
    ours = openapi_document()["components"]["schemas"]
    for name, expected in VLLM["components"].items():
        assert name in ours, name
        assert list(ours[name]["properties"]) == [p for p in expected["properties"] if p not in PRIVATE], name
        assert ours[name].get("required", []) == expected["required"], name


def test_paths_are_vllms_and_served(qwen3_model_dir: Path) -> None:
    document = openapi_document()
    for path, methods in document["paths"].items():
        assert path in VLLM["paths"], path
        assert set(methods) <= set(VLLM["paths"][path]), path
    settings = Settings(model=str(qwen3_model_dir), served_model_name=["m"]).validate()
    app = create_app(settings)
    served = {(r.path, m.lower()) for r in app.routes if isinstance(r, Route) for m in r.methods or ()}
    described = {(p, m) for p, methods in document["paths"].items() for m in methods}
    assert described <= served
    posts = {(p, m) for p, m in served if m == "post"}
    assert posts <= described, posts - described
    with TestClient(app) as client:
        response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.json() == json.loads(json.dumps(document))
    assert response.json()["openapi"] == "3.1.0"
