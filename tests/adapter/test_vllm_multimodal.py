"""A vision-language family with no native processor (Qwen2.5-VL) renders through vLLM's processor
identically to vLLM's own render tier.

Opt-in (`-m live`) and run with a Python that has vLLM 0.33 installed (the extra) and torchvision
(Qwen2.5-VL's HF image processor needs it), e.g.:

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=. VLLM_PYTHON -m pytest -m live -p no:cacheprovider \
        tests/adapter/test_vllm_multimodal.py

The model folder is built here: the Qwen3 example vocabulary (which has Qwen's vision tokens)
with a tiny random Qwen2.5-VL config and Qwen2.5-VL's real image processor settings (patch 14,
merge 2, CLIP mean/std, min/max pixels); no hub. vLLM's render tier runs in this process
(`build_app(args, ("render",))`, what `vllm launch render` serves).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.live, pytest.mark.timeout(1800)]

pytest.importorskip("vllm", reason="the vLLM processor needs vLLM (the render-service[vllm] extra)")
pytest.importorskip("torchvision", reason="Qwen2.5-VL's HF image processor needs torchvision")

from PIL import Image  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from render_service.model.example import build_example_model  # noqa: E402
from render_service.server.app import create_app  # noqa: E402
from render_service.settings import Settings  # noqa: E402
from tests.adapter.test_vllm_parity import SERVED, VllmRenderTier  # noqa: E402

QWEN2_5_VL_CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
    "vision_config": {
        "depth": 2,
        "hidden_act": "silu",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "in_chans": 3,
        "out_hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
    },
}
# Qwen2.5-VL's published preprocessor_config.json.
QWEN2_5_VL_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "max_pixels": 12845056,
    "merge_size": 2,
    "min_pixels": 3136,
    "patch_size": 14,
    "processor_class": "Qwen2_5_VLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "temporal_patch_size": 2,
}


def build_qwen2_5_vl(target: Path) -> Path:
    build_example_model(target, "qwen3-vl")  # the vocabulary and Qwen's VL chat template
    (target / "config.json").write_text(json.dumps(QWEN2_5_VL_CONFIG, indent=2), encoding="utf-8")
    (target / "preprocessor_config.json").write_text(json.dumps(QWEN2_5_VL_PREPROCESSOR, indent=2), encoding="utf-8")
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config["processor_class"] = "Qwen2_5_VLProcessor"
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    return target


def _data_url(image: Image.Image, fmt: str) -> str:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[fmt]
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def _gradient(width: int, height: int, mode: str = "RGB") -> Image.Image:
    image = Image.new(mode, (width, height))
    image.putdata(
        [
            (x * 255 // width, y * 255 // height, (x + y) % 256, 128 + (x % 2) * 100)[: len(mode)]
            for y in range(height)
            for x in range(width)
        ]
    )
    return image


def _image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def tier(model_dir: Path) -> VllmRenderTier:
    return VllmRenderTier(model_dir)


@pytest.fixture(scope="module")
def ours(model_dir: Path) -> Any:
    settings = Settings(model=str(model_dir), served_model_name=[SERVED]).validate()
    with TestClient(create_app(settings)) as client:
        yield client


PNG = _data_url(_gradient(64, 48), "PNG")
JPEG = _data_url(_gradient(300, 97), "JPEG")
RGBA = _data_url(_gradient(40, 90, "RGBA"), "PNG")

CASES: dict[str, dict[str, Any]] = {
    "one_image": {"messages": [{"role": "user", "content": [_image_part(PNG), {"type": "text", "text": "What?"}]}]},
    "two_images_two_turns": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Compare"}, _image_part(JPEG), _image_part(RGBA)]},
            {"role": "assistant", "content": "They differ."},
            {"role": "user", "content": [_image_part(PNG), {"type": "text", "text": "And this one?"}]},
        ]
    },
    "metadata_only": {
        "messages": [{"role": "user", "content": [_image_part(JPEG), {"type": "text", "text": "Hi"}]}],
        "mm_payload": "none",
    },
    "text_only": {"messages": [{"role": "user", "content": "No image here."}]},
    "repeated_image": {
        "messages": [{"role": "user", "content": [_image_part(PNG), {"type": "text", "text": "Again"}]}]
    },
    "broken_image": {"messages": [{"role": "user", "content": [_image_part("data:image/png;base64,aGVsbG8=")]}]},
}


@pytest.mark.parametrize("case", list(CASES))
def test_renders_like_vllms_render_tier(case: str, tier: VllmRenderTier, ours: TestClient) -> None:
    body = {"model": SERVED, **CASES[case]}
    theirs = tier.client.post("/v1/chat/completions/render", json=body)
    mine = ours.post("/v1/chat/completions/render", json=body)
    assert mine.status_code == theirs.status_code, (mine.text[:500], theirs.text[:500])
    if theirs.status_code != 200:
        assert mine.json()["error"]["type"] == theirs.json()["error"]["type"]
        return
    expected, got = theirs.json(), mine.json()
    expected.pop("request_id"), got.pop("request_id")
    if case != "text_only":
        assert expected["features"] is not None
    assert got == expected


def test_fingerprint_and_metrics_name_vllms_processor(ours: TestClient) -> None:
    from render_service.adapter import installed_vllm_version

    components = ours.get("/v1/render/config").json()["values"]["multimodal"]
    assert components["processor"] == f"vllm {installed_vllm_version()}"
    body = {"model": SERVED, **CASES["one_image"]}
    assert ours.post("/v1/chat/completions/render", json=body).status_code == 200
    metrics = ours.get("/metrics").text
    hits = [line for line in metrics.splitlines() if line.startswith("render_mm_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 1
