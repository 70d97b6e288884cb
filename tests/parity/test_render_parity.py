"""Render parity with vLLM 0.33.0's render tier.

`test_render_parity` replays every recorded golden (tests/parity/golden, written by record.py
from the real `vllm launch render`) against our app, one app per server config, and compares:
status; for 2xx every field, value kind and key order (normalizing only random request ids,
`created`, `/v1/models` permission ids and the model folder's path); for errors `type`, `param`
and `code` exactly, and `message` exactly for BadRequestError/NotFoundError; for pydantic
"Bad Request" errors the "N validation error(s)" prefix and the first error's `type`, `loc` and `msg`.

`test_live_parity` (marker `live`; needs RENDER_LIVE_PARITY=1 and a vLLM 0.33 env) does the same
against a freshly started oracle instead of the goldens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

from .corpus import (
    CASES,
    CONFIGS,
    VLLM_VERSION,
    Oracle,
    compare_response,
    iter_goldens,
    send,
)

GOLDENS: list[dict[str, Any]] = list(iter_goldens())

ClientFactory = Callable[[str], tuple[TestClient, str]]


@pytest.fixture(scope="module")  # its apps (one loaded model each) end with the module
def parity_client(request: pytest.FixtureRequest) -> Iterator[ClientFactory]:
    """`get(config_name) -> (TestClient, model_dir)`: one app per config, started on first use."""
    clients: dict[str, tuple[TestClient, str]] = {}
    with ExitStack() as stack:

        def get(config_name: str) -> tuple[TestClient, str]:
            if config_name not in clients:
                config = CONFIGS[config_name]
                model_dir: Path = request.getfixturevalue(f"{config.family}_model_dir")
                settings = Settings(**config.settings_kwargs(model_dir)).validate()
                client = stack.enter_context(TestClient(create_app(settings), raise_server_exceptions=False))
                clients[config_name] = (client, str(model_dir))
            return clients[config_name]

        yield get


def test_goldens_match_corpus() -> None:
    """Every corpus case has a golden recorded from the same request (re-run record.py otherwise)."""
    goldens = {g["case"]: g for g in GOLDENS}
    missing = sorted(set(CASES) - set(goldens))
    stale = sorted(set(goldens) - set(CASES))
    changed = sorted(
        name
        for name, case in CASES.items()
        if name in goldens and (goldens[name]["request"] != case.request() or goldens[name]["config"] != case.config)
    )
    assert not (missing or stale or changed), (
        f"re-record with tests/parity/record.py: missing={missing} stale={stale} changed={changed}"
    )
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_render_parity(golden: dict[str, Any], parity_client: ClientFactory) -> None:
    client, model_dir = parity_client(golden["config"])
    status, body = send(client, golden["request"])
    diffs = compare_response(
        golden["request"],
        golden["status"],
        golden["response"],
        status,
        body,
        expected_model_dir=golden.get("model_dir"),
        actual_model_dir=model_dir,
    )
    assert not diffs, f"{golden['case']} ({golden['config']}): ours vs vLLM 0.33\n  " + "\n  ".join(diffs)


_LIVE_CASES = sorted(CASES.values(), key=lambda c: (list(CONFIGS).index(c.config), c.name))


@pytest.mark.live
@pytest.mark.parametrize("case_name", [c.name for c in _LIVE_CASES])
def test_live_parity(case_name: str, live_oracle: Callable[[str], Oracle], parity_client: ClientFactory) -> None:
    import httpx

    case = CASES[case_name]
    oracle = live_oracle(case.config)
    with httpx.Client(base_url=oracle.base_url, timeout=120) as http:
        expected_status, expected = send(http, case.request())
    client, model_dir = parity_client(case.config)
    status, body = send(client, case.request())
    diffs = compare_response(
        case.request(),
        expected_status,
        expected,
        status,
        body,
        expected_model_dir=model_dir,
        actual_model_dir=model_dir,
    )
    assert not diffs, f"{case.name} ({case.config}): ours vs live vLLM\n  " + "\n  ".join(diffs)
