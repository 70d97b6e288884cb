"""Fixtures shared by the render and derender parity suites."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from .corpus import CONFIGS, Oracle, free_port, oracle_python, start_oracle


@pytest.fixture(scope="session")
def live_oracle(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Oracle]]:
    """`get(config_name) -> Oracle` for the live parity runs: a freshly started vLLM 0.33 render
    server, one at a time (each holds ~1.2 GB), stopped by PID."""
    if os.environ.get("RENDER_LIVE_PARITY") != "1" or oracle_python() is None:
        pytest.skip("set RENDER_LIVE_PARITY=1 and provide a vLLM 0.33 env (VLLM_ORACLE_PYTHON)")
    current: dict[str, Oracle] = {}

    def get(config_name: str) -> Oracle:
        if config_name not in current:
            for old in current.values():
                old.stop()
            current.clear()
            config = CONFIGS[config_name]
            model_dir = request.getfixturevalue(f"{config.family}_model_dir")
            current[config_name] = start_oracle(config, model_dir, free_port())
        return current[config_name]

    try:
        yield get
    finally:
        for oracle in current.values():
            oracle.stop()
