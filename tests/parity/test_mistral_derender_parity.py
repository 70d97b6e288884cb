"""Derender parity of the `mistral` parsers with vLLM 0.33.0 (batch and chunked streams).

Replays golden_mistral_derender/ (recorded by `python -m tests.parity.mistral_derender`) against
our app on the same fixture folders and flags: every call's response must match vLLM's, except
`created`, tool-call ids (vLLM's are random), and the stream_state we carry besides vLLM's keys.
Our stream_state is echoed between calls (so every chunk exercises a snapshot round trip).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.mistral_fixture import build_mistral_model

from .corpus import VLLM_VERSION, send
from .derender_corpus import compare_call
from .mistral_derender import CASES, CONFIGS, GOLDEN_DIR, drive

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

GOLDENS: list[dict[str, Any]] = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(GOLDEN_DIR.glob("*.json"))]


@pytest.fixture(scope="module")
def client_for(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], TestClient]]:
    clients: dict[str, TestClient] = {}
    with ExitStack() as stack:

        def get(config_name: str) -> TestClient:
            if config_name not in clients:
                config = CONFIGS[config_name]
                model_dir = build_mistral_model(tmp_path_factory.mktemp(config.family), config.family)
                settings = Settings(**config.settings_kwargs(model_dir)).validate()
                clients[config_name] = stack.enter_context(
                    TestClient(create_app(settings), raise_server_exceptions=False)
                )
            return clients[config_name]

        yield get


def test_goldens_match_cases() -> None:
    assert sorted(g["case"] for g in GOLDENS) == sorted(CASES), "re-record: python -m tests.parity.mistral_derender"
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_mistral_derender_parity(golden: dict[str, Any], client_for: Callable[[str], TestClient]) -> None:
    client = client_for(golden["config"])
    recorded = golden["calls"]
    calls = [{"stream": c["stream"], "json": _without_state(c)} for c in recorded]
    ours = drive(calls, lambda request: send(client, request))
    problems = []
    for i, (theirs, mine) in enumerate(zip(recorded, ours, strict=True)):
        diffs = compare_call(mine["request"], theirs["status"], theirs["response"], mine["status"], mine["response"])
        problems += [f"call {i}: {d}" for d in diffs]
    assert not problems, f"{golden['case']}: ours vs vLLM 0.33\n  " + "\n  ".join(problems[:40])


def _without_state(call: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in call["request"]["json"].items() if k != "stream_state"}
