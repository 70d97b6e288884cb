"""Vision-language models with no native image processor: vLLM's processor, behind ours.

Natively this service processes Qwen3-VL images (`render_service.multimodal.qwen3_vl`). Another
vision-language model (an architecture vLLM 0.33 registers as multimodal, whose folder ships an
image processor config) renders through vLLM's own multimodal processor when the `[vllm]` extra
is installed, inside the same worker and request path: the conversation is templated and
tokenized here, images are fetched under this service's rules (`--allowed-media-domains`, sizes,
redirects, private addresses) and counted against `--limit-mm-per-prompt`, and the encoded items
are kept in the same bytes-bounded content cache (`--mm-cache-bytes`) and counted in the same
metrics. Only decoding, processing and prompt expansion are vLLM's (`vllm_multimodal`).

Without the extra such a model fails at start with a message naming the extra (serving it
text-only: `--limit-mm-per-prompt '{"image": 0}'`). This module never imports vLLM or torch.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from render_service.adapter.architectures import VLLM_MULTIMODAL_ARCHITECTURES
from render_service.multimodal.qwen3_vl import SUPPORTED_MODEL_TYPES, ImageProcessor

if TYPE_CHECKING:
    from render_service.multimodal.media import MediaLimits
    from render_service.settings import Settings

# Files an image processor is configured by (a folder without one has no processor to run).
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        value = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _images_disabled(settings: Settings) -> bool:
    limit = settings.limit_mm_per_prompt.get("image")
    if isinstance(limit, dict):
        limit = limit.get("count")
    return limit == 0


def needs_vllm_processor(model_dir: Path, settings: Settings, renderer_mode: str = "hf") -> str | None:
    """The architecture of a vision-language model whose images only vLLM can process here, or
    None (text-only, native, images disabled, or a renderer that tokenizes images itself)."""
    config = _config(model_dir)
    if config.get("model_type") in SUPPORTED_MODEL_TYPES or renderer_mode != "hf":
        return None
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures and isinstance(architectures[0], str) else None
    if architecture not in VLLM_MULTIMODAL_ARCHITECTURES:
        return None
    if not any((model_dir / name).is_file() for name in _PROCESSOR_FILES) or _images_disabled(settings):
        return None
    return architecture


def check_model(model_dir: Path, settings: Settings, renderer_mode: str) -> None:
    """Start-up rule (raises `AdapterUnavailable`): a vision-language model with no native image
    processor needs the extra; `--mm-cache-redis` shares natively processed images only."""
    from render_service.adapter import INSTALL_HINT, AdapterUnavailable, vllm_installed

    architecture = needs_vllm_processor(model_dir, settings, renderer_mode)
    if architecture is None:
        return
    if not vllm_installed():
        raise AdapterUnavailable(
            f"{architecture} images are not processed natively: they go through vLLM's multimodal processor, "
            f"which needs the optional extra: {INSTALL_HINT}. To serve this model text-only, pass "
            """--limit-mm-per-prompt '{"image": 0}'."""
        )
    if settings.mm_cache_redis:
        raise AdapterUnavailable(
            f"--mm-cache-redis shares natively processed images only; {architecture} images come from vLLM's "
            "processor (leave --mm-cache-redis off for this model)"
        )


class DelegatedVision(ImageProcessor):
    """An image processor that expands the whole prompt itself (vLLM's processors replace each
    placeholder with a model-specific token run, not a repeat of one token). It keeps the base
    class's content cache, metrics counters and pre-encoded response parts; `render` replaces the
    per-image `__call__` + `expand_prompt` of the native path."""

    implementation: str  # for the fingerprint: "vllm <version>"

    @abstractmethod
    def render(
        self,
        prompt_ids: list[int],
        urls: list[str],
        fetched: dict[str, bytes] | None,
        body: dict[str, Any],
        limits: MediaLimits,
    ) -> tuple[list[int], dict[str, Any]]:
        """(expanded prompt token ids, vLLM's `features` for the GenerateRequest)."""


def vision(model_dir: Path, tokenizer_dir: Path, settings: Settings, renderer_mode: str) -> DelegatedVision | None:
    """vLLM's processor for this model (built once per worker), or None when it needs none."""
    if needs_vllm_processor(model_dir, settings, renderer_mode) is None:
        return None
    from render_service.adapter.vllm_multimodal import VllmVision

    return VllmVision(model_dir, tokenizer_dir, settings)


def fingerprint_parts(model_dir: Path, settings: Settings, renderer_mode: str) -> dict[str, Any]:
    """What the `multimodal` fingerprint component adds: which image processor runs (nothing for
    a native or text-only model, whose fingerprint stays as it was)."""
    if needs_vllm_processor(model_dir, settings, renderer_mode) is None:
        return {}
    from render_service.adapter import installed_vllm_version

    return {"processor": f"vllm {installed_vllm_version()}"}
