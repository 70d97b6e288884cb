"""Parity with vLLM 0.33.0 for the DeepSeek V3/V3.1 parser families (golden_parsers/, recorded by
record_families.py from `vllm launch render` on the fixture folders of tests/parsers/families/).

Render goldens are compared field by field (request ids and `created` aside, as the render suite
does). Derender goldens are replayed as test_derender_parity.py replays its own: stream calls carry
OUR stream_state, every vLLM key must match, tool-call ids follow our deterministic format (a family's
native ids, e.g. Kimi's `functions.NAME:N`, must match exactly).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.parsers import deliberate

from .corpus import VLLM_VERSION, compare_response, send
from .derender_corpus import ToolIdTracker, compare_call, stream_lane, with_state
from .family_corpus import FAMILY_CONFIGS, MODEL_FAMILIES, build_corpus_from_dirs, iter_goldens

GOLDENS: list[dict[str, Any]] = iter_goldens()
# batch goldens by case: the answer a stream golden's deliberate difference accumulates to
_BATCH: dict[str, dict[str, Any]] = {
    g["case"]: g["calls"][0]["response"] for g in GOLDENS if g["kind"] == "batch" and g["calls"][0]["status"] == 200
}
_NATIVE_ID = re.compile(r"'functions\.[^']*' is not chatcmpl-tool-")


@pytest.fixture(scope="session")
def family_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parser-families")
    return {name: family.builder(root / name) for name, family in MODEL_FAMILIES.items()}


@pytest.fixture(scope="module")  # its apps (one loaded model each) end with the module
def family_client(family_model_dirs: dict[str, Path]) -> Iterator[Callable[[str], TestClient]]:
    clients: dict[str, TestClient] = {}
    with ExitStack() as stack:

        def get(config_name: str) -> TestClient:
            if config_name not in clients:
                config = FAMILY_CONFIGS[config_name]
                settings = Settings(**config.settings_kwargs(family_model_dirs[config.family])).validate()
                clients[config_name] = stack.enter_context(
                    TestClient(create_app(settings), raise_server_exceptions=False)
                )
            return clients[config_name]

        yield get


def test_goldens_match_corpus(family_model_dirs: dict[str, Path]) -> None:
    corpus = build_corpus_from_dirs(family_model_dirs)
    names = {r.name for r in corpus.renders} | {c.name for c in corpus.cases}
    recorded = {g["case"] for g in GOLDENS}
    assert names == recorded, f"re-record: missing={sorted(names - recorded)} stale={sorted(recorded - names)}"
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_family_parity(golden: dict[str, Any], family_client: Callable[[str], TestClient]) -> None:
    client = family_client(golden["config"])
    failures: list[str] = []
    if golden["kind"] == "render":
        call = golden["calls"][0]
        status, body = send(client, copy.deepcopy(call["request"]))
        failures += compare_response(call["request"], call["status"], call["response"], status, body)
        assert not failures, "\n".join([golden["case"], *failures[:20]])
        return
    tracker = ToolIdTracker()
    our_states: dict[int, Any] = {}
    ours: list[Any] = []
    raw_diffs: list[str] = []
    for i, call in enumerate(golden["calls"]):
        request = copy.deepcopy(call["request"])
        lane = stream_lane(request["json"])
        if call["state_source"] == "previous" and lane in our_states:
            request["json"] = with_state(request["json"], our_states[lane])
        status, body = send(client, request)
        if golden["kind"] == "stream" and status == 200 and isinstance(body, dict) and "stream_state" in body:
            our_states[lane] = body["stream_state"]
        diffs = compare_call(request, call["status"], call["response"], status, body)
        if status == 200:
            # a family's native ids (Kimi's `functions.NAME:N`) are compared verbatim above
            diffs += [d for d in tracker.check(body, lane) if not _NATIVE_ID.search(d)]
        failures += [f"call {i}: {d}" for d in diffs]
        raw_diffs += diffs
        ours.append(body)
    held = deliberate.held(FAMILY_CONFIGS[golden["config"]].tool_call_parser) if golden["kind"] == "stream" else None
    if failures and held is not None and not deliberate.not_held_diffs(raw_diffs):
        # a deliberate difference: our calls arrive whole at the end (deliberate.HELD_CALLS)
        batch = _BATCH.get(deliberate.batch_twin(golden["case"]))
        problem = deliberate.check_e2e_held(held, ours, [c["response"] for c in golden["calls"]], batch)
        failures = [] if problem is None else [problem, *failures]
    elif failures and golden["kind"] == "stream":
        # a deliberate difference: vLLM's stream does not accumulate to its batch twin, ours does
        twin = _BATCH.get(deliberate.batch_twin(golden["case"]))
        if twin is None:  # no batch golden recorded: our batch answer on the same output
            _, twin = send(
                client,
                {
                    "method": "POST",
                    "path": golden["calls"][0]["request"]["path"],
                    "headers": {},
                    "json": deliberate.batch_request_from_stream([c["request"]["json"] for c in golden["calls"]]),
                },
            )
        problem = deliberate.check_e2e_stream(
            golden["case"],
            ours,
            [c["response"] for c in golden["calls"]],
            twin,
            FAMILY_CONFIGS[golden["config"]].tool_call_parser,
        )
        failures = [] if problem is None else [problem, *failures]
    elif golden["case"] in deliberate.E2E_CASES:
        failures.append("listed in deliberate.E2E_CASES but equal to vLLM's stream: drop it from the list")
    assert not failures, "\n".join([golden["case"], *failures[:20]])
