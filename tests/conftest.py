"""Shared fixtures: tiny local model folders with real tokenizers (no hub), built once per session;
for gpt-oss, the o200k_base vocabulary that Harmony loads. After each module, what its fixtures
loaded is freed and handed back to the OS (one pytest process runs the whole suite in CI)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from render_service.model.example import build_example_model
from render_service.model.loader import release_freed_memory


@pytest.fixture(scope="module", autouse=True)
def _free_module_memory() -> Iterator[None]:
    """Collect the module's tokenizers and apps once its fixtures are torn down.

    A tokenizer and its `TokenizerInfo` (with the parsers built on it) form a cycle, and a
    tokenizer's Python side is small beside what its Rust backend holds (~100 MB for a
    Qwen-size vocabulary), so without a full collection the garbage of several modules piles
    up before gc notices; `malloc_trim` then returns the freed arenas. Only after modules that
    grew the process by 64 MB or more (a tokenizer is ~100 MB): a full collection over the
    suite's heap is not free, and most modules load no model."""
    start = _rss_bytes()
    yield
    if start is None or (_rss_bytes() or 0) - start >= 64 << 20:
        release_freed_memory()


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: collect after every module
        return None


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


@pytest.fixture(scope="module")
def loaded_models() -> Callable[[Path], Any]:
    """`get(folder)`: `load_model` of the folder with default settings, once per module.

    For tests that only read the model (its tokenizer, `encode`, its renderer): loading a
    Qwen-size fixture costs seconds and ~100 MB, so a module's tests share one load per folder,
    and the module's end frees them."""
    from render_service.model.loader import load_model
    from render_service.settings import Settings

    loaded: dict[Path, Any] = {}

    def get(folder: Path) -> Any:
        if folder not in loaded:
            loaded[folder] = load_model(Settings(model=str(folder)).validate())
        return loaded[folder]

    return get
