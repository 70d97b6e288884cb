"""Multimodal render parity with vLLM 0.33's `vllm launch render` (goldens in golden_mm/).

Token ids, placeholders, hashes, mm_metadata and every other field must be identical; the
processed tensors (`kwargs_data`) must be byte-identical too (compared as the base64 strings,
or their sha256 for large ones). On a tensor mismatch the failure reports the max abs
difference of the decoded pixel values.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from starlette.testclient import TestClient

from render_service.server.app import create_app
from render_service.settings import Settings

from .mm_corpus import (
    CHAT_PATH,
    KWARGS_SERVER,
    MM_MAX_MODEL_LEN,
    MM_MODEL_DIR,
    MM_MODEL_NAME,
    mm_model_folder,
    shrink,
    summarize_item,
)

GOLDEN_DIR = Path(__file__).resolve().parent / "golden_mm"
GOLDENS = sorted(GOLDEN_DIR.glob("*.json"))
# Recorded from an oracle with --trust-request-mm-kwargs and --mm-processor-kwargs KWARGS_SERVER.
KWARGS_GOLDENS = sorted((Path(__file__).resolve().parent / "golden_mm_kwargs").glob("*.json"))
# Recorded from an oracle with --trust-request-mm-kwargs only.
TRUST_GOLDENS = sorted((Path(__file__).resolve().parent / "golden_mm_trust").glob("*.json"))
# Known, understood differences (everything else in these cases is still compared exactly).
# vLLM batches identical-size images through one HF call and every item then carries the
# batch's flat-field `slices` (which items get which list depends on its dedup of repeated
# images); we emit each item's own `[[0, n]]`. The pixel bytes, dtype and shape are identical.
KNOWN_FIELD_SLICES_DIFF = {"four_720p", "two_images_request_kwargs"}
# Errors where vLLM's text is its exception chain ("Failed to apply Qwen3VLProcessor on data={...PIL
# reprs...} with kwargs={...}", binascii's and PIL's messages) and `param` is null: ours names the
# cause and the parameter. Same status and error type; every other error's message and param match.
IMAGE_ERROR_TEXT_DIFFERS = {
    "error_aspect_ratio",
    "error_bad_base64",
    "error_not_an_image",
    "error_string_pixels",
    "error_zero_edge",
    "error_unsupported_key",
}


@pytest.fixture(scope="module")
def model_folder() -> Iterator[Path]:
    # vLLM's mm_hash includes the model path as given: serve the folder by the recorded path.
    with mm_model_folder() as folder:
        yield folder


def _client(**options: Any) -> TestClient:
    settings = Settings(
        model=MM_MODEL_DIR, served_model_name=[MM_MODEL_NAME], max_model_len=MM_MAX_MODEL_LEN, **options
    ).validate()
    return TestClient(create_app(settings))


@pytest.fixture(scope="module")
def client(model_folder: Path) -> Iterator[TestClient]:
    with _client() as test_client:
        yield test_client


@pytest.fixture(scope="module")
def trust_client(model_folder: Path) -> Iterator[TestClient]:
    with _client(trust_request_mm_kwargs=True) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def kwargs_client(model_folder: Path) -> Iterator[TestClient]:
    with _client(trust_request_mm_kwargs=True, mm_processor_kwargs=KWARGS_SERVER) as test_client:
        yield test_client


def _pixels(item: str) -> np.ndarray:
    fields = msgpack.unpackb(base64.b64decode(item), strict_map_key=False)
    dtype, shape, ext = fields["pixel_values"]["data"]
    return np.frombuffer(ext.data, dtype=dtype).reshape(shape)


def _tensor_report(ours: dict[str, Any], golden: dict[str, Any]) -> str:
    lines = []
    small = golden["features"].get("kwargs_data_small", {}).get("image", [])
    for index, (mine, theirs) in enumerate(zip(ours["features"]["kwargs_data"]["image"], small, strict=False)):
        if theirs is not None:
            a, b = _pixels(mine), _pixels(theirs)
            diff = "shape differs" if a.shape != b.shape else int(np.abs(a.astype(int) - b.astype(int)).max())
            lines.append(f"image {index}: max abs diff {diff}")
    return "; ".join(lines) or "no inline data to diff"


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_mm_render_matches_vllm(client: TestClient, path: Path) -> None:
    _check_golden(client, json.loads(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", KWARGS_GOLDENS, ids=[p.stem for p in KWARGS_GOLDENS])
def test_mm_kwargs_render_matches_vllm(kwargs_client: TestClient, path: Path) -> None:
    _check_golden(kwargs_client, json.loads(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", TRUST_GOLDENS, ids=[p.stem for p in TRUST_GOLDENS])
def test_mm_trusted_kwargs_render_matches_vllm(trust_client: TestClient, path: Path) -> None:
    _check_golden(trust_client, json.loads(path.read_text(encoding="utf-8")))


def test_untrusted_kwargs_are_refused(client: TestClient) -> None:
    """Without --trust-request-mm-kwargs, vLLM's 400; an empty mapping is no override."""
    golden = json.loads(
        (Path(__file__).resolve().parent / "golden_mm_trust" / "scoped_max_pixels.json").read_text(encoding="utf-8")
    )
    refused = client.post("/v1/chat/completions/render", json=golden["request"])
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "mm_processor_kwargs"
    assert "--trust-request-mm-kwargs" in refused.json()["error"]["message"]
    empty = client.post("/v1/chat/completions/render", json={**golden["request"], "mm_processor_kwargs": {}})
    assert empty.status_code == 200


def _check_golden(client: TestClient, golden: dict[str, Any]) -> None:
    response = client.post(golden.get("path", CHAT_PATH), json=golden["request"])
    assert response.status_code == golden["status"], response.text
    body = response.json()
    expected = golden["response"]
    if golden["status"] != 200:
        assert body["error"]["type"] == expected["error"]["type"]
        if golden["name"] not in IMAGE_ERROR_TEXT_DIFFERS:
            assert (body["error"]["message"], body["error"]["param"]) == (
                expected["error"]["message"],
                expected["error"]["param"],
            )
        return
    full = body
    body = shrink(body)
    body["request_id"] = expected["request_id"]
    for key in expected:
        if key == "features":
            continue
        assert body[key] == expected[key], key
    assert list(body) == list(expected)
    ours, theirs = body["features"], expected["features"]
    assert list(ours) == list(theirs)
    assert ours["mm_hashes"] == theirs["mm_hashes"]
    assert ours["mm_placeholders"] == theirs["mm_placeholders"]
    assert ours["mm_metadata"] == theirs["mm_metadata"]
    # Field by field: wire spec, dtype, shape and the sha256 of the raw tensor bytes.
    if golden["name"] in KNOWN_FIELD_SLICES_DIFF:
        for item in (*ours["kwargs_data"]["image"], *theirs["kwargs_data"]["image"]):
            item["pixel_values"]["field"][1].pop("slices")
    if ours["kwargs_data"] != theirs["kwargs_data"]:
        pytest.fail(f"kwargs_data differ: {_tensor_report(full, expected)}")


def test_repeated_image_is_a_cache_hit(client: TestClient) -> None:
    golden = json.loads((GOLDEN_DIR / "multi_turn_repeated.json").read_text(encoding="utf-8"))
    before = _metric(client, "render_mm_cache_hits_total")
    client.post("/v1/chat/completions/render", json=golden["request"])
    client.post("/v1/chat/completions/render", json=golden["request"])
    # 3 images per request; the second request (at least) is served entirely from the cache.
    assert _metric(client, "render_mm_cache_hits_total") - before >= 3


def _metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_summary_is_order_free() -> None:
    """Two encodings of one item in either key order (as vLLM processes differ) summarize alike."""
    import msgspec

    tensor = ("uint8", [1, 2], msgspec.msgpack.Ext(3, b"ab"))
    grid = ("int64", [3], msgspec.msgpack.Ext(3, bytes(24)))
    one = {
        "pixel_values": {"data": tensor, "field": ["flat", {}]},
        "image_grid_thw": {"data": grid, "field": ["batched", {}]},
    }
    two = dict(reversed(one.items()))
    encode = msgspec.msgpack.Encoder().encode
    a, b = (base64.b64encode(encode(x)).decode() for x in (one, two))
    assert a != b
    assert summarize_item(a) == summarize_item(b)
    assert summarize_item(a)["pixel_values"]["sha256"] == hashlib.sha256(b"ab").hexdigest()


def test_return_mm_kwargs_false_means_no_tensors(client: TestClient) -> None:
    """llm-d sends vLLM's deprecated `return_mm_kwargs: false`: the same answer as `mm_payload: "none"`."""
    golden = json.loads((GOLDEN_DIR / "mm_payload_none.json").read_text(encoding="utf-8"))
    request = {k: v for k, v in golden["request"].items() if k != "mm_payload"}
    request["return_mm_kwargs"] = False
    body = client.post("/v1/chat/completions/render", json=request).json()
    assert body["features"]["kwargs_data"] is None and body["features"]["mm_metadata"] is None
    assert body["features"]["mm_hashes"] == golden["response"]["features"]["mm_hashes"]
    kept = client.post("/v1/chat/completions/render", json={**request, "return_mm_kwargs": True}).json()
    assert kept["features"]["kwargs_data"] is not None
