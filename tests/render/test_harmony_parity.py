"""gpt-oss (Harmony) parity with vLLM 0.33.0: every golden in golden_harmony/ replayed on our app.

The goldens were recorded by record_harmony.py from `vllm launch render` on the same tiny
gpt-oss folder (real o200k_harmony vocabulary), with VLLM_SYSTEM_START_DATE pinned on both
sides. Render responses are compared field by field; derender streams carry our own
`stream_state` from call to call (as in tests/parity/test_derender_parity.py), and tool-call ids
are masked (ours are deterministic, vLLM's random).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service import VLLM_VERSION
from render_service.server.app import create_app
from render_service.settings import Settings
from tests.parity.corpus import compare_response, send
from tests.parity.derender_corpus import compare_call, with_state

from .harmony_corpus import CONFIGS, DERENDER_CASES, GOLDEN_DIR, RENDER_CASES, START_DATE
from .record_harmony import derender_calls, output_ids

GOLDENS = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(GOLDEN_DIR.glob("*.json"))]
RENDER_GOLDENS = [g for g in GOLDENS if "calls" not in g]
DERENDER_GOLDENS = [g for g in GOLDENS if "calls" in g]

ClientFactory = Callable[[str], TestClient]


@pytest.fixture(scope="module")
def harmony_client(gpt_oss_model_dir: Path) -> Iterator[ClientFactory]:
    """`get(config) -> TestClient` on the tiny gpt-oss folder, the start date pinned as recorded."""
    previous = os.environ.get("VLLM_SYSTEM_START_DATE")
    os.environ["VLLM_SYSTEM_START_DATE"] = START_DATE
    clients: dict[str, TestClient] = {}
    try:
        with ExitStack() as stack:

            def get(name: str) -> TestClient:
                if name not in clients:
                    settings = Settings(**CONFIGS[name].settings_kwargs(gpt_oss_model_dir)).validate()
                    clients[name] = stack.enter_context(TestClient(create_app(settings), raise_server_exceptions=False))
                return clients[name]

            yield get
    finally:
        if previous is None:
            os.environ.pop("VLLM_SYSTEM_START_DATE", None)
        else:
            os.environ["VLLM_SYSTEM_START_DATE"] = previous


def test_goldens_match_corpus(gpt_oss_model_dir: Path) -> None:
    """Every corpus case has a golden recorded from the same request (re-run record_harmony.py)."""
    goldens = {g["case"]: g for g in GOLDENS}
    names = {c.name for c in RENDER_CASES} | {c.name for c in DERENDER_CASES}
    assert sorted(names - set(goldens)) == [] and sorted(set(goldens) - names) == []
    for case in RENDER_CASES:
        assert goldens[case.name]["request"] == case.request(), case.name
    for dcase in DERENDER_CASES:
        golden = goldens[dcase.name]
        assert golden["output_token_ids"] == output_ids(gpt_oss_model_dir, dcase.output), dcase.name
        specs = derender_calls(dcase, golden["render"]["prompt_token_ids"], golden["output_token_ids"])
        recorded = [c for c in golden["calls"]]
        assert len(specs) == len(recorded), dcase.name
        for spec, call in zip(specs, recorded, strict=True):
            body = {k: v for k, v in call["request"]["json"].items() if k != "stream_state"}
            assert body == spec["request"]["json"] and spec["state_source"] == call["state_source"], dcase.name
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


@pytest.mark.parametrize("golden", RENDER_GOLDENS, ids=[g["case"] for g in RENDER_GOLDENS])
def test_harmony_render_parity(golden: dict[str, Any], harmony_client: ClientFactory, gpt_oss_model_dir: Path) -> None:
    status, body = send(harmony_client(golden["config"]), golden["request"])
    diffs = compare_response(
        golden["request"],
        golden["status"],
        golden["response"],
        status,
        body,
        expected_model_dir=golden["model_dir"],
        actual_model_dir=str(gpt_oss_model_dir),
    )
    assert not diffs, f"{golden['case']}: ours vs vLLM 0.33\n  " + "\n  ".join(diffs)


@pytest.mark.parametrize("golden", DERENDER_GOLDENS, ids=[g["case"] for g in DERENDER_GOLDENS])
def test_harmony_derender_parity(golden: dict[str, Any], harmony_client: ClientFactory) -> None:
    client = harmony_client(golden["config"])
    state: Any = None
    failures = []
    for index, call in enumerate(golden["calls"]):
        request = copy.deepcopy(call["request"])
        if call["state_source"] == "previous" and state is not None:
            request["json"] = with_state(request["json"], state)
        status, body = send(client, request)
        if status == 200 and isinstance(body, dict) and "stream_state" in body:
            state = body["stream_state"]
        diffs = compare_call(request, call["status"], call["response"], status, body)
        if diffs:
            failures.append(f"call {index}: " + "; ".join(diffs[:4]))
    assert not failures, f"{golden['case']}: ours vs vLLM 0.33\n  " + "\n  ".join(failures[:8])
