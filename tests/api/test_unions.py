"""The union-typed fields (chat `messages`, Responses `input`/`tools`/`tool_choice`/`text`)
against vLLM 0.33's answers (tests/api/golden/unions.json, recorded by record_unions.py): every
error pydantic lists for openai's unions, in its order, byte for byte; 2xx answers field by field.
The cases where ours still differs are listed, with the reason, in union_corpus.KNOWN_DIFFERENT:
there ours must be a 4xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.api.union_corpus import GOLDEN, cases, known_different, request
from tests.parity.corpus import CONFIGS, VLLM_VERSION, compare_response, send


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def client(qwen3_model_dir: Path) -> Iterator[TestClient]:
    settings = Settings(**CONFIGS["parsers"].settings_kwargs(qwen3_model_dir)).validate()
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def test_golden_matches_corpus() -> None:
    golden = _golden()
    assert golden["vllm_version"] == VLLM_VERSION
    recorded = [{"path": c["path"], "body": c["body"]} for c in golden["cases"]]
    assert recorded == json.loads(json.dumps(cases())), "re-record with python -m tests.api.record_unions"


def test_union_fields_match_vllm(client: TestClient) -> None:
    failures = []
    golden = _golden()["cases"]
    for case in golden:
        req = request(case)
        status, body = send(client, req)
        if known_different(case):
            if not 400 <= status < 500:
                failures.append(f"{case['body']}: ours {status}, want a 4xx ({known_different(case)})")
            continue
        expected_status, expected = case["status"], case["response"]
        if expected_status == 0 or expected_status >= 500:
            if not 400 <= status < 500:
                failures.append(f"{case['body']}: vLLM fails ({expected_status}), ours {status} (want a 4xx)")
            continue
        diffs = compare_response(req, expected_status, expected, status, body)
        if 400 <= expected_status < 500 and status == expected_status and body != expected:
            diffs.append(f"error body: ours {body}, vLLM {expected}")
        if diffs:
            failures.append(f"{case['path']} {json.dumps(case['body'])[:300]}:\n    " + "\n    ".join(diffs))
    assert not failures, f"{len(failures)} of {len(golden)} differ:\n" + "\n".join(failures[:12])
