"""The multimodal engine round trip: a real vLLM 0.32 CPU engine (tiny random-weight Qwen3-VL) given OUR
image render output generates the same greedy tokens (and the same logprobs) as when given vLLM 0.33's
`vllm launch render` output for the same request.

Both renderers serve the same model folder under the same path string (vLLM's mm_hash includes the
model path as typed). Every generate call starts from empty engine caches (prefix, multimodal
processor and encoder caches reset through the dev endpoints): the two requests carry the same
mm_hashes, and without the resets the second would reuse the first one's encoder output and prove
nothing. A control shows the resets work and the tokens depend on the pixels: our request with its
pixel patches reversed (same hashes) must generate other tokens.

Every engine test runs twice, once per engine mode (one engine at a time):
- `tokens-only`: a real `--tokens-only` engine (skip_tokenizer_init) with the disclosed start-up patch of
  vl_engine.py (its multimodal processor gets the model folder's tokenizer; vLLM refuses to start
  otherwise, which `test_tokens_only_engine_refuses_qwen3_vl` keeps checked). The fixture checks the
  patch was applied and the engine still has no tokenizer (/tokenize answers 400 skip_tokenizer_init).
- `scale-out`: the engine with its tokenizer and `--enable-scale-out`, unpatched.
Run with `pytest -m live tests/integration/test_mm_engine.py` (~8 min: two engines in turn, ~4 GB each,
and one render oracle); skipped without the engine env or the 0.33 env.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from render_service.server.app import create_app
from render_service.settings import Settings
from tests.integration.engine_fixture import app_server, engine_python, render_oracle_python, start_engine
from tests.integration.vl_engine import (
    MAX_MODEL_LEN,
    PATCH_BANNER,
    SERVED_NAME,
    build_weighted_vl_model,
    start_vl_engine,
    start_vl_render_oracle,
    torchvision_overlay,
)
from tests.parity.mm_corpus import cases, summarize_item

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(engine_python() is None, reason="no vLLM engine env (VLLM_ENGINE_PYTHON)"),
    pytest.mark.skipif(render_oracle_python() is None, reason="no vLLM 0.33 env (VLLM_ORACLE_PYTHON)"),
]

MAX_TOKENS = 8
ENGINE_MODES = ("tokens-only", "scale-out")
# (case name -> mode -> greedy ids and logprob numbers): the modes must agree too (see `compare`).
BY_MODE: dict[str, dict[str, tuple[list[int], list[Any]]]] = {}
CACHE_RESETS = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache")


@pytest.fixture(scope="module")
def overlay() -> Path:
    return torchvision_overlay()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_weighted_vl_model()


@pytest.fixture(scope="module")
def renderers(model_dir: Path, overlay: Path) -> Iterator[dict[str, str]]:
    """Our render service and vLLM 0.33's render, both on `model_dir`."""
    settings = Settings(model=str(model_dir), served_model_name=[SERVED_NAME], max_model_len=MAX_MODEL_LEN).validate()
    oracle = start_vl_render_oracle(model_dir, overlay)
    try:
        with app_server(create_app(settings)) as ours:
            yield {"ours": ours, "vllm": oracle.url}
    finally:
        oracle.stop()


@pytest.fixture(scope="module", params=ENGINE_MODES)
def engine(request: pytest.FixtureRequest, model_dir: Path, overlay: Path) -> Iterator[tuple[str, str]]:
    """The engine on `model_dir` in one mode (pytest finishes one mode's engine before starting the next)."""
    tokens_only = request.param == "tokens-only"
    started = start_vl_engine(model_dir, overlay, tokens_only=tokens_only)
    try:
        if tokens_only:  # the patch ran (API server and engine core) and left the engine without a tokenizer
            assert started.log.read_text(errors="replace").count(PATCH_BANNER) >= 2
            refused = httpx.post(f"{started.url}/tokenize", json={"prompt": "hello"}, timeout=60)
            assert refused.status_code == 400 and "skip_tokenizer_init" in refused.text, refused.text[:300]
        yield request.param, started.url
    finally:
        started.stop()


@pytest.fixture
def servers(renderers: dict[str, str], engine: tuple[str, str]) -> dict[str, str]:
    return {**renderers, "mode": engine[0], "engine": engine[1]}


def render(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"{url}/v1/chat/completions/render", json=body)
    assert response.status_code == 200, f"{url}: {response.status_code} {response.text[:500]}"
    return response.json()


def generate(client: httpx.Client, engine: str, request: dict[str, Any]) -> tuple[list[int], list[Any]]:
    """The rendered request as-is on a cold engine: (greedy token ids, their logprobs with the top 2)."""
    for path in CACHE_RESETS:
        reset = client.post(f"{engine}{path}")
        assert reset.status_code == 200, f"{path}: {reset.status_code} {reset.text[:300]}"
    response = client.post(f"{engine}/inference/v1/generate", json=request)
    assert response.status_code == 200, f"generate: {response.status_code} {response.text[:1000]}"
    choice = response.json()["choices"][0]
    assert len(choice["token_ids"]) == MAX_TOKENS, choice  # ignore_eos is off: a stop would shorten the check
    return choice["token_ids"], choice["logprobs"]["content"]


def greedy(name: str) -> dict[str, Any]:
    return {**cases()[name], "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True, "top_logprobs": 2}


def items(rendered: dict[str, Any], key: str) -> list[Any]:
    return [summarize_item(item) if item else None for item in rendered["features"][key]["image"]]


def reverse_patches(item: str) -> str:
    """A kwargs item with its pixel_values rows (patches) in reverse order; everything else byte-identical."""
    raw = base64.b64decode(item)
    fields = msgpack.unpackb(raw, strict_map_key=False)
    assert msgpack.packb(fields) == raw  # re-encoding is faithful, so only the pixels change below
    dtype, shape, ext = fields["pixel_values"]["data"]
    pixels = np.frombuffer(ext.data, dtype=dtype).reshape(shape)
    fields["pixel_values"]["data"] = [dtype, shape, msgpack.ExtType(ext.code, pixels[::-1].tobytes())]
    return base64.b64encode(msgpack.packb(fields)).decode("ascii")


def compare(servers: dict[str, str], name: str) -> tuple[dict[str, Any], list[int]]:
    """Render `name` with both, check the renders agree where the engine looks, and generate from both."""
    body = greedy(name)
    with httpx.Client(timeout=600) as client:
        ours, theirs = render(client, servers["ours"], body), render(client, servers["vllm"], body)
        assert ours["token_ids"] == theirs["token_ids"]
        for key in ("mm_hashes", "mm_placeholders"):
            assert ours["features"][key] == theirs["features"][key], key
        assert ours["sampling_params"] == theirs["sampling_params"]
        assert items(ours, "mm_metadata") == items(theirs, "mm_metadata")
        tokens, logprobs = generate(client, servers["engine"], ours)
        their_tokens, their_logprobs = generate(client, servers["engine"], theirs)
    print(
        f"{name}: {len(ours['token_ids'])} prompt tokens, {len(ours['features']['mm_hashes']['image'])} images; "
        f"greedy tokens ours {tokens} vllm {their_tokens}"
    )
    assert tokens == their_tokens
    assert logprobs == their_logprobs  # same inputs, same engine, one request at a time: bit-identical
    # The patched tokens-only engine and the unpatched one with its tokenizer generate the same (logprob
    # entries compared by their numbers: only the tokenizer's engine adds token strings).
    BY_MODE.setdefault(name, {})[servers["mode"]] = (tokens, numbers(logprobs))
    assert len({repr(result) for result in BY_MODE[name].values()}) == 1, BY_MODE[name]
    return ours, tokens


def numbers(logprobs: list[Any]) -> list[Any]:
    return [
        (entry["token_id"], entry["logprob"], [(top["token_id"], top["logprob"]) for top in entry["top_logprobs"]])
        for entry in logprobs
    ]


def test_single_image(servers: dict[str, str]) -> None:
    ours, tokens = compare(servers, "png_small")
    # The control: the same request with its patches reversed (same mm_hash, so only the cache resets keep
    # the engine from reusing the first encoder output) generates other tokens.
    flipped = {
        **ours,
        "features": {
            **ours["features"],
            "kwargs_data": {"image": [reverse_patches(item) for item in ours["features"]["kwargs_data"]["image"]]},
        },
    }
    with httpx.Client(timeout=600) as client:
        flipped_tokens, _ = generate(client, servers["engine"], flipped)
        again, _ = generate(client, servers["engine"], ours)
        # For the record (not asserted, engine internals): without the resets the flipped request reuses
        # the cached encoder output of `ours`, whose hash it carries.
        cached = client.post(f"{servers['engine']}/inference/v1/generate", json=flipped).json()["choices"][0]
    print(f"png_small with reversed patches: {flipped_tokens}; same without cache resets: {cached['token_ids']}")
    assert flipped_tokens != tokens
    assert again == tokens  # and the engine is deterministic


def test_multi_turn_repeated_image(servers: dict[str, str]) -> None:
    ours, _ = compare(servers, "multi_turn_repeated")
    hashes = ours["features"]["mm_hashes"]["image"]
    assert len(hashes) == 3 and hashes[0] == hashes[1] != hashes[2]  # the first turn's image re-sent


def test_four_720p_batched_slices(servers: dict[str, str]) -> None:
    """Four 1280x720 images (two distinct): vLLM's items carry the whole HF batch's flat `slices`, ours each
    item's own; the pixels are identical, and the engine batches flat fields by concatenating item data, so
    the slices do not reach the model. Same tokens is the proof."""
    ours, _ = compare(servers, "four_720p")
    assert len(ours["features"]["mm_hashes"]["image"]) == 4


def test_four_720p_items_differ_only_in_slices(renderers: dict[str, str]) -> None:
    """What the test above fed the engine: the same pixel bytes from both, fields apart from `slices` equal."""
    with httpx.Client(timeout=600) as client:
        ours, theirs = (
            items(render(client, renderers[who], greedy("four_720p")), "kwargs_data") for who in ("ours", "vllm")
        )
    for mine, their in zip(ours, theirs, strict=True):
        for name in ("pixel_values", "image_grid_thw"):
            assert {k: v for k, v in mine[name].items() if k != "field"} == {
                k: v for k, v in their[name].items() if k != "field"
            }, name
        assert mine["image_grid_thw"]["field"] == their["image_grid_thw"]["field"]
        kind, options = their["pixel_values"]["field"]
        assert mine["pixel_values"]["field"] == [kind, {**options, "slices": [[[0, 3520, None]]]}]
    print("vLLM's pixel_values slices per item:", [their["pixel_values"]["field"][1]["slices"] for their in theirs])


def test_tokens_only_engine_refuses_qwen3_vl(model_dir: Path, overlay: Path) -> None:
    """Why the tokens-only engine above needs its patch: unpatched, vLLM refuses `--tokens-only` for Qwen3-VL
    at start-up (the multimodal processor is built even though generate-with-features never uses it). When
    this starts failing, vLLM has fixed it, and the patch (vl_engine.PATCH_DIR) should go."""
    with pytest.raises(RuntimeError) as failure:
        engine = start_engine(
            model_dir,
            max_model_len=MAX_MODEL_LEN,
            served_name=SERVED_NAME,
            env={"PYTHONPATH": str(overlay)},
            timeout=600,
        )
        engine.stop()
    assert "Qwen3VLMultiModalProcessor requires a tokenizer" in str(failure.value)
    assert "skip_tokenizer_init=True" in str(failure.value)
