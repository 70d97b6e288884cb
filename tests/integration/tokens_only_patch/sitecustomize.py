"""A test-only patch for a vLLM `--tokens-only` engine of a model whose multimodal processor needs a tokenizer.

Put this directory on the ENGINE process's PYTHONPATH only (tests/integration/vl_engine.py does); Python
imports `sitecustomize` at start-up in the API server and in the spawned engine-core process alike. Nothing
of vLLM is imported here: a meta-path hook waits for `vllm.multimodal.registry` to be imported and then
rebinds one name in that module, `cached_tokenizer_from_config`, which vLLM 0.32 calls there only in
`MultiModalRegistry._create_processing_ctx` (the tokenizer of the multimodal processor's
InputProcessingContext). The replacement loads the model folder's tokenizer even when
`skip_tokenizer_init=True`, exactly as vLLM does without `--tokens-only` (the original function, on a
shallow copy of the model config with the flag off).

Everything else stays tokens-only: the renderer's tokenizer (vllm/renderers/registry.py has its own
binding), the model's, structured outputs' and the generate route's logprob detokenizing are still None.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

TARGET = "vllm.multimodal.registry"


def _patch(module: ModuleType) -> None:
    original = module.cached_tokenizer_from_config
    if getattr(original, "__qualname__", "") != "cached_tokenizer_from_config" or not hasattr(
        module.MultiModalRegistry, "_create_processing_ctx"
    ):
        raise RuntimeError(f"{TARGET}: not the vLLM this patch knows (tests/integration/tokens_only_patch)")

    def processor_tokenizer(model_config: Any, **kwargs: Any) -> Any:
        if model_config.skip_tokenizer_init:
            model_config = copy.copy(model_config)
            model_config.skip_tokenizer_init = False
        return original(model_config, **kwargs)

    module.cached_tokenizer_from_config = processor_tokenizer
    print(
        f"render-service tokens_only_patch: {TARGET}.cached_tokenizer_from_config loads the tokenizer for "
        "the multimodal processor only",
        file=sys.stderr,
        flush=True,
    )


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Hook())
