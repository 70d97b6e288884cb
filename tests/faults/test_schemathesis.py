"""Schema-driven fuzzing (schemathesis) of the running service, from its own /openapi.json.

The service runs as a real process on loopback; schemathesis generates requests from the
description (request bodies from the validation tables, plus bodies that break them) for every
operation and sends them over HTTP. The property: never a 5xx, every error in vLLM's shape.
Bounded in time: derandomized, a fixed number of examples per operation (the whole run stays well
under two minutes); `RENDER_FUZZ_EXAMPLES=N` runs longer with random seeds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from .servers import Service, service_process

EXAMPLES = int(os.environ.get("RENDER_FUZZ_EXAMPLES", "0"))


@pytest.fixture(scope="module")
def service(qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("schemathesis") / "service.log"
    with service_process(
        qwen3_model_dir,
        log,
        "--served-model-name",
        "m",
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "--max-model-len",
        "2048",
    ) as running:
        yield running


def _check(case: Any) -> None:
    response = case.call(timeout=30)
    assert response.status_code < 500, (
        f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}\nbody: {case.body!r}"[:2000]
    )
    if response.status_code >= 400 and case.method == "POST" and response.status_code != 401:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_no_5xx(service: Service, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and "requestBody" not in operation.definition.raw:
            continue  # nothing to break in an operation without a body

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES or 15,
            deadline=None,
            derandomize=not EXAMPLES,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            _check(case)

        run()
