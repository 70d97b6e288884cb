"""Request validation parity, error for error, with vLLM 0.33's pydantic models.

Replays the generated bad bodies of schema_corpus.py (recorded from vLLM by record_schema.py)
against our app and compares status, and for errors the whole error object: the full message
(every error pydantic lists, in its order, with `input` and `ctx`), `type`, `param` and `code`.
2xx answers are compared field by field as in test_render_parity. Where vLLM fails inside its
app (a 500 or a dropped connection: its validators read raw request values) ours must be a 4xx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

from .corpus import CONFIGS, VLLM_VERSION, compare_response, send
from .schema_corpus import GOLDEN_DIR, ROUTES, cases, request


def _golden(route: str) -> dict[str, Any]:
    return json.loads((GOLDEN_DIR / f"{route}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path) -> Iterator[TestClient]:
    settings = Settings(**CONFIGS["parsers"].settings_kwargs(qwen3_model_dir)).validate()
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.mark.parametrize("route", list(ROUTES))
def test_goldens_match_generator(route: str) -> None:
    golden = _golden(route)
    assert golden["vllm_version"] == VLLM_VERSION
    assert [c["body"] for c in golden["cases"]] == json.loads(json.dumps(cases(route))), (
        "re-record with tests/parity/record_schema.py"
    )


@pytest.mark.parametrize("route", list(ROUTES))
def test_schema_parity(route: str, client: TestClient) -> None:
    failures = []
    for case in _golden(route)["cases"]:
        req = request(route, case["body"])
        status, body = send(client, req)
        expected_status, expected = case["status"], case["response"]
        if expected_status == 0 or expected_status >= 500:
            if not 400 <= status < 500:
                failures.append(f"{case['body']}: vLLM fails ({expected_status}), ours {status} (want a 4xx)")
            continue
        diffs = compare_response(req, expected_status, expected, status, body)
        if 400 <= expected_status < 500 and status == expected_status and body != expected:
            diffs.append(f"error body: ours {body}, vLLM {expected}")
        if diffs:
            failures.append(f"{case['body']}:\n    " + "\n    ".join(diffs))
    assert not failures, f"{len(failures)} of {len(_golden(route)['cases'])} differ:\n" + "\n".join(failures[:15])
