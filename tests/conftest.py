"""Shared fixtures: tiny local model folders with real tokenizers (no hub), built once per session;
for gpt-oss, the o200k_base vocabulary that Harmony loads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from render_service.model.example import build_example_model


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_model(tmp_path_factory.mktemp("tinyqwen3"), "qwen3")


@pytest.fixture(scope="session")
def deepseek_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_model(tmp_path_factory.mktemp("tinydeepseek"), "deepseek")


O200K_FILE = "o200k_base.tiktoken"


def _encodings_dir() -> Path | None:
    """$TIKTOKEN_ENCODINGS_BASE, else where scripts/fetch_o200k.py puts it in CI (.ci/run)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "render-service" / "tiktoken"
    for candidate in (os.environ.get("TIKTOKEN_ENCODINGS_BASE"), str(cache)):
        if candidate and (Path(candidate) / O200K_FILE).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def o200k_dir() -> Iterator[Path]:
    """A folder with o200k_base.tiktoken, exported as TIKTOKEN_ENCODINGS_BASE for Harmony.

    Skips when absent (build it with `python scripts/fetch_o200k.py DIR`), except under
    RENDER_REQUIRE_O200K=1 (CI), where a missing file fails."""
    found = _encodings_dir()
    if found is None:
        if os.environ.get("RENDER_REQUIRE_O200K") == "1":
            pytest.fail("o200k_base.tiktoken not found: run scripts/fetch_o200k.py (RENDER_REQUIRE_O200K=1)")
        pytest.skip(
            "o200k_base.tiktoken not found: run `python scripts/fetch_o200k.py DIR` and set TIKTOKEN_ENCODINGS_BASE"
        )
    previous = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(found)
    yield found
    if previous is None:
        os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
    else:
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = previous


@pytest.fixture(scope="session")
def gpt_oss_model_dir(o200k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.render.gpt_oss_model import build_gpt_oss_model

    return build_gpt_oss_model(tmp_path_factory.mktemp("tinygptoss"), o200k_dir)
