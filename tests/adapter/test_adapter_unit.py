"""The vLLM adapter without vLLM: the live-stream LRU, start-up messages, the compact-mode 400,
the fingerprint's shape, and that nothing here imports vLLM or torch.

The parity of the adapter itself (vLLM's parsers driven as vLLM's render tier drives them) is
proven against vLLM in `test_vllm_parity.py` (opt-in: `-m live`, needs vLLM installed).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from render_service import adapter
from render_service.adapter import derender as adapter_derender
from render_service.adapter.streams import LiveStream, LiveStreamCache, estimate_bytes
from render_service.audit.fingerprint import components
from render_service.exceptions import BadRequestError
from render_service.settings import Settings, SettingsError


def _ids(position: int, last: int = 7) -> list[int]:
    return [*range(position - 1), last] if position else []


def _entry(position: int, last: int = 7, nbytes: int = 10) -> LiveStream:
    return LiveStream(_ids(position, last), object(), object(), {"messages": []}, 0, nbytes)


# -- the LRU ----------------------------------------------------------------------------------------


def test_take_returns_the_entry_only_after_the_same_output() -> None:
    cache = LiveStreamCache(max_entries=8, max_bytes=1000)
    entry = _entry(5)
    cache.put("s", entry)
    assert cache.take("s", _ids(5)) is entry
    assert cache.take("s", _ids(5)) is None  # taken: a concurrent chunk of the stream misses
    cache.put("s", _entry(5))
    assert cache.take("s", _ids(6)) is None  # another position: stale, and dropped
    assert len(cache) == 0 and cache.nbytes == 0
    cache.put("s", _entry(5))
    assert cache.take("s", _ids(5, last=8)) is None  # same length, another history
    assert len(cache) == 0 and cache.nbytes == 0


def test_bounded_by_entries_least_recently_used_first() -> None:
    cache = LiveStreamCache(max_entries=2, max_bytes=1 << 20)
    cache.put("a", _entry(1))
    cache.put("b", _entry(1))
    assert cache.take("a", _ids(1)) is not None
    cache.put("a", _entry(2))  # "a" is now the most recent
    cache.put("c", _entry(1))
    assert cache.take("b", _ids(1)) is None  # evicted
    assert cache.take("a", _ids(2)) is not None and cache.take("c", _ids(1)) is not None
    assert cache.evictions == 1


def test_bounded_by_bytes() -> None:
    cache = LiveStreamCache(max_entries=100, max_bytes=100)
    for name in "abcd":
        cache.put(name, _entry(1, nbytes=30))
    assert len(cache) == 3 and cache.nbytes == 90
    assert cache.take("a", _ids(1)) is None
    cache.put("huge", _entry(1, nbytes=101))  # larger than the whole bound: not kept
    assert cache.take("huge", _ids(1)) is None
    assert cache.nbytes == 90
    cache.put("b", _entry(2, nbytes=60))  # replacing an entry frees its bytes first
    assert cache.nbytes <= 100 and cache.take("b", _ids(2)) is not None


def test_zero_entries_keeps_nothing_and_bounds_must_be_non_negative() -> None:
    cache = LiveStreamCache(max_entries=0, max_bytes=100)
    cache.put("a", _entry(1))
    assert len(cache) == 0
    with pytest.raises(ValueError):
        LiveStreamCache(max_entries=-1, max_bytes=0)


def test_byte_estimate_grows_with_the_output() -> None:
    assert estimate_bytes(2000, 8000) > estimate_bytes(10, 40) > 0


# -- start-up ---------------------------------------------------------------------------------------


def test_native_names_never_need_the_extra(qwen3_model_dir: Path) -> None:
    settings = Settings(model=str(qwen3_model_dir), reasoning_parser="qwen3", tool_call_parser="hermes")
    assert not adapter.uses_adapter(settings)
    adapter.check_settings(settings)


def test_a_vllm_name_without_the_extra_fails_at_start_naming_it(
    qwen3_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(adapter, "vllm_installed", lambda: False)  # as in the default install
    with pytest.raises(SettingsError, match=r"render-service\[vllm\]") as info:
        Settings(model=str(qwen3_model_dir), tool_call_parser="muse_glimmer").validate()
    assert "--tool-call-parser 'muse_glimmer' is not supported natively" in str(info.value)
    with pytest.raises(SettingsError, match=r"render-service\[vllm\]"):
        Settings(model=str(qwen3_model_dir), reasoning_parser="minicpmv").validate()
    with pytest.raises(SettingsError, match=r"--tool-parser-plugin .*render-service\[vllm\]"):
        Settings(model=str(qwen3_model_dir), tool_parser_plugin="/plugins/mine.py").validate()


def test_an_unknown_name_lists_the_choices(qwen3_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "vllm_installed", lambda: False)
    with pytest.raises(SettingsError, match="'no_such' is not supported; choose one of") as info:
        Settings(model=str(qwen3_model_dir), reasoning_parser="no_such").validate()
    assert "qwen3" in str(info.value) and "step3" in str(info.value)  # native and vLLM's names


def test_stream_cache_bounds_are_checked(qwen3_model_dir: Path) -> None:
    with pytest.raises(SettingsError, match="adapter-stream-cache"):
        Settings(model=str(qwen3_model_dir), adapter_stream_cache_entries=-1).validate()


def test_the_default_install_stays_torch_and_vllm_free(qwen3_model_dir: Path) -> None:
    """Validating and fingerprinting settings, the adapter's own modules except `vllm_parsers`, and a
    refused vLLM-only name import neither torch nor vLLM."""
    script = f"""
import sys
from render_service import adapter
from render_service.adapter import derender, streams, names
from render_service.settings import Settings, SettingsError
Settings(model={str(qwen3_model_dir)!r}, reasoning_parser="qwen3").validate()
adapter.vllm_installed()
adapter.fingerprint_parts(Settings(model="m", reasoning_parser="minicpmv"))
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm"))
assert not bad, bad
print("clean")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "clean" in result.stdout


# -- compact stream_state ---------------------------------------------------------------------------


class _UnusableParsers:
    """The compact check must come before the parser is touched: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the parser was used ({name}) before compact mode was refused")


def test_compact_stream_state_is_refused_with_a_400_in_vllms_error_shape() -> None:
    runtime = adapter.AdapterRuntime(
        _UnusableParsers(),  # type: ignore[arg-type]
        LiveStreamCache(4, 1 << 20),
        "0.33.0",
        {"--reasoning-parser": "minicpmv"},
    )
    ctx = SimpleNamespace(compact=True)
    chunk = {"choices": [{"index": 0, "token_ids": [1], "finish_reason": None}]}
    state = {"rs_sid": "s", "rs_pos": 1}
    with pytest.raises(BadRequestError) as info:
        adapter_derender.stream_chunk(ctx, runtime, chunk, state, {}, {}, None)  # type: ignore[arg-type]
    error = info.value
    assert error.status_code == 400
    body = error.body()["error"]
    assert body["type"] == "BadRequestError" and body["param"] == "stream_state" and body["code"] == 400
    assert "--reasoning-parser minicpmv" in body["message"] and "--stream-state-mode full" in body["message"]


# -- fingerprint ------------------------------------------------------------------------------------


def test_fingerprint_names_vllm_components_and_leaves_native_ones_as_they_were(qwen3_model_dir: Path) -> None:
    native = Settings(model=str(qwen3_model_dir), reasoning_parser="qwen3")
    assert adapter.fingerprint_parts(native) == {}
    from render_service.model.loader import load_model

    parts = components(native.validate(), load_model(native))
    assert "implementations" not in parts["parsers"] and parts["parsers"]["parser_versions"]

    foreign = Settings(model=str(qwen3_model_dir), reasoning_parser="minicpmv", tool_call_parser="hermes")
    extra = adapter.fingerprint_parts(foreign)
    assert extra["implementations"] == {
        "reasoning_parser": "vllm",
        "tool_call_parser": "vllm",  # the composition is vLLM's as a whole
        "detokenizer": "native",
        "renderer": "native",
    }
    assert set(extra) == {"implementations", "vllm_version", "plugins"}
    assert extra["vllm_version"] == adapter.installed_vllm_version()


# -- vision-language models with no native processor ----------------------------------------------


def _non_native_vl(target: Path, *, processor_config: bool = True) -> Path:
    """A Qwen2.5-VL-shaped folder (vLLM registers the architecture as multimodal; no native code)."""
    import json

    from render_service.model.example import build_example_model

    build_example_model(target, "qwen3-vl")
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    config.update(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl")
    (target / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if not processor_config:
        (target / "preprocessor_config.json").unlink()
    return target


def test_a_non_native_vl_model_without_the_extra_fails_at_start_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from render_service.model.loader import ModelLoadError, load_model

    monkeypatch.setattr(adapter, "vllm_installed", lambda: False)
    folder = _non_native_vl(tmp_path)
    with pytest.raises(ModelLoadError, match=r"Qwen2_5_VLForConditionalGeneration.*render-service\[vllm\]"):
        load_model(Settings(model=str(folder)).validate())
    # Text-only is still possible, and says so in the message above.
    text_only = Settings(model=str(folder), limit_mm_per_prompt={"image": 0}).validate()
    assert load_model(text_only).renderer_mode == "hf"


def test_vl_detection_needs_a_multimodal_architecture_with_a_processor_config(tmp_path: Path) -> None:
    from render_service.adapter import multimodal

    settings = Settings(model=str(tmp_path)).validate()
    folder = _non_native_vl(tmp_path / "vl")
    assert multimodal.needs_vllm_processor(folder, settings) == "Qwen2_5_VLForConditionalGeneration"
    assert multimodal.needs_vllm_processor(folder, settings, renderer_mode="kimi_k3") is None  # tokenizes images itself
    assert multimodal.needs_vllm_processor(_non_native_vl(tmp_path / "bare", processor_config=False), settings) is None
    from render_service.model.example import build_example_model

    native = build_example_model(tmp_path / "native", "qwen3-vl")
    assert multimodal.needs_vllm_processor(native, settings) is None  # Qwen3-VL is native
    assert multimodal.fingerprint_parts(native, settings, "hf") == {}


def test_vllm_processor_refuses_the_redis_image_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from render_service.adapter import multimodal

    monkeypatch.setattr(adapter, "vllm_installed", lambda: True)
    folder = _non_native_vl(tmp_path)
    settings = SimpleNamespace(limit_mm_per_prompt={}, mm_cache_redis=True)
    with pytest.raises(adapter.AdapterUnavailable, match="--mm-cache-redis"):
        multimodal.check_model(folder, settings, "hf")  # type: ignore[arg-type]
