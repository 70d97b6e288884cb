"""Renderer selection as vLLM 0.33 does it (`vllm/renderers/registry.py`, `--tokenizer-mode`).

A model is rendered by one renderer kind, named by its tokenizer mode. `--tokenizer-mode auto`
(the default) picks it from the model: first from the architecture in `config.json`
(`ModelConfig`'s defaults), then a Mistral-format folder (`consolidated*.safetensors` with
`tekken.json` or `tokenizer.model.v*`) means `mistral`, and anything else is `hf` (the
model's Jinja chat template). A gpt-oss model (`model_type: gpt_oss`) is rendered through
Harmony (`harmony`) whether the mode is `auto` or `hf`, as vLLM's `OnlineRenderer.use_harmony`
decides it.

Modes vLLM 0.33 has but this service does not implement natively fail at start, naming the
mode, instead of rendering a prompt vLLM would not.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from typing import Any

from render_service.render.renderers.base import ChatInput, RenderedPrompt, Renderer

__all__ = [
    "NATIVE_MODES",
    "TOKENIZER_MODES",
    "ChatInput",
    "RenderedPrompt",
    "Renderer",
    "UnsupportedRendererError",
    "create_renderer",
    "detect_mode",
]

# Every `--tokenizer-mode` value vLLM 0.33 accepts ("auto" resolves to one of the others).
TOKENIZER_MODES = (
    "auto",
    "hf",
    "alpamayo2_super",
    "cohere",
    "deepseek_v32",
    "deepseek_v4",
    "deepseek_v41",
    "inkling",
    "kimi_audio",
    "kimi_k3",
    "mistral",
    "terratorch",
)
NATIVE_MODES = ("hf", "deepseek_v32", "deepseek_v4", "deepseek_v41", "kimi_k3", "harmony", "mistral")
# Renderer kinds vLLM picks from the model, not from --tokenizer-mode: gpt-oss (`model_type`
# gpt_oss) renders through Harmony whatever the tokenizer mode (`OnlineRenderer.use_harmony`).
MODEL_TYPE_RENDERERS = {"gpt_oss": "harmony"}

# `ModelConfig`: the tokenizer mode an architecture implies when the mode is "auto".
ARCHITECTURE_MODES = {
    "Alpamayo2Super": "alpamayo2_super",
    "MoonshotKimiaForCausalLM": "kimi_audio",
    "KimiK3ForConditionalGeneration": "kimi_k3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "DeepseekV4ForConditionalGeneration": "deepseek_v4",
    "DeepseekV41ForCausalLM": "deepseek_v41",
    "InklingForCausalLM": "inkling",
    "InklingForConditionalGeneration": "inkling",
}
# What each mode vLLM has and we lack needs (for the start-up error).
_MISSING = {
    "alpamayo2_super": "vLLM's Alpamayo2Super tokenizer",
    "cohere": "vLLM's melody-based Cohere renderer",
    "inkling": "vLLM's Inkling renderer",
    "kimi_audio": "vLLM's Kimi-Audio tokenizer",
    "terratorch": "vLLM's TerraTorch renderer (pooling models)",
}


class UnsupportedRendererError(ValueError):
    """A renderer vLLM 0.33 would use that is not implemented here (raised at start)."""

    def __init__(self, mode: str, reason: str) -> None:
        what = _MISSING.get(mode, "a renderer")
        super().__init__(
            f"this model needs vLLM's {mode!r} renderer ({reason}), which render-service does not implement "
            f"natively: it needs {what}. Serve this model with vLLM's render tier, or pass --tokenizer-mode hf "
            "to render it with its chat template (vLLM would do the same only with that flag)."
        )
        self.mode = mode


def is_mistral_folder(files: Iterable[str]) -> bool:
    """vLLM's `is_mistral_model_repo` and its tokenizer-file check, on a listing of the folder."""
    names = [name.rsplit("/", 1)[-1] for name in files]
    weights = any(fnmatch.fnmatch(name, "consolidated*.safetensors") for name in names)
    tokenizer = any(name == "tekken.json" or fnmatch.fnmatch(name, "tokenizer.model.v*") for name in names)
    return weights and tokenizer


def detect_mode(requested: str, config: dict[str, Any], tokenizer_files: Iterable[str]) -> tuple[str, str]:
    """(mode, why): the renderer vLLM 0.33 uses for this model and the reason, as it decides it."""
    mode = requested.lower()
    model_type = config.get("model_type")
    if model_type in MODEL_TYPE_RENDERERS and mode in ("auto", "hf"):
        return MODEL_TYPE_RENDERERS[model_type], f"model_type {model_type}"
    if mode != "auto":
        return mode, f"--tokenizer-mode {mode}"
    architectures = config.get("architectures") or []
    if architectures and architectures[0] in ARCHITECTURE_MODES:
        return ARCHITECTURE_MODES[architectures[0]], f"architecture {architectures[0]}"
    if is_mistral_folder(tokenizer_files):
        return "mistral", "a Mistral-format folder: consolidated weights and a mistral-common tokenizer file"
    return "hf", "the default"


def create_renderer(mode: str, hf_tokenizer: Any, encode: Callable[[str, bool], list[int]]) -> Renderer:
    """The renderer for `mode` (one of NATIVE_MODES)."""
    if mode == "hf":
        from render_service.render.renderers.hf import HfRenderer

        return HfRenderer(hf_tokenizer)
    if mode == "deepseek_v32":
        from render_service.render.renderers.deepseek_v32 import DeepseekV32Renderer

        return DeepseekV32Renderer()
    if mode == "deepseek_v4":
        from render_service.render.renderers.deepseek_v4 import DeepseekV4Renderer

        return DeepseekV4Renderer()
    if mode == "deepseek_v41":
        from render_service.render.renderers.deepseek_v41 import DeepseekV41Renderer

        return DeepseekV41Renderer()
    if mode == "kimi_k3":
        from render_service.render.renderers.kimi_k3 import KimiK3Renderer

        return KimiK3Renderer(hf_tokenizer, encode)
    if mode == "harmony":
        from render_service.render.renderers.harmony import HarmonyRenderer

        return HarmonyRenderer()
    if mode == "mistral":  # `hf_tokenizer` is the mistral-common tokenizer (model/mistral.py)
        from render_service.render.renderers.mistral import MistralRenderer

        return MistralRenderer(hf_tokenizer)
    raise UnsupportedRendererError(mode, f"--tokenizer-mode {mode}")
