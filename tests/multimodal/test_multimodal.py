"""multimodal: the fast pipeline (planar resize, patchify, encoding) against a direct transcription
of the HF processor + vLLM's encoder, the content-hash cache, and json_parts."""

from __future__ import annotations

import base64
import io

import msgspec
import numpy as np
import orjson
import pytest
from PIL import Image

from render_service.multimodal import b64stream
from render_service.multimodal import qwen3_vl as multimodal
from render_service.multimodal.resample import resize_bicubic_aa_reference

CONFIG = multimodal.VisionConfig(
    model_id="/m",
    image_token_id=7,
    patch_size=16,
    merge_size=2,
    temporal_patch_size=2,
    min_pixels=65536,
    max_pixels=16777216,
)


def _png(width: int, height: int, seed: int) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buffer, "PNG")
    return buffer.getvalue()


def _reference_kwargs(image: np.ndarray) -> bytes:
    """HWC resize, HF's patch order by reshape/transpose/repeat, msgspec over plain bytes, base64."""
    h, w = multimodal.smart_resize(image.shape[0], image.shape[1], 32, CONFIG.min_pixels, CONFIG.max_pixels)
    resized = resize_bicubic_aa_reference(image, h, w)
    frames = np.repeat(resized.transpose(2, 0, 1)[None], 2, axis=0)  # (T, C, H, W)
    gh, gw = h // 16, w // 16
    patches = frames.reshape(2, 3, gh // 2, 2, 16, gw // 2, 2, 16).transpose(2, 5, 3, 6, 1, 0, 4, 7)
    rows = np.ascontiguousarray(patches).reshape(gh * gw, 3 * 2 * 16 * 16)
    grid = np.array([1, gh, gw], dtype=np.int64)
    item = {
        "pixel_values": {
            "data": ("uint8", rows.shape, msgspec.msgpack.Ext(3, rows.tobytes())),
            "field": ("flat", {"keep_on_cpu": False, "slices": [[(0, gh * gw, None)]], "dim": 0}),
        },
        "image_grid_thw": {
            "data": ("int64", (3,), msgspec.msgpack.Ext(3, grid.tobytes())),
            "field": ("batched", {"keep_on_cpu": True}),
        },
    }
    return b'"' + base64.b64encode(msgspec.msgpack.encode(item)) + b'"'


@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.parametrize(("width", "height"), [(1280, 720), (300, 200), (97, 451), (64, 64), (1000, 1000)])
def test_processed_bytes_match_the_reference_pipeline(
    width: int, height: int, streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # streamed: resize, patchify and base64 band by band into one bytes object (b64stream);
    # else whole-image planes, patch rows and joined base64 pieces. Both the reference's bytes.
    # (1280x720: height pass only; 97x451 and 1000x1000: both passes; 64x64: upscaled.)
    assert b64stream.available()
    if not streamed:
        monkeypatch.setattr(b64stream, "available", lambda: False)
    image = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    processed = multimodal.process(image, CONFIG, "digest")
    assert processed.kwargs_json == _reference_kwargs(image)
    assert orjson.dumps([processed.kwargs_data]) == b"[" + processed.kwargs_json + b"]"


def test_request_kwargs_change_bounds_and_hash_and_miss_the_cache() -> None:
    processor = multimodal.ImageProcessor(CONFIG, processor_kwargs={"max_pixels": 262144})
    data = _png(1280, 720, 3)
    plain = processor(data)
    assert plain.num_tokens == 252  # 512x512 ceiling: 288x512 (golden_mm_kwargs/server_only_720p)
    assert plain.mm_hash == multimodal.mm_hash(data, "/m", False)  # the server's kwargs are not hashed
    options = processor.options({"max_pixels": 70000, "videos_kwargs": {"fps": 1}})
    assert (options.min_pixels, options.max_pixels, options.hash_kwargs) == (65536, 70000, {"max_pixels": 70000})
    small = processor(data, options)
    assert small.num_tokens == 66 and small.mm_hash != plain.mm_hash
    assert small.mm_hash == multimodal.mm_hash(data, "/m", False, {"max_pixels": 70000})
    assert processor(data) is plain and processor(data, options) is small


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"do_resize": False}, "do_resize not supported"),
        ({"images_kwargs": {"patch_size": 14}}, "patch_size not supported"),
        ({"images_kwargs": [1]}, "images_kwargs must be a mapping"),
        ({"min_pixels": 0}, "min_pixels must be a positive integer"),
        ({"size": {"shortest_edge": 1.5}}, "size.shortest_edge must be a positive integer"),
        ({"size": 512}, "size must be a mapping"),
    ],
)
def test_unsupported_or_bad_request_kwargs_are_400(kwargs: dict, message: str) -> None:
    with pytest.raises(multimodal.BadRequestError, match=message) as raised:
        multimodal.ImageProcessor(CONFIG).options(kwargs)
    assert raised.value.param == "mm_processor_kwargs"


def test_repeat_is_a_cache_hit_returning_the_same_item() -> None:
    processor = multimodal.ImageProcessor(CONFIG)
    data = _png(120, 90, 1)
    first = processor(data)
    assert processor(data) is first
    assert (processor.cache.hits, processor.cache.misses) == (1, 1)


def test_json_parts_join_to_the_document_and_share_cached_bytes() -> None:
    processor = multimodal.ImageProcessor(CONFIG)
    items = [processor(_png(120, 90, seed)) for seed in (1, 2)]
    # One item the cache never held (too big for a 1-byte cache): it is encoded inline.
    stray = multimodal.ImageProcessor(CONFIG, cache_bytes=1)(_png(80, 60, 3))
    images = [items[0], stray, items[1], items[0]]
    content = {
        "request_id": "x\u0000y",
        "token_ids": [1, 2, 3],
        "features": multimodal.features(images, [{"offset": 0, "length": 1}] * 4, "tensors"),
    }
    parts = processor.json_parts(content)
    assert b"".join(parts) == orjson.dumps(content)
    shared = [p for p in parts if any(p is i.kwargs_json for i in items)]
    assert len(shared) == 3  # items[0] twice and items[1]; not the stray one
    no_tensors = {"features": multimodal.features(images, [], "none")}
    assert b"".join(processor.json_parts(no_tensors)) == orjson.dumps(no_tensors)


@pytest.mark.parametrize(
    ("width", "height", "kwargs"),
    [(1280, 720, None), (97, 451, None), (8, 8, None), (1280, 720, {"max_pixels": 70000})],
)
def test_light_item_has_the_full_items_hash_tokens_and_metadata(width: int, height: int, kwargs: dict | None) -> None:
    data = _png(width, height, 5)
    full_processor, light_processor = multimodal.ImageProcessor(CONFIG), multimodal.ImageProcessor(CONFIG)
    options = full_processor.options(kwargs) if kwargs else None
    full, light = full_processor(data, options), light_processor(data, options, tensors=False)
    assert (light.mm_hash, light.num_tokens, light.metadata) == (full.mm_hash, full.num_tokens, full.metadata)
    assert full.has_tensors and not light.has_tensors and light.kwargs_data is None
    assert light.nbytes < 1000 < full.nbytes


def test_light_items_are_cached_and_completed_by_a_tensors_request() -> None:
    processor = multimodal.ImageProcessor(CONFIG)
    data = _png(300, 200, 6)
    light = processor(data, tensors=False)
    assert processor(data, tensors=False) is light  # a hashes-only repeat is a hit
    full = processor(data)  # a tensors request does not take the light item: it processes
    assert full.has_tensors and full.mm_hash == light.mm_hash
    assert (processor.cache.hits, processor.cache.misses) == (1, 2)
    assert processor(data, tensors=False) is full  # the full item serves both from now on
    processor.cache.put(light)  # and a light item never displaces it
    assert processor(data) is full


def test_a_broken_image_is_refused_without_tensors_too() -> None:
    data = _png(300, 200, 7)
    truncated = data[: len(data) // 2]  # the header opens; the pixels do not decode
    for tensors in (True, False):
        with pytest.raises(multimodal.BadRequestError, match="Failed to load image"):
            multimodal.ImageProcessor(CONFIG)(truncated, tensors=tensors)


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


class _Decoder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, url: str) -> bytes:
        self.calls += 1
        return base64.b64decode(url.partition(",")[2])


def test_a_resent_data_url_is_served_from_its_text_without_decoding() -> None:
    processor, decode = multimodal.ImageProcessor(CONFIG), _Decoder()
    url = _data_url(_png(120, 90, 8))
    first = processor.from_data_url(url, decode)
    again = processor.from_data_url("".join(list(url)), decode)  # an equal, distinct str object
    assert again is first and decode.calls == 1
    assert (processor.cache.hits, processor.cache.misses) == (1, 1)
    # Same pixels, other bytes (a PNG re-encoded with another compression level): another URL, decoded.
    buffer = io.BytesIO()
    Image.open(io.BytesIO(decode(url))).save(buffer, "PNG", compress_level=1)
    other = processor.from_data_url(_data_url(buffer.getvalue()), decode)
    assert decode.calls == 3 and other.mm_hash != first.mm_hash  # vLLM hashes the bytes: so do we


def test_data_url_memo_tracks_light_items_kwargs_and_eviction() -> None:
    processor, decode = multimodal.ImageProcessor(CONFIG), _Decoder()
    url = _data_url(_png(300, 200, 9))
    light = processor.from_data_url(url, decode, tensors=False)
    assert processor.from_data_url(url, decode, tensors=False) is light and decode.calls == 1
    full = processor.from_data_url(url, decode)  # a light item does not serve tensors
    assert full.has_tensors and decode.calls == 2
    assert processor.from_data_url(url, decode) is full and decode.calls == 2
    # Request kwargs change the item: no memo, always decoded (the mm_hash cache still applies).
    options = processor.options({"min_pixels": 1024, "max_pixels": 30000})
    small = processor.from_data_url(url, decode, options)
    assert small.num_tokens < full.num_tokens and decode.calls == 3
    # The URL's text counts in the cache's bytes, and leaves with its item.
    cache = processor.cache
    assert cache.bytes == full.nbytes + small.nbytes + len(url)
    cache.max_bytes = small.nbytes + len(url)  # room for one item: the LRU one (full) goes, with its URL
    cache.put(small)
    assert cache.bytes == small.nbytes and len(cache) == 1
    assert processor.from_data_url(url, decode) is not full and decode.calls == 4


def test_a_url_too_big_to_keep_beside_its_item_is_not_memoized() -> None:
    data = _png(120, 90, 10)
    url = _data_url(data)
    probe = multimodal.ImageProcessor(CONFIG)
    nbytes = probe(data, tensors=False).nbytes
    processor, decode = multimodal.ImageProcessor(CONFIG, cache_bytes=nbytes + len(url) - 1), _Decoder()
    item = processor.from_data_url(url, decode, tensors=False)
    assert processor.from_data_url(url, decode, tensors=False) is item  # the item stays: a hash hit
    assert decode.calls == 2 and processor.cache.bytes == item.nbytes


def test_urls_never_push_out_their_own_item() -> None:
    """Two URL texts of the same bytes (other media types): the second is kept only if both fit."""
    data = _png(120, 90, 11)
    encoded = base64.b64encode(data).decode("ascii")
    urls = [f"data:image/{kind};base64,{encoded}" for kind in ("png", "x-png")]
    nbytes = multimodal.ImageProcessor(CONFIG)(data).nbytes
    processor, decode = multimodal.ImageProcessor(CONFIG, cache_bytes=nbytes + len(urls[0]) + 10), _Decoder()
    first = processor.from_data_url(urls[0], decode)
    assert processor.from_data_url(urls[1], decode) is first  # same bytes: a hash hit, its URL not kept
    assert len(processor.cache) == 1 and processor.cache.bytes == nbytes + len(urls[0])
    assert processor.from_data_url(urls[0], decode) is first and decode.calls == 2


def test_a_batch_processes_misses_together_and_equals_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's images: the same items as one call each, in request order, a repeated image
    processed once, and the misses spread over threads when cores allow."""
    monkeypatch.setattr(multimodal, "_usable_cores", lambda: 2)
    monkeypatch.setattr(multimodal, "_idle_cores", lambda cores: cores - 1)  # one helper thread
    images = [_png(300 + 16 * i, 200, 20 + i) for i in range(4)]
    one_by_one = [multimodal.ImageProcessor(CONFIG)(data) for data in images]
    processor, decode = multimodal.ImageProcessor(CONFIG), _Decoder()
    finished: list[str] = []
    finish = processor._finish
    monkeypatch.setattr(processor, "_finish", lambda pending: finished.append(pending.digest) or finish(pending))
    with processor.batch() as batch:
        batch.add(images[0], None, True)
        batch.add_data_url(_data_url(images[1]), decode, None, True)
        batch.add(images[2], None, True)
        batch.add(images[0], None, True)  # the same image again
        batch.add(images[3], None, False)  # a light item
    items = batch.results()
    assert [i.mm_hash for i in items] == [one_by_one[k].mm_hash for k in (0, 1, 2, 0, 3)]
    assert [i.kwargs_json for i in items[:4]] == [one_by_one[k].kwargs_json for k in (0, 1, 2, 0)]
    assert items[0] is items[3] and items[4].kwargs_json is None
    assert sorted(finished) == sorted({i.mm_hash for i in items})  # four images, four processings
    assert processor.from_data_url(_data_url(images[1]), decode) is items[1]  # its URL is remembered
    assert decode.calls == 1


def test_helpers_only_for_idle_cores() -> None:
    assert 0 <= multimodal._idle_cores(2) <= 1  # this thread is running: at most cores - 1 idle
    assert multimodal._idle_cores(0) == 0


def test_a_batch_raises_the_first_failure_in_request_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """As one by one: an image that fails to decode wins over any later refusal, and over a later
    decode failure whichever thread finished first."""
    monkeypatch.setattr(multimodal, "_usable_cores", lambda: 4)
    monkeypatch.setattr(multimodal, "_idle_cores", lambda cores: cores - 1)
    good, broken = _png(300, 200, 30), _png(310, 200, 31)
    truncated = broken[: len(broken) // 2]  # opens, then fails to decode
    processor = multimodal.ImageProcessor(CONFIG)
    with pytest.raises(multimodal.BadRequestError, match="Failed to load image"):
        with processor.batch() as batch:
            batch.add(good, None, True)
            batch.add(truncated, None, True)
            raise multimodal.BadRequestError("a later image refused")
    assert processor.cache.get(processor.identify(good)) is not None  # the earlier image was processed
    with pytest.raises(multimodal.BadRequestError, match="a later image refused"):
        with processor.batch() as batch:
            batch.add(_png(320, 200, 32), None, True)
            raise multimodal.BadRequestError("a later image refused")


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 255, 256, 65535, 65536, 70001])
def test_ext_header_is_msgspecs(size: int) -> None:
    encoded = msgspec.msgpack.encode(msgspec.msgpack.Ext(3, b"\x07" * size))
    assert encoded == multimodal.ext_header(size, 3) + b"\x07" * size


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 6, 100, 101, 102, 65536, 65537, 65538])
def test_pieced_base64_equals_the_whole_documents(size: int) -> None:
    # every residue of the head and of the pixel count mod 3, around each ext header size
    pixels = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    for extra in ("", "x", "xy"):
        item = {"a" + extra: {"data": ("uint8", (size,), multimodal._PIXELS_STANDIN), "n": [1, None]}, "b": 2}
        whole = {"a" + extra: {"data": ("uint8", (size,), msgspec.msgpack.Ext(3, pixels.tobytes())), "n": [1, None]}}
        expected = b'"' + base64.b64encode(msgspec.msgpack.encode({**whole, "b": 2})) + b'"'
        assert multimodal._json_b64_msgpack(item, pixels) == expected
