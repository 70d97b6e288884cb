"""vLLM's multimodal processor for a vision-language model with no native one (imports vLLM).

Built once per worker from the same engine arguments `vllm launch render` builds its renderer
from (model folder, `--mm-processor-kwargs`, `--limit-mm-per-prompt`), CPU only. Per request it
does what vLLM's render tier does after tokenizing the templated prompt: decode each image with
vLLM's `ImageMediaIO`, run `BaseRenderer._process_multimodal` (hashing, the HF processor, prompt
expansion), and serialize the items as `extract_mm_features` does. Around it stays this
service's: fetching (the caller's, under our media rules), the image count and pixel bounds, and
the content cache of encoded items keyed by vLLM's mm_hash (a re-sent image skips the
msgpack+base64 encoding; vLLM's processor-only cache, the other half of `--mm-cache-bytes`, skips
the HF processor).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # a render tier never needs an accelerator

import orjson
from vllm import AsyncEngineArgs, envs
from vllm.config import VllmConfig
from vllm.entrypoints.scale_out.token_in_token_out.mm_features import _encode_mm_kwargs_with_metadata
from vllm.model_executor.model_loader import get_model_cls
from vllm.multimodal.cache import MultiModalProcessorOnlyCache
from vllm.multimodal.media.image import ImageMediaIO
from vllm.renderers.registry import renderer_from_config

from render_service.adapter import installed_vllm_version
from render_service.adapter.multimodal import DelegatedVision
from render_service.exceptions import BadRequestError
from render_service.multimodal import media
from render_service.multimodal.qwen3_vl import ProcessedImage, VisionConfig

if TYPE_CHECKING:
    from render_service.multimodal.media import MediaLimits
    from render_service.settings import Settings

_GIB = 1 << 30


def _engine_args(model_dir: Path, tokenizer_dir: Path, settings: Settings) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=settings.model if Path(settings.model).expanduser().is_dir() else str(model_dir),
        tokenizer=str(tokenizer_dir),
        served_model_name=settings.served_names,
        trust_remote_code=settings.trust_remote_code,
        revision=settings.revision,
        tokenizer_revision=settings.tokenizer_revision,
        mm_processor_kwargs=settings.mm_processor_kwargs or None,
        limit_mm_per_prompt=settings.limit_mm_per_prompt or {},
        # The other half of --mm-cache-bytes is our cache of encoded items.
        mm_processor_cache_gb=settings.mm_cache_bytes / 2 / _GIB,
    )


class VllmVision(DelegatedVision):
    """Images of a non-native vision-language model, through vLLM's processor."""

    def __init__(self, model_dir: Path, tokenizer_dir: Path, settings: Settings) -> None:
        args = _engine_args(model_dir, tokenizer_dir, settings)
        model_config = args.create_model_config()
        model_config.quantization = None  # as `vllm launch render`: preprocessing only
        envs.VLLM_CPU_KVCACHE_SPACE = 0
        self._renderer = renderer_from_config(VllmConfig(model_config=model_config))
        # Full items on every request (vLLM's default sender cache would leave out the items an
        # engine behind the same process already holds; a render tier has no such engine).
        self._renderer._mm_processor_cache = MultiModalProcessorOnlyCache(model_config)
        processor = self._renderer.get_mm_processor()
        try:
            declared = set(processor.info.data_parser.placeholder_metadata_fields("image"))
        except Exception:  # vLLM's render tier falls back the same way
            declared = set()
        self._declared = declared
        model_cls: Any = get_model_cls(model_config)
        placeholder = model_cls.get_placeholder_str("image", 1)
        if not isinstance(placeholder, str):
            raise ValueError(f"{model_config.architecture} has no image placeholder text")
        config = VisionConfig(
            model_id=model_config.model,
            image_token_id=-1,  # vLLM's processor expands the prompt itself
            patch_size=0,
            merge_size=0,
            temporal_patch_size=0,
            min_pixels=0,
            max_pixels=0,
            placeholder=placeholder,
        )
        super().__init__(config, settings.mm_cache_bytes // 2)
        self.implementation = f"vllm {installed_vllm_version()}"
        # vLLM's processors run one request at a time (its renderer uses a one-thread executor).
        self._lock = threading.Lock()

    # -- the request path ---------------------------------------------------------------------------

    def _bytes(self, url: str, fetched: dict[str, bytes] | None, limits: MediaLimits) -> bytes:
        if url.startswith("data:"):
            return media.decode_data_url(url, limits)
        if fetched is not None and url in fetched:
            return fetched[url]
        media.check_url(url, limits)
        raise BadRequestError(f"Image URL {url!r} was not fetched.", param="messages")

    def _load(self, data: bytes, limits: MediaLimits) -> Any:
        try:
            image = ImageMediaIO().load_bytes(data)
        except ValueError as exc:  # vLLM's message ("Failed to load image: ...")
            raise BadRequestError(str(exc)) from None
        width, height = image.media.size
        if width * height > limits.max_image_pixels:
            raise BadRequestError(
                f"Image dimensions {width}x{height} ({width * height} pixels) exceed the maximum of "
                f"{limits.max_image_pixels} pixels."
            )
        return image

    def render(
        self,
        prompt_ids: list[int],
        urls: list[str],
        fetched: dict[str, bytes] | None,
        body: dict[str, Any],
        limits: MediaLimits,
    ) -> tuple[list[int], dict[str, Any]]:
        limit = limits.max_images_per_prompt
        if len(urls) > limit:
            raise BadRequestError(f"At most {limit} image(s) may be provided in one prompt.", param="messages")
        images = [self._load(self._bytes(url, fetched, limits), limits) for url in urls]
        try:
            with self._lock:
                output = self._renderer._process_multimodal(
                    prompt_ids, {"image": images}, None, body.get("mm_processor_kwargs") or None
                )
        except ValueError as exc:  # vLLM answers a processor's refusal with a 400 carrying its text
            raise BadRequestError(str(exc)) from None
        hashes: list[str] = list(output["mm_hashes"].get("image", []))
        ranges = output["mm_placeholders"].get("image", [])
        placeholders = [{"offset": r.offset, "length": r.length} for r in ranges]
        features: dict[str, Any] = {
            "mm_hashes": {"image": hashes},
            "mm_placeholders": {"image": placeholders},
            "kwargs_data": None,
            "mm_metadata": None,
        }
        if body.get("mm_payload", "tensors") == "tensors":
            items = output["mm_kwargs"].get("image", [])
            encoded = [
                self._encoded(digest, item, r.length) for digest, item, r in zip(hashes, items, ranges, strict=True)
            ]
            features["kwargs_data"] = {"image": [item.kwargs_data for item in encoded]}
            if any(item.metadata for item in encoded):
                features["mm_metadata"] = {"image": [item.metadata or None for item in encoded]}
        return list(output["prompt_token_ids"]), features

    def _encoded(self, digest: str, item: Any, length: int) -> ProcessedImage:
        """The item as `extract_mm_features` serializes it, from our content cache when seen."""
        cached = self.cache.get(digest)
        if cached is not None:
            return cached
        if item is None:  # vLLM left the item to its cache; never with a processor-only cache
            raise BadRequestError("the multimodal item was not processed")
        kwargs, metadata = _encode_mm_kwargs_with_metadata(
            {"image": [item]}, metadata_fields_for=lambda _modality: self._declared
        )
        blob = orjson.dumps(kwargs["image"][0])
        meta = (metadata or {}).get("image", [None])[0] or ""
        encoded = ProcessedImage(
            mm_hash=digest,
            num_tokens=length,
            kwargs_data=orjson.Fragment(blob),
            kwargs_json=blob,
            metadata=meta,
            nbytes=len(blob) + len(meta) + 200,
        )
        self.cache.put(encoded)
        return encoded
