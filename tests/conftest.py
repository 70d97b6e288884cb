"""Shared fixtures: tiny local model folders with real tokenizers (no hub), built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from render_service.model.example import build_example_model


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_model(tmp_path_factory.mktemp("tinyqwen3"), "qwen3")


@pytest.fixture(scope="session")
def deepseek_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_model(tmp_path_factory.mktemp("tinydeepseek"), "deepseek")
