"""Derender request validation, error for error, against vLLM 0.33's answers.

Replays tests/api/golden/derender_schema.json (bodies from derender_corpus.py, answers recorded
from vLLM's render tier by record_derender_schema.py) against our app: status, and for errors the
whole error object (every error pydantic lists for the `batch | stream` union, in its order, with
`param`); 2xx answers are compared field by field as the parity tests do. Where vLLM fails inside
its app (a 500 or a dropped connection) ours must be a 4xx.
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
from tests.api.derender_corpus import GOLDEN, MEMBERS, cases, request
from tests.parity.corpus import CONFIGS, VLLM_VERSION, compare_response, send

# Ours only: vLLM has no check that the decode window's offsets lie inside it, and answers 200
# (its next call then refuses the negative read_offset it handed back).
OURS_ONLY = "stream_state offsets must satisfy prefix_offset <= read_offset <= len(prev_tokens)"


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
    assert recorded == json.loads(json.dumps(cases())), "re-record with python -m tests.api.record_derender_schema"


def test_derender_validation_matches_vllm(client: TestClient) -> None:
    failures = []
    golden = _golden()["cases"]
    for case in golden:
        req = request(case)
        status, body = send(client, req)
        if isinstance(body, dict) and isinstance(body.get("stream_state"), dict):  # ours adds rs_* keys
            body["stream_state"] = {k: v for k, v in body["stream_state"].items() if not k.startswith("rs_")}
        expected_status, expected = case["status"], case["response"]
        if expected_status == 0 or expected_status >= 500:
            if not 400 <= status < 500:
                failures.append(f"{case['body']}: vLLM fails ({expected_status}), ours {status} (want a 4xx)")
            continue
        if expected_status == 200 and status == 400 and OURS_ONLY in body["error"]["message"]:
            continue  # deliberate: vLLM decodes from an inconsistent window (README, parity table)
        diffs = compare_response(req, expected_status, expected, status, body)
        if 400 <= expected_status < 500 and status == expected_status and body != expected:
            diffs.append(f"error body: ours {body}, vLLM {expected}")
        if diffs:
            failures.append(f"{case['path']} {json.dumps(case['body'])[:300]}:\n    " + "\n    ".join(diffs))
    assert not failures, f"{len(failures)} of {len(golden)} differ:\n" + "\n".join(failures[:12])


@pytest.mark.parametrize(
    ("member", "extra"),
    [
        ("chat", {"generate_chunk": None}),
        ("chat", {"generate_chunk": {}}),
        ("chat", {"generate_responses": None}),
        ("completion", {"generate_chunk": None}),
        ("completion", {"generate_response": {}}),
    ],
)
def test_another_members_field_is_an_ignored_extra_key(client: TestClient, member: str, extra: dict[str, Any]) -> None:
    """The engine output is read from the member that matched: the other member's field names are
    extra keys, which vLLM's models ignore (they once crashed the echo step with a 500)."""
    path, _, base = MEMBERS[member]
    response = client.post(path, json={**base, **extra})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["index"] == 0
