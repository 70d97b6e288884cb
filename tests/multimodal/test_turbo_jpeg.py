"""turbo_jpeg: the direct libjpeg-turbo decode gives Pillow's pixels (vLLM's decode) exactly, and
steps aside (None) for everything it does not handle the same way, so those take Pillow's path."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from render_service.exceptions import BadRequestError
from render_service.multimodal import turbo_jpeg
from render_service.multimodal.qwen3_vl import _open, decode_rgb

pytestmark = pytest.mark.skipif(not turbo_jpeg.available(), reason="simplejpeg missing or not Pillow-exact")


def _jpeg(pixels: np.ndarray, mode: str = "RGB", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def _pillow(data: bytes) -> np.ndarray:
    return decode_rgb(_open(data, 0))  # without the bytes: Pillow's path


def _cases(seed: int, count: int) -> list[tuple[int, int, int, int, bool]]:
    rng = np.random.default_rng(seed)
    return [
        (
            int(rng.integers(1, 700)),
            int(rng.integers(1, 700)),
            int(rng.choice([0, 1, 2])),
            int(rng.integers(20, 101)),
            bool(rng.integers(0, 2)),
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize(("width", "height", "subsampling", "quality", "progressive"), _cases(19, 24))
def test_random_jpegs_decode_to_pillows_pixels(
    width: int, height: int, subsampling: int, quality: int, progressive: bool
) -> None:
    rng = np.random.default_rng(width * 7 + height)
    base = np.linspace(0, 255, width * height * 3).reshape(height, width, 3)
    pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    data = _jpeg(pixels, subsampling=subsampling, quality=quality, progressive=progressive)
    fast = turbo_jpeg.decode(_open(data, 0), data)
    assert fast is not None and fast.dtype == np.uint8
    assert np.array_equal(fast, _pillow(data))
    assert np.array_equal(decode_rgb(_open(data, 0), data), _pillow(data))


def test_the_720p_bench_image() -> None:
    from tests.parity.mm_corpus import make_image

    buffer = io.BytesIO()
    make_image(1280, 720, 101).save(buffer, "JPEG", quality=85)
    data = buffer.getvalue()
    assert np.array_equal(turbo_jpeg.decode(_open(data, 0), data), _pillow(data))


def _exif_oriented(orientation: int) -> bytes:
    image = Image.fromarray(np.random.default_rng(orientation).integers(0, 256, (30, 50, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif)
    return buffer.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_that_transposes_takes_pillows_path(orientation: int) -> None:
    data = _exif_oriented(orientation)
    fast = turbo_jpeg.decode(_open(data, 0), data)
    assert (fast is None) == (orientation != 1)
    # whichever path decodes it, the pixels (transposed or not) are Pillow's
    assert np.array_equal(decode_rgb(_open(data, 0), data), _pillow(data))
    assert decode_rgb(_open(data, 0), data).shape[:2] == ((50, 30) if orientation >= 5 else (30, 50))


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_grayscale_and_cmyk_jpegs_take_pillows_path(mode: str) -> None:
    data = _jpeg(np.random.default_rng(3).integers(0, 256, (21, 34, 3), dtype=np.uint8), mode=mode)
    assert turbo_jpeg.decode(_open(data, 0), data) is None
    assert decode_rgb(_open(data, 0), data).shape == (21, 34, 3)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_other_formats_take_pillows_path(fmt: str) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (9, 11, 4), dtype=np.uint8), "RGBA").save(buffer, fmt)
    data = buffer.getvalue()
    assert turbo_jpeg.decode(_open(data, 0), data) is None
    assert np.array_equal(decode_rgb(_open(data, 0), data), _pillow(data))


def test_truncated_jpeg_fails_as_pillow_does() -> None:
    data = _jpeg(np.random.default_rng(5).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    cut = data[: len(data) // 2]
    assert turbo_jpeg.decode(_open(cut, 0), cut) is None  # libjpeg's warning: not decided here
    with pytest.raises(BadRequestError) as fast:
        decode_rgb(_open(cut, 0), cut)
    with pytest.raises(BadRequestError) as slow:
        _pillow(cut)
    assert fast.value.message == slow.value.message


def test_corrupt_entropy_data_decodes_as_pillow_does() -> None:
    data = bytearray(_jpeg(np.random.default_rng(6).integers(0, 256, (64, 64, 3), dtype=np.uint8), quality=90))
    start = data.index(b"\xff\xda") + 20  # inside the scan
    data[start : start + 8] = b"\x13\x57\x9b\xdf\x02\x46\x8a\xce"
    corrupt = bytes(data)
    try:
        expected = _pillow(corrupt)
    except BadRequestError as exc:
        with pytest.raises(BadRequestError, match=exc.message[:20]):
            decode_rgb(_open(corrupt, 0), corrupt)
    else:
        assert np.array_equal(decode_rgb(_open(corrupt, 0), corrupt), expected)
