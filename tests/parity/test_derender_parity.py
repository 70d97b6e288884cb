"""Derender parity with vLLM 0.33.0's render tier (`/v1/chat/completions/derender`, `/v1/completions/derender`).

`test_derender_parity` replays every golden of golden_derender/ (written by record_derender.py from the
real `vllm launch render`) against our app, one app per server config, with the same Settings mapping as
the render suite. Batch cases send the recorded request. Stream cases send the recorded calls in order
but carry OUR state: each call whose recorded state was echoed from the previous call of the same
choice index gets the stream_state our app returned for that previous call (our state may carry extra
`rs_*` keys), while crafted states (error cases) are sent as recorded. Compared, per call:

* status; for 2xx every field, value kind and key order, except `created` and tool-call ids. vLLM's
  ids are random: ours must be `chatcmpl-tool-<16 hex>`, and a tool call keeps one id for the whole
  stream (stream_state.last_tool_call_ids agreeing);
* stream_state: every key vLLM returns, exactly (value, kind, order); our `rs_*` keys are ignored;
* errors: status, `type`, `param`, `code`, and `message` exactly for BadRequestError / NotFoundError
  (for pydantic "Bad Request" errors only the "N validation error(s)" prefix).

`test_cross_implementation_continuation` sends vLLM's own recorded stream_state (no `rs_*` keys) at
mid-stream calls and expects our chunk and state to equal vLLM's next response: a stream may move from
a vLLM render replica to ours (or back) between two chunks. There the ids vLLM pinned in the state must
come back verbatim.

`test_live_derender_parity` (marker `live`; RENDER_LIVE_PARITY=1 and a vLLM 0.33 env) drives every case
against a freshly started oracle and our app side by side instead of the goldens.
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

from .corpus import CONFIGS, VLLM_VERSION, Oracle, send
from .derender_corpus import (
    GOLDEN_DIR,
    DerenderCase,
    ToolIdTracker,
    build_corpus_from_dirs,
    compare_call,
    drive,
    iter_goldens,
    prompt_ids_from_render,
    stream_lane,
    with_state,
)

GOLDENS: list[dict[str, Any]] = list(iter_goldens())
GOLDEN_BY_NAME = {g["case"]: g for g in GOLDENS}


def _held_calls(config_name: str) -> str | None:
    """The held-calls cause of a config's tool parser (`deliberate.HELD_CALLS`): its calls arrive
    whole at the end of the stream, so its stream goldens differ from vLLM's by holding back."""
    config = CONFIGS[config_name]
    return deliberate.held(config.tool_call_parser) if config.enable_auto_tool_choice else None


def _batch_twin(case: str) -> dict[str, Any] | None:
    golden = GOLDEN_BY_NAME.get(deliberate.batch_twin(case))
    if golden is None or golden["kind"] != "batch" or golden["calls"][0]["status"] != 200:
        return None
    return golden["calls"][0]["response"]


MAX_REPORTED_CALLS = 6
GOLDEN_BUDGET_BYTES = 40 << 20

ClientFactory = Callable[[str], TestClient]


@pytest.fixture(scope="module")  # its apps (one loaded model each) end with the module
def derender_client(request: pytest.FixtureRequest) -> Iterator[ClientFactory]:
    """`get(config_name) -> TestClient`: one app per config (render suite's Settings mapping)."""
    clients: dict[str, TestClient] = {}
    with ExitStack() as stack:

        def get(config_name: str) -> TestClient:
            if config_name not in clients:
                config = CONFIGS[config_name]
                model_dir: Path = request.getfixturevalue(f"{config.family}_model_dir")
                settings = Settings(**config.settings_kwargs(model_dir)).validate()
                clients[config_name] = stack.enter_context(
                    TestClient(create_app(settings), raise_server_exceptions=False)
                )
            return clients[config_name]

        yield get


@pytest.fixture(scope="session")
def derender_cases(qwen3_model_dir: Path, deepseek_model_dir: Path) -> dict[str, DerenderCase]:
    return build_corpus_from_dirs({"qwen3": qwen3_model_dir, "deepseek": deepseek_model_dir})


def _report(case: str, config: str, failures: list[tuple[int, list[str]]], total: int, what: str) -> str:
    lines = [f"{case} ({config}): {len(failures)} of {total} call(s) differ from {what}"]
    for i, diffs in failures[:MAX_REPORTED_CALLS]:
        lines.append(f"  call {i}:")
        lines += [f"    {d}" for d in diffs[:12]]
        if len(diffs) > 12:
            lines.append(f"    ... {len(diffs) - 12} more")
    if len(failures) > MAX_REPORTED_CALLS:
        lines.append(f"  ... and {len(failures) - MAX_REPORTED_CALLS} more call(s)")
    return "\n".join(lines)


# -- the corpus and its goldens ----------------------------------------------------------------------


def test_goldens_match_corpus(derender_cases: dict[str, DerenderCase]) -> None:
    """Every corpus case has a golden recorded from the same calls (re-run record_derender.py otherwise)."""
    missing = sorted(set(derender_cases) - set(GOLDEN_BY_NAME))
    stale = sorted(set(GOLDEN_BY_NAME) - set(derender_cases))
    changed: list[str] = []
    for name, case in derender_cases.items():
        golden = GOLDEN_BY_NAME.get(name)
        if golden is None:
            continue
        specs = case.build(golden["render"]["prompt_token_ids"])
        same = (
            golden["config"] == case.config
            and golden["kind"] == case.kind
            and golden["endpoint"] == case.endpoint
            and golden["render"]["request"] == case.render_request()
            and len(specs) == len(golden["calls"])
        )
        for spec, call in zip(specs, golden["calls"], strict=False):
            recorded = copy.deepcopy(call["request"])
            if spec["state_source"] == "previous":
                recorded["json"].pop("stream_state", None)
            same = same and spec["state_source"] == call["state_source"] and spec["request"] == recorded
        if not same:
            changed.append(name)
    assert not (missing or stale or changed), (
        f"re-record with tests/parity/record_derender.py: missing={missing} stale={stale} changed={changed}"
    )
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


def test_golden_size_budget() -> None:
    size = sum(p.stat().st_size for p in GOLDEN_DIR.glob("*.json"))
    assert size < GOLDEN_BUDGET_BYTES, f"golden_derender/ is {size >> 20} MiB"


# -- replay ---------------------------------------------------------------------------------------------------

# Where we differ from vLLM on purpose (README, "Where we differ"): case -> (our status, why).
_GOLDEN_BY_CASE: dict[str, dict[str, Any]] = {g["case"]: g for g in GOLDENS}

DELIBERATE_DIFFERENCES = {
    "cmpl_stream_out_of_vocab_delta": (
        400,
        "token ids outside the vocabulary are refused before any work (vLLM decodes them to an empty string)",
    ),
    "stream_state_out_of_vocab": (
        400,
        "stream_state output ids outside the vocabulary are refused before a "
        "replay decodes them (vLLM decodes them to an empty string)",
    ),
}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_derender_parity(golden: dict[str, Any], derender_client: ClientFactory) -> None:
    client = derender_client(golden["config"])
    if golden["case"] in DELIBERATE_DIFFERENCES:
        expected_status, _why = DELIBERATE_DIFFERENCES[golden["case"]]
        status, body = send(client, copy.deepcopy(golden["calls"][-1]["request"]))
        assert status == expected_status and body["error"]["code"] == expected_status
        return
    tracker = ToolIdTracker()
    our_states: dict[int, Any] = {}
    failures: list[tuple[int, list[str]]] = []
    ours: list[Any] = []
    for i, call in enumerate(golden["calls"]):
        request = copy.deepcopy(call["request"])
        lane = stream_lane(request["json"])
        notes: list[str] = []
        if call["state_source"] == "previous":
            if lane in our_states:
                request["json"] = with_state(request["json"], our_states[lane])
            else:
                notes.append("(our previous call failed: sent vLLM's recorded stream_state instead)")
        status, body = send(client, request)
        if golden["kind"] == "stream" and status == 200 and isinstance(body, dict) and "stream_state" in body:
            our_states[lane] = body["stream_state"]
        diffs = compare_call(request, call["status"], call["response"], status, body)
        if status == 200:
            diffs += tracker.check(body, lane)
        if diffs and golden["case"] in deliberate.E2E_BATCH_CASES and status == 200:
            diffs = _deliberate_batch(golden["case"], diffs, body)
        if diffs:
            failures.append((i, notes + diffs))
        ours.append(body)
    held = _held_calls(golden["config"]) if golden["kind"] == "stream" else None
    if failures and held is not None and not any(deliberate.not_held_diffs(d) for _, d in failures):
        # a deliberate difference: our calls arrive whole at the end (deliberate.HELD_CALLS)
        problem = deliberate.check_e2e_held(
            held, ours, [c["response"] for c in golden["calls"]], _batch_twin(golden["case"])
        )
        failures = [] if problem is None else [(-1, [problem])]
    elif failures and golden["kind"] == "stream" and golden["case"] in deliberate.E2E_CASES:
        # a listed deliberate stream difference: vLLM's stream does not add up to its batch twin, ours does
        problem = deliberate.check_e2e_stream(
            golden["case"], ours, [c["response"] for c in golden["calls"]], _batch_twin(golden["case"])
        )
        failures = [] if problem is None else [(-1, [problem])]
    assert not failures, _report(golden["case"], golden["config"], failures, len(golden["calls"]), "vLLM 0.33")


def _deliberate_batch(case: str, diffs: list[str], body: dict[str, Any]) -> list[str]:
    """A listed deliberate batch difference (tests/parsers/deliberate.py E2E_BATCH_CASES): only
    the message's reasoning and content may differ, and they must be what vLLM's stream twin
    accumulates to."""
    other = [d for d in diffs if not d.startswith(("$.choices[0].message.content", "$.choices[0].message.reasoning"))]
    twin = _GOLDEN_BY_CASE[deliberate.stream_twin(case)]
    streamed = deliberate.accumulate_chunks([c["response"] for c in twin["calls"]])
    ours = deliberate.message_view(body)
    if (ours["reasoning"], ours["content"]) != (streamed["reasoning"], streamed["content"]):
        other.append(f"{deliberate.E2E_BATCH_CASES[case]}: ours {ours} is not what vLLM's stream sends {streamed}")
    return other


# -- cross-implementation continuation ------------------------------------------------------------------

CONTINUATION_CASES = (
    "reasoning_tool_call_stream1",
    "multi_tool_calls_streamr",
    "parallel_tool_calls_false_stream1",
    "unicode_stream1",
    "logprobs_top_streamr",
    "n2_interleaved_stream1",
    "split_tool_call_text_stream1",
    "plain_unicode_logprobs_stream1",
    "plain_reasoning_content_streamr",
    "cmpl_logprobs_stream1",
    "cmpl_logprobs_streamr",
    "deepseek_reasoning_content_streamr",
)


def _continuation_points(golden: dict[str, Any]) -> list[int]:
    """Calls that continue a vLLM state: at 1/4, 1/2, 3/4, the last, and the first call after a tool
    call id was pinned into the state."""
    calls = golden["calls"]
    candidates = [i for i, c in enumerate(calls) if c["state_source"] == "previous" and c["status"] == 200]
    if not candidates:
        return []
    points = {candidates[len(candidates) * k // 4] for k in (1, 2, 3)} | {candidates[-1]}
    for i in candidates:
        state = calls[i]["request"]["json"].get("stream_state") or {}
        if state.get("last_tool_call_ids"):
            points.add(i)
            break
    return sorted(points)


_CONTINUATIONS = [
    (name, i)
    for name in CONTINUATION_CASES
    if name in GOLDEN_BY_NAME
    for i in _continuation_points(GOLDEN_BY_NAME[name])
]


@pytest.mark.parametrize(("case_name", "call_index"), _CONTINUATIONS, ids=[f"{n}@{i}" for n, i in _CONTINUATIONS])
def test_cross_implementation_continuation(case_name: str, call_index: int, derender_client: ClientFactory) -> None:
    golden = GOLDEN_BY_NAME[case_name]
    call = golden["calls"][call_index]
    request = call["request"]
    fed_ids = list((request["json"].get("stream_state") or {}).get("last_tool_call_ids") or [])
    if _held_calls(golden["config"]) is not None and (request["json"].get("stream_state") or {}).get("tools_streamed"):
        pytest.xfail(
            "held calls (deliberate.HELD_CALLS): vLLM's state already streamed part of a call that our "
            "stream holds until the end, so the call comes again, whole (docs/parsers.md)"
        )
    status, body = send(derender_client(golden["config"]), request)
    diffs = compare_call(request, call["status"], call["response"], status, body)
    if status == 200 and isinstance(body, dict):
        # ids vLLM pinned in its state must come back verbatim; new ones follow our own format
        for tc in _delta_tool_calls(body):
            idx, tid = tc.get("index"), tc.get("id")
            if tid is not None and isinstance(idx, int) and idx < len(fed_ids) and tid != fed_ids[idx]:
                diffs.append(f"tool call {idx}: ours re-issued id {tid}, vLLM's state pinned {fed_ids[idx]}")
        ours = (body.get("stream_state") or {}).get("last_tool_call_ids") or []
        if ours[: len(fed_ids)] != fed_ids:
            diffs.append(f"stream_state.last_tool_call_ids: ours {ours}, fed {fed_ids}")
        diffs += ToolIdTracker().check(body, stream_lane(request["json"]))
        held = _held_calls(golden["config"])
        if diffs and held is not None and not deliberate.not_held_diffs(diffs):
            # our calls arrive whole at the end (deliberate.HELD_CALLS): this chunk holds back
            if deliberate.check_e2e_held_call(held, body, call["response"], _batch_twin(case_name)) is not None:
                pytest.xfail(
                    "held calls (deliberate.HELD_CALLS): vLLM's stream already sent what ours holds back "
                    "(part of a call, whitespace before it), so it comes again (docs/parsers.md)"
                )
            diffs = []
    assert not diffs, _report(case_name, golden["config"], [(call_index, diffs)], 1, "vLLM (vLLM's state fed in)")


def _delta_tool_calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for choice in (body.get("chunk") or {}).get("choices") or []:
        out += (choice.get("delta") or {}).get("tool_calls") or []
    return out


_LIVE = sorted(GOLDENS, key=lambda g: (list(CONFIGS).index(g["config"]), g["case"]))


@pytest.mark.live
@pytest.mark.parametrize("case_name", [g["case"] for g in _LIVE])
def test_live_derender_parity(
    case_name: str,
    derender_cases: dict[str, DerenderCase],
    live_oracle: Callable[[str], Oracle],
    derender_client: ClientFactory,
) -> None:
    import httpx

    case = derender_cases[case_name]
    if case_name in DELIBERATE_DIFFERENCES:
        pytest.skip(f"deliberate difference: {DELIBERATE_DIFFERENCES[case_name][1]} (checked offline)")
    oracle = live_oracle(case.config)
    with httpx.Client(base_url=oracle.base_url, timeout=300) as http:
        render = case.render_request()
        prompts = prompt_ids_from_render(case.endpoint, *send(http, render)) if render else []
        expected = drive(case, prompts, lambda r: send(http, r))
    actual = drive(case, prompts, lambda r: send(derender_client(case.config), r))
    tracker = ToolIdTracker()
    failures: list[tuple[int, list[str]]] = []
    for i, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        lane = stream_lane(act["request"]["json"])
        diffs = compare_call(act["request"], exp["status"], exp["response"], act["status"], act["response"])
        if act["status"] == 200:
            diffs += tracker.check(act["response"], lane)
        if diffs:
            failures.append((i, diffs))
    assert not failures, _report(case.name, case.config, failures, len(expected), "live vLLM")
