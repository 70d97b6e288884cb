"""The config fingerprint: everything render, derender and engines must agree on, hashed per component.

A mismatch between replicas never errors by itself; it silently changes tokens or the
content/reasoning/tool_calls split. The fingerprint names each component so a difference
says what differs, and one overall hash lets a snapshot or a derender call prove it was
made under the same configuration.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from render_service import __version__, adapter
from render_service.adapter import multimodal as adapter_multimodal
from render_service.exceptions import ConflictError
from render_service.model.loader import Model
from render_service.parsers import parser_versions
from render_service.settings import Settings

# Reported per component, but outside the overall hash: a rolling upgrade that changes nothing
# observable, and a LoRA adapter loaded or unloaded at run time (an adapter changes no token of a
# render or derender, so streams and snapshots made before the change stay valid; a replica
# missing an adapter answers its name with a 404, and the audit reports the differing component).
OUTSIDE_OVERALL = frozenset({"service_version", "lora_adapters"})

# Bump when a parser's output for the same input changes: snapshots and fingerprints follow.
PARSER_IMPLEMENTATION_VERSION = 1
# Bump when a renderer's prompt for the same request changes.
RENDERER_IMPLEMENTATION_VERSION = 1


def _digest(value: Any) -> str:
    if isinstance(value, bytes):
        data = value
    else:
        data = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


def components(settings: Settings, model: Model, adapters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each component's canonical value (small ones inline, large ones as digests). `adapters`: the
    LoRA adapter set (`AdapterRegistry.fingerprint_value()`), else the `--lora-modules` of `settings`."""
    tokenizer = model.hf_tokenizer
    added = {str(i): [t.content, bool(t.special)] for i, t in sorted(tokenizer.added_tokens_decoder.items())}
    parts = {
        "model": {"root": settings.model, "revision": settings.revision},
        "tokenizer_files": {name: _digest(data) for name, data in sorted(model.tokenizer_files.items())},
        "added_tokens": _digest(added),
        "special_tokens": model.special_tokens,
        "chat_template": _digest((model.chat_template or "").encode()),
        # Which renderer turns a conversation into a prompt (vLLM's resolved tokenizer mode):
        # the same template and files give other prompts under another renderer.
        "renderer": {"mode": model.renderer_mode, "implementation_version": RENDERER_IMPLEMENTATION_VERSION}
        # What else a renderer's prompts depend on (Harmony: its library version and settings).
        | ({"details": model.renderer.fingerprint} if getattr(model.renderer, "fingerprint", None) else {}),
        "chat_template_content_format": settings.chat_template_content_format,
        "default_chat_template_kwargs": settings.default_template_kwargs,
        "parsers": {
            "reasoning_parser": settings.reasoning_parser,
            "tool_call_parser": settings.tool_call_parser,
            "enable_auto_tool_choice": settings.enable_auto_tool_choice,
            "exclude_tools_when_tool_choice_none": settings.exclude_tools_when_tool_choice_none,
            "implementation_version": PARSER_IMPLEMENTATION_VERSION,
            # Native versions; an adapter configuration names vLLM's version instead (below).
            "parser_versions": {}
            if adapter.uses_adapter(settings)
            else parser_versions(settings.reasoning_parser, settings.tool_call_parser),
            **adapter.fingerprint_parts(settings),
        },
        "max_model_len": model.max_model_len,
        "max_logprobs": settings.max_logprobs,
        "generation_defaults": {
            "generation_config": settings.generation_config,
            "override_generation_config": settings.override_generation_config,
            "effective": model.default_sampling,
        },
        "served_model_names": settings.served_names,
        "service_version": __version__,
    }
    preprocessor = model.path / "preprocessor_config.json"
    if preprocessor.is_file():
        # Image processing settings change placeholders and pixels (and the engine-side hashes);
        # text-only models keep their fingerprint.
        multimodal: dict[str, Any] = {
            "preprocessor_config": _digest(preprocessor.read_bytes()),
            "limit_mm_per_prompt": settings.limit_mm_per_prompt,
        }
        if settings.mm_processor_kwargs:  # absent when unset: existing fingerprints stay as they were
            multimodal["mm_processor_kwargs"] = settings.mm_processor_kwargs
        # Which processor runs ("vllm <version>" for one without native code; absent when native).
        multimodal.update(adapter_multimodal.fingerprint_parts(model.path, settings, model.renderer_mode))
        parts["multimodal"] = multimodal
    if adapters is None:
        adapters = static_adapters(settings)
    if adapters:  # absent without adapters: existing fingerprints stay as they were
        parts["lora_adapters"] = adapters
    return parts


def static_adapters(settings: Settings) -> dict[str, Any]:
    """The `--lora-modules` set as `AdapterRegistry.fingerprint_value()` reports it once loaded."""
    names = settings.served_names
    return {
        m.name: {"path": m.path, "parent": m.base_model_name if m.base_model_name in names else names[0]}
        for m in sorted(settings.lora_module_paths, key=lambda m: m.name)
    }


def _summarize(parts: dict[str, Any]) -> dict[str, Any]:
    hashes = {name: _digest(value)[:16] for name, value in parts.items()}
    overall = _digest({k: v for k, v in hashes.items() if k not in OUTSIDE_OVERALL})[:32]
    return {"fingerprint": overall, "components": hashes, "values": parts}


def fingerprint(settings: Settings, model: Model, adapters: dict[str, Any] | None = None) -> dict[str, Any]:
    return _summarize(components(settings, model, adapters))


def with_adapters(print_: dict[str, Any], adapters: dict[str, Any]) -> dict[str, Any]:
    """`print_` after a runtime load or unload: only the `lora_adapters` component changes (the
    overall fingerprint does not: see OUTSIDE_OVERALL)."""
    parts = {name: value for name, value in print_["values"].items() if name != "lora_adapters"}
    if adapters:
        parts["lora_adapters"] = adapters
    return _summarize(parts)


def components_header(print_: dict[str, Any]) -> str:
    """`name=hash,...`: what a caller forwards so a mismatch can be explained component by component."""
    return ",".join(f"{name}={digest}" for name, digest in print_["components"].items())


def fingerprint_conflict(ours: dict[str, Any], claimed: str, claimed_components: str | None) -> ConflictError:
    """The 409 for a derender whose render (or stream) used another configuration."""
    differing: list[str] = []
    if claimed_components:
        theirs = dict(part.split("=", 1) for part in claimed_components.split(",") if "=" in part)
        differing = sorted(
            name
            for name, digest in ours["components"].items()
            if theirs.get(name) != digest and name not in OUTSIDE_OVERALL
        )
    detail = (
        f"differing components: {', '.join(differing)}"
        if differing
        else "send X-Render-Fingerprint-Components (from the render response or GET /v1/render/config) "
        "to see which components differ"
    )
    return ConflictError(
        f"config fingerprint mismatch: the request was rendered under {claimed[:32]!r} but this replica runs "
        f"{ours['fingerprint']!r}; {detail}. Route it to a matching replica or restart the stream.",
        code="fingerprint_mismatch",
        param="X-Render-Fingerprint",
    )
