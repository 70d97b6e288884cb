"""Derender parity of the Llama 3/4, pythonic, Granite and Nemotron parsers with vLLM 0.33.

Replays golden_parsers/<config>/<case>.json (record_parsers_llama.py, from `vllm launch render` on
the fixture folders of tests/parsers/families/llama.py with each config's parser flags) against
our app, exactly as test_derender_parity.py replays golden_derender/: batch calls as recorded,
stream calls carrying OUR stream_state, every field compared except `created` and tool-call ids
(ours must be `chatcmpl-tool-<16 hex>` and stable per call index).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.parsers import deliberate
from tests.parsers.families.llama import build_family

from .corpus import VLLM_VERSION, compare_response, send
from .derender_corpus import ToolIdTracker, compare_call, stream_lane, with_state
from .parsers_llama_corpus import (
    PARSER_CONFIGS,
    PARSER_FAMILIES,
    build_parser_corpus_from_dirs,
    iter_parser_goldens,
    iter_render_goldens,
    render_cases,
)

GOLDENS: list[dict[str, Any]] = list(iter_parser_goldens())
RENDER_GOLDENS: list[dict[str, Any]] = list(iter_render_goldens())
_GOLDENS_BY_CASE: dict[str, dict[str, Any]] = {g["case"]: g for g in GOLDENS}
# batch goldens by case: the answer a held-calls stream golden accumulates to
_BATCH: dict[str, dict[str, Any]] = {
    g["case"]: g["calls"][0]["response"] for g in GOLDENS if g["kind"] == "batch" and g["calls"][0]["status"] == 200
}


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parser_families")
    return {name: build_family(root / name, name) for name in PARSER_FAMILIES}


@pytest.fixture(scope="session")
def parser_client(family_dirs: dict[str, Path]) -> Iterator[Callable[[str], TestClient]]:
    clients: dict[str, TestClient] = {}
    with ExitStack() as stack:

        def get(config_name: str) -> TestClient:
            if config_name not in clients:
                config = PARSER_CONFIGS[config_name]
                settings = Settings(**config.settings_kwargs(family_dirs[config.family])).validate()
                clients[config_name] = stack.enter_context(
                    TestClient(create_app(settings), raise_server_exceptions=False)
                )
            return clients[config_name]

        yield get


def test_goldens_match_corpus(family_dirs: dict[str, Path]) -> None:
    """Every corpus case has a golden recorded from the same calls (re-run record_parsers_llama.py)."""
    cases = build_parser_corpus_from_dirs(family_dirs)
    by_name = {g["case"]: g for g in GOLDENS}
    assert not sorted(set(cases) - set(by_name)), "missing goldens"
    assert not sorted(set(by_name) - set(cases)), "stale goldens"
    for name, case in cases.items():
        golden = by_name[name]
        specs = case.build(golden["render"]["prompt_token_ids"])
        assert golden["config"] == case.config and len(specs) == len(golden["calls"]), name
        for spec, call in zip(specs, golden["calls"], strict=True):
            recorded = copy.deepcopy(call["request"])
            if spec["state_source"] == "previous":
                recorded["json"].pop("stream_state", None)
            assert spec["request"] == recorded, name
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_parser_family_parity(golden: dict[str, Any], parser_client: Callable[[str], TestClient]) -> None:
    client = parser_client(golden["config"])
    ours, failures = _replay(golden, client)
    config = PARSER_CONFIGS[golden["config"]]
    tool = config.tool_call_parser if config.enable_auto_tool_choice else None
    case = golden["case"]
    if failures and golden["kind"] == "batch" and len(ours) == 1 and isinstance(ours[0], dict):
        if case in deliberate.E2E_BATCH_CASES:
            # a deliberate batch difference (ACC.md rule 2): ours is what our stream twin sends
            streamed = deliberate.accumulate_chunks(_replay(_GOLDENS_BY_CASE[deliberate.stream_twin(case)], client)[0])
            mine = deliberate.message_view(ours[0])
            problem = (
                None if mine == streamed else f"{deliberate.E2E_BATCH_CASES[case]}: {mine} != our stream's {streamed}"
            )
            failures = [] if problem is None else [(-1, [problem])]
        elif tool in deliberate.BATCH_TOOLS:
            mine, theirs = deliberate.message_view(ours[0]), deliberate.message_view(golden["calls"][0]["response"])
            problem = deliberate.check_batch_tool(mine, theirs, deliberate.BATCH_TOOLS[tool])
            failures = [] if problem is None else [(-1, [problem])]
    held = deliberate.held(tool) if golden["kind"] == "stream" else None
    vllm = [c["response"] for c in golden["calls"]]
    if failures and held is not None and not any(deliberate.not_held_diffs(d) for _, d in failures):
        # a deliberate difference: our calls arrive whole at the end (deliberate.HELD_CALLS)
        twin = deliberate.batch_twin(case)
        # a twin listed as a deliberate batch difference: ours is what vLLM's stream accumulates to
        batch = None if twin in deliberate.E2E_BATCH_CASES else _BATCH.get(twin)
        problem = deliberate.check_e2e_held(held, ours, vllm, batch)
        failures = [] if problem is None else [(-1, [problem])]
    elif failures and golden["kind"] == "stream" and (case in deliberate.E2E_CASES or tool in deliberate.WHOLE_CALLS):
        # a listed deliberate stream difference: ours accumulates to the batch answer (ours
        # where our batch deliberately differs from vLLM's)
        twin = deliberate.batch_twin(case)
        if twin in deliberate.E2E_BATCH_CASES or tool in deliberate.BATCH_TOOLS:
            batch = _replay(_GOLDENS_BY_CASE[twin], client)[0][0] if twin in _GOLDENS_BY_CASE else None
        else:
            batch = _BATCH.get(twin)
        problem = deliberate.check_e2e_stream(case, ours, vllm, batch, tool_parser=tool)
        failures = [] if problem is None else [(-1, [problem])]
    cause = deliberate.E2E_PARSER_CASES.get(case) or deliberate.E2E_PARSER_BATCH_CASES.get(case)
    if failures and cause is not None:
        # a deliberate difference: ours accumulates to our batch answer (tests/parsers/deliberate.py)
        problem = _check_listed(client, golden, ours, cause)
        failures = [] if problem is None else [(-1, [problem])]
    assert not failures, "\n".join(
        [f"{case}: {len(failures)} of {len(golden['calls'])} call(s) differ from vLLM 0.33"]
        + [f"  call {i}: {d}" for i, ds in failures[:5] for d in ds[:6]]
    )


def _replay(golden: dict[str, Any], client: TestClient) -> tuple[list[Any], list[tuple[int, list[str]]]]:
    """Our responses to a golden's calls (stream calls carrying OUR stream_state) and, per call,
    how they differ from vLLM's."""
    tracker = ToolIdTracker()
    states: dict[int, Any] = {}
    failures: list[tuple[int, list[str]]] = []
    ours: list[Any] = []
    for i, call in enumerate(golden["calls"]):
        request = copy.deepcopy(call["request"])
        lane = stream_lane(request["json"])
        if call["state_source"] == "previous" and lane in states:
            request["json"] = with_state(request["json"], states[lane])
        status, body = send(client, request)
        if golden["kind"] == "stream" and status == 200 and isinstance(body, dict) and "stream_state" in body:
            states[lane] = body["stream_state"]
        diffs = compare_call(request, call["status"], call["response"], status, body)
        if status == 200:
            diffs += tracker.check(body, lane)
        if diffs:
            failures.append((i, diffs))
        ours.append(body)
    return ours, failures


def _check_listed(client: TestClient, golden: dict[str, Any], ours: list[Any], cause: str) -> str | None:
    """A golden listed in deliberate.E2E_PARSER_CASES / E2E_PARSER_BATCH_CASES."""
    case = golden["case"]
    if golden["kind"] == "batch":
        twin = next((g for g in GOLDENS if g["case"] == deliberate.stream_twin(case)), None)
        if twin is None:
            return f"{case}: no stream twin to check the deliberate batch difference against"
        return deliberate.check_e2e_parser_batch(cause, ours[0], _replay(twin, client)[0])
    batch_golden = next((g for g in GOLDENS if g["case"] == deliberate.batch_twin(case)), None)
    request = (
        copy.deepcopy(batch_golden["calls"][0]["request"])
        if batch_golden is not None
        else {
            "method": "POST",
            "path": golden["calls"][0]["request"]["path"],
            "headers": {},
            "json": deliberate.batch_request_from_stream([c["request"]["json"] for c in golden["calls"]]),
        }
    )
    _, our_batch = send(client, request)
    return deliberate.check_e2e_parser_stream(
        cause, ours, [c["response"] for c in golden["calls"]], _BATCH.get(deliberate.batch_twin(case)), our_batch
    )


def test_render_goldens_match_cases() -> None:
    recorded = {g["case"]: g for g in RENDER_GOLDENS}
    cases = {name: (config, body) for name, config, body in render_cases()}
    assert set(recorded) == set(cases), "re-record with record_parsers_llama.py --render"
    for name, (config, body) in cases.items():
        assert recorded[name]["config"] == config and recorded[name]["request"]["json"] == body, name


@pytest.mark.parametrize("golden", RENDER_GOLDENS, ids=[g["case"] for g in RENDER_GOLDENS])
def test_parser_family_render_parity(
    golden: dict[str, Any], parser_client: Callable[[str], TestClient], family_dirs: dict[str, Path]
) -> None:
    """The rendered GenerateRequest (skip_special_tokens, structural tags, JSON schemas for
    required/named, prompt ids) as vLLM 0.33 renders it with the family's parser flags."""
    status, body = send(parser_client(golden["config"]), golden["request"])
    model_dir = family_dirs[PARSER_CONFIGS[golden["config"]].family]
    diffs = compare_response(
        golden["request"],
        golden["status"],
        golden["response"],
        status,
        body,
        expected_model_dir=golden["model_dir"],
        actual_model_dir=str(model_dir),
    )
    assert not diffs, f"{golden['case']}: ours vs vLLM 0.33\n  " + "\n  ".join(diffs)
