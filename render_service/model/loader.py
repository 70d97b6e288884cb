"""One loaded model: tokenizer, chat template, special ids, generation defaults, max_model_len.

Loaded once at start with transformers (which runs without torch) so that special tokens,
the chat template and `generation_config.json` are read exactly as vLLM reads them.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from render_service.adapter import AdapterUnavailable
from render_service.adapter import multimodal as adapter_multimodal
from render_service.model.backends import TokenizerBackend, choose_backend
from render_service.render import renderers
from render_service.settings import Settings

logger = logging.getLogger("render_service.model.loader")

# vLLM's ModelArchitectureConfig: the smallest of these keys is the derived context length.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# get_diff_sampling_param: the generation_config keys vLLM turns into sampling defaults.
_SAMPLING_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
    "skip_special_tokens",
)


class ModelLoadError(Exception):
    """The model folder or an option cannot be used; raised at start, never at request time."""


@dataclass
class Model:
    path: Path
    root: str
    hf_tokenizer: Any  # transformers PreTrainedTokenizerFast
    backend: TokenizerBackend
    chat_template: str | None
    flag_chat_template: str | None
    special_tokens: dict[str, Any]
    max_model_len: int
    vocab_size: int
    default_sampling: dict[str, Any]
    override_max_tokens: int | None
    eos_token_id: int | None
    tokenizer_files: dict[str, bytes] = field(default_factory=dict)
    # The renderer kind (vLLM's tokenizer mode, resolved) and the renderer itself.
    renderer_mode: str = "hf"
    renderer: Any = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens)

    def encode_with_offsets(self, text: str, add_special_tokens: bool = False) -> tuple[list[int], list[list[int]]]:
        """Ids and char offsets, for `return_token_offsets` (HF's offset mapping, as vLLM reports it)."""
        encoded = self.hf_tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [[int(s), int(e)] for s, e in encoded["offset_mapping"]]


def resolve_model_path(model: str, revision: str | None) -> Path:
    """A local folder, or a Hugging Face id resolved through the HF cache (offline-safe)."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        return Path(
            snapshot_download(
                model,
                revision=revision,
                local_files_only=offline,
                allow_patterns=["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"],
            )
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot find model {model!r} locally or in the HF cache: {exc}") from exc


def load_model(settings: Settings) -> Model:
    path = resolve_model_path(settings.model, settings.revision)
    tokenizer_source = settings.tokenizer or settings.model
    tokenizer_path = resolve_model_path(tokenizer_source, settings.tokenizer_revision or settings.revision)
    config = _read_json(path / "config.json") or {}
    renderer_mode = _renderer_mode(settings, config, tokenizer_path)
    if renderer_mode == "mistral":  # no HF tokenizer: mistral-common's, as vLLM loads it
        return _load_mistral_model(settings, path, tokenizer_path, config)
    from transformers import AutoTokenizer

    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path), trust_remote_code=settings.trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer from {tokenizer_path}: {exc}") from exc
    if not getattr(hf_tokenizer, "is_fast", False):
        raise ModelLoadError("only fast (tokenizer.json) tokenizers are supported")
    # Some transformers tokenizer classes keep the vocabulary and merges they were built from as
    # Python objects (~90 MB for Qwen); the Rust backend holds its own copy and is all we use.
    for leftover in ("_vocab", "_merges"):
        if isinstance(getattr(hf_tokenizer, leftover, None), (dict, list)):
            setattr(hf_tokenizer, leftover, type(getattr(hf_tokenizer, leftover))())

    tokenizer_config = _read_json(tokenizer_path / "tokenizer_config.json") or {}
    max_model_len = _max_model_len(config, tokenizer_config, settings.max_model_len)
    default_sampling = _default_sampling(path, settings)
    override_max_tokens = (
        default_sampling.get("max_tokens")
        if settings.generation_config not in ("auto", "vllm")
        else settings.override_generation_config.get("max_new_tokens")
    )
    chat_template = _chat_template(settings, hf_tokenizer)
    tokenizer_json_path = tokenizer_path / "tokenizer.json"
    tokenizer_json = tokenizer_json_path.read_text(encoding="utf-8") if tokenizer_json_path.exists() else None
    backend = choose_backend(hf_tokenizer._tokenizer, tokenizer_json, settings.tokenizer_backend)
    logger.info("tokenizer backend: %s", backend.name)
    files = {
        name: (tokenizer_path / name).read_bytes()
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "chat_template.jinja",
            "vocab.json",
            "merges.txt",
        )
        if (tokenizer_path / name).exists()
    }
    model = Model(
        path=path,
        root=settings.model,
        hf_tokenizer=hf_tokenizer,
        backend=backend,
        chat_template=chat_template,
        flag_chat_template=chat_template if settings.chat_template is not None else None,
        special_tokens=_special_tokens_map(hf_tokenizer),
        max_model_len=max_model_len,
        # vLLM's bound: the larger of the tokenizer's and the model's vocabularies.
        vocab_size=max(len(hf_tokenizer), int((config.get("text_config") or config).get("vocab_size") or 0)),
        default_sampling=default_sampling,
        override_max_tokens=override_max_tokens,
        eos_token_id=hf_tokenizer.eos_token_id,
        tokenizer_files=files,
    )
    model.renderer_mode = renderer_mode
    try:  # a vision-language model with no native image processor needs vLLM's (render_service/adapter)
        adapter_multimodal.check_model(path, settings, model.renderer_mode)
    except AdapterUnavailable as exc:
        raise ModelLoadError(str(exc)) from None
    harmony_only = [
        name
        for name in (settings.reasoning_parser, settings.tool_call_parser if settings.enable_auto_tool_choice else None)
        if name in ("openai_gptoss", "openai")
    ]
    if harmony_only and model.renderer_mode != "harmony":
        # vLLM accepts them and fails on the first derender (the classes only mark Harmony parsing).
        raise ModelLoadError(f"the {', '.join(harmony_only)} parser(s) parse gpt-oss (Harmony) output only")
    if model.renderer_mode == "harmony" and settings.reasoning_parser is None:
        # vLLM's GptOssForCausalLM config default (`verify_and_update_config`).
        settings.reasoning_parser = "openai_gptoss"
    try:
        model.renderer = renderers.create_renderer(model.renderer_mode, hf_tokenizer, model.encode)
    except RuntimeError as exc:  # e.g. the Harmony library or its vocabulary is missing
        raise ModelLoadError(str(exc)) from exc
    logger.info("renderer: %s", model.renderer_mode)
    release_freed_memory()
    return model


def _load_mistral_model(settings: Settings, path: Path, tokenizer_path: Path, config: dict[str, Any]) -> Model:
    """A Mistral-format model: vLLM's `MistralTokenizer` (mistral-common) instead of an HF tokenizer."""
    from render_service.model.mistral import MistralBackend, MistralTokenizer

    tool_parser = settings.tool_call_parser if settings.enable_auto_tool_choice else None
    harmony_only = [name for name in (settings.reasoning_parser, tool_parser) if name in ("openai_gptoss", "openai")]
    if harmony_only:
        raise ModelLoadError(f"the {', '.join(harmony_only)} parser(s) parse gpt-oss (Harmony) output only")
    try:
        tokenizer = MistralTokenizer(tokenizer_path)
    except RuntimeError as exc:  # mistral-common is not installed
        raise ModelLoadError(str(exc)) from exc
    except Exception as exc:
        raise ModelLoadError(f"cannot load the Mistral tokenizer from {tokenizer_path}: {exc}") from exc
    default_sampling = _default_sampling(path, settings)
    override_max_tokens = (
        default_sampling.get("max_tokens")
        if settings.generation_config not in ("auto", "vllm")
        else settings.override_generation_config.get("max_new_tokens")
    )
    files = {}
    if tokenizer.tokenizer_file is not None:
        files[tokenizer.tokenizer_file.name] = tokenizer.tokenizer_file.read_bytes()
    model = Model(
        path=path,
        root=settings.model,
        hf_tokenizer=tokenizer,
        backend=MistralBackend(tokenizer),
        chat_template=None,
        flag_chat_template=None,
        special_tokens=dict(tokenizer.special_tokens_map),
        max_model_len=_max_model_len(config, {}, settings.max_model_len),
        vocab_size=max(len(tokenizer), int((config.get("text_config") or config).get("vocab_size") or 0)),
        default_sampling=default_sampling,
        override_max_tokens=override_max_tokens,
        eos_token_id=tokenizer.eos_token_id,
        tokenizer_files=files,
        renderer_mode="mistral",
    )
    model.renderer = renderers.create_renderer("mistral", tokenizer, model.encode)
    logger.info(
        "renderer: mistral (mistral-common %s, tokenizer v%d, text encoder %s)",
        tokenizer.library_version,
        tokenizer.version,
        tokenizer.encoder,
    )
    release_freed_memory()
    return model


def _renderer_mode(settings: Settings, config: dict[str, Any], tokenizer_path: Path) -> str:
    """vLLM's tokenizer mode for this model; one we do not implement is an error at start."""
    mode, why = renderers.detect_mode(settings.tokenizer_mode, config, _folder_files(settings, tokenizer_path))
    if mode not in renderers.NATIVE_MODES:
        raise ModelLoadError(str(renderers.UnsupportedRendererError(mode, why)))
    return mode


def _folder_files(settings: Settings, tokenizer_path: Path) -> list[str]:
    """The tokenizer repository's file names (weights included: the Mistral check needs them)."""
    names = [p.name for p in tokenizer_path.iterdir()] if tokenizer_path.is_dir() else []
    source = settings.tokenizer or settings.model
    if Path(source).expanduser().is_dir() or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return names
    try:  # a hub id: the snapshot holds only the small files we fetched
        from huggingface_hub import list_repo_files

        return [*names, *list_repo_files(source, revision=settings.tokenizer_revision or settings.revision)]
    except Exception:  # offline or private: the snapshot is all we know
        return names


def release_freed_memory() -> None:
    """Hand freed heap back to the OS: loading tokenizers leaves ~150 MB of freed arenas behind."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def _max_model_len(config: dict[str, Any], tokenizer_config: dict[str, Any], requested: int | None) -> int:
    text_config = config.get("text_config") or config
    derived = min((text_config[k] for k in _MAX_LEN_KEYS if isinstance(text_config.get(k), int)), default=None)
    if derived is None:
        derived = 2048 if requested is None else requested
    model_max = tokenizer_config.get("model_max_length")
    if isinstance(model_max, int):
        derived = min(derived, model_max)
    if requested is None or requested == -1:
        return derived
    if requested > derived and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise ModelLoadError(
            f"User-specified max_model_len ({requested}) is greater than the derived "
            f"max_model_len ({derived}). Set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to allow it."
        )
    return requested


def _default_sampling(path: Path, settings: Settings) -> dict[str, Any]:
    """`ModelConfig.get_diff_sampling_param()`."""
    source = settings.generation_config
    config: dict[str, Any] = {}
    if source != "vllm":
        from transformers import GenerationConfig

        location = str(path) if source == "auto" else source
        try:
            config = GenerationConfig.from_pretrained(location).to_diff_dict()
        except OSError:
            config = {}
    config.update(settings.override_generation_config)
    if not any(key in config for key in _SAMPLING_KEYS):
        return {}
    diff = {key: config[key] for key in _SAMPLING_KEYS if config.get(key) is not None}
    if "max_new_tokens" in diff:
        diff["max_tokens"] = diff.pop("max_new_tokens")
    return diff


def _chat_template(settings: Settings, hf_tokenizer: Any) -> str | None:
    template = settings.chat_template
    if template is None:
        resolved = getattr(hf_tokenizer, "chat_template", None)
        if isinstance(resolved, dict):  # named templates: vLLM picks "default"
            resolved = resolved.get("default")
        return resolved
    candidate = Path(template).expanduser()
    try:
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    except OSError:
        pass
    if any(ch in template for ch in "{}\n"):
        return template  # an inline template
    raise ModelLoadError(f"--chat-template {template!r} is neither a readable file nor a template")


def _special_tokens_map(hf_tokenizer: Any) -> dict[str, Any]:
    """What HF passes to every chat template render (`**self.special_tokens_map`)."""
    return dict(hf_tokenizer.special_tokens_map)
