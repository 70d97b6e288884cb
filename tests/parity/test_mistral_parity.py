"""Parity of the `mistral` renderer (mistral-common) with vLLM 0.33.0.

Replays every golden in golden_mistral/ (recorded by record_mistral.py from the real
`vllm launch render` on the Mistral-format fixture folders of `tests.mistral_fixture`) against
our app, one app per config, and compares as test_render_parity does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.mistral_fixture import build_mistral_model

from .corpus import VLLM_VERSION, compare_response, send
from .mistral_corpus import CASES, CONFIGS, GOLDEN_MISTRAL_DIR

pytest.importorskip("mistral_common", reason="the mistral extra is not installed")

GOLDENS: list[dict[str, Any]] = [
    json.loads(path.read_text(encoding="utf-8")) for path in sorted(GOLDEN_MISTRAL_DIR.glob("*.json"))
]

ClientFactory = Callable[[str], tuple[TestClient, str]]


@pytest.fixture(scope="module")
def mistral_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientFactory]:
    """`get(config_name) -> (TestClient, model_dir)`: one app per config, on first use."""
    clients: dict[str, tuple[TestClient, str]] = {}
    with ExitStack() as stack:

        def get(config_name: str) -> tuple[TestClient, str]:
            if config_name not in clients:
                config = CONFIGS[config_name]
                model_dir: Path = build_mistral_model(tmp_path_factory.mktemp(config.family), config.family)
                settings = Settings(**config.settings_kwargs(model_dir)).validate()
                client = stack.enter_context(TestClient(create_app(settings), raise_server_exceptions=False))
                clients[config_name] = (client, str(model_dir))
            return clients[config_name]

        yield get


def test_goldens_match_corpus() -> None:
    """Every corpus case has a golden recorded from the same request (re-run record_mistral.py)."""
    goldens = {g["case"]: g for g in GOLDENS}
    missing = sorted(set(CASES) - set(goldens))
    stale = sorted(set(goldens) - set(CASES))
    changed = sorted(
        name for name, case in CASES.items() if name in goldens and goldens[name]["request"] != case.request()
    )
    assert not (missing or stale or changed), (
        f"re-record with tests/parity/record_mistral.py: missing={missing} stale={stale} changed={changed}"
    )
    assert {g["vllm_version"] for g in GOLDENS} == {VLLM_VERSION}


@pytest.mark.parametrize("golden", GOLDENS, ids=[g["case"] for g in GOLDENS])
def test_mistral_parity(golden: dict[str, Any], mistral_client: ClientFactory) -> None:
    client, model_dir = mistral_client(golden["config"])
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
    assert not diffs, (
        f"{golden['case']} (tokenizer {golden['tokenizer_version']}): ours vs vLLM 0.33\n  " + "\n  ".join(diffs)
    )
