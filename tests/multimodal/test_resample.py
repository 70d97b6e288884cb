"""resample: the BLAS band-matrix resize against the tap-by-tap integer transcription of ATen's
uint8 antialiased bicubic kernel, on random images and sizes (float32 and float64 paths)."""

from __future__ import annotations

import numpy as np
import pytest

from render_service.multimodal import resample
from render_service.multimodal.resample import (
    resize_bands,
    resize_bicubic_aa,
    resize_bicubic_aa_reference,
    resize_planar,
)


def _sizes(seed: int, count: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(1, 260, 2))
        # up, down, a little either way, or unchanged, per axis
        factors = rng.choice([0.13, 0.5, 0.97, 1.0, 1.03, 2.0, 3.7], 2)
        oh, ow = max(1, round(h * factors[0])), max(1, round(w * factors[1]))
        out.append((h, w, oh, ow))
    return out


@pytest.mark.parametrize(("h", "w", "oh", "ow"), _sizes(8, 60))
def test_fast_resize_matches_reference(h: int, w: int, oh: int, ow: int) -> None:
    image = np.random.default_rng(h * 1000 + w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected = resize_bicubic_aa_reference(image, oh, ow)
    got = resize_bicubic_aa(image, oh, ow)
    assert got.dtype == np.uint8 and got.shape == (oh, ow, 3)
    assert np.array_equal(got, expected), int(np.abs(got.astype(int) - expected.astype(int)).max())
    planar = resize_planar(image, oh, ow)
    assert planar.dtype == np.uint8 and planar.flags.c_contiguous
    assert np.array_equal(planar.transpose(1, 2, 0), expected)


@pytest.mark.parametrize(
    ("h", "w", "oh", "ow"),
    [
        (720, 1280, 704, 1280),  # the 720p case: height only, float32
        (150, 2000, 150, 37),  # a strong downscale: partial sums past 2^24, so float64
        (37, 33, 1000, 29),  # a strong upscale of one axis, a slight downscale of the other
        (1, 1, 32, 32),
        (256, 256, 256, 256),  # nothing to do
        (1500, 64, 1100, 64),  # height only across many tiles (the interleaved-rows path)
        (1100, 70, 1500, 96),  # both passes, the height pass over planes across many tiles
    ],
)
def test_edge_sizes_match_reference(h: int, w: int, oh: int, ow: int) -> None:
    rng = np.random.default_rng(h + w)
    # Extremes as well as noise: all-0 and all-255 rows stress the clamp on both ends.
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image[: h // 3] = 255
    image[h // 3 : h // 2, ::2] = 0
    assert np.array_equal(resize_bicubic_aa(image, oh, ow), resize_bicubic_aa_reference(image, oh, ow))


def test_float_type_is_chosen_by_the_exactness_bound() -> None:
    assert resample._bound(2000, 37) >= 1 << 24
    assert resample.pass_dtype(150, 2000, 150, 37) is np.float64
    assert resample._bound(720, 704) < 1 << 24
    assert resample.pass_dtype(720, 1280, 704, 1280) is np.float32


@pytest.mark.parametrize(
    ("h", "w", "oh", "ow", "band"),
    [
        (720, 1280, 704, 1280, 32),  # height only: bands cast from the interleaved tiles
        (451, 97, 448, 96, 32),  # both passes: bands cast from planar tiles
        (300, 200, 300, 200, 32),  # no resize: bands of the planes
        (200, 300, 200, 256, 32),  # width only
        (100, 60, 140, 84, 28),  # upscale, a band of 28 (patch 14, merge 2): blocks of 7 rows
        (90, 64, 77, 64, 32),  # a last, shorter band
    ],
)
def test_resize_bands_are_resize_planar_in_order(h: int, w: int, oh: int, ow: int, band: int) -> None:
    image = np.random.default_rng(h + w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected = resize_planar(image, oh, ow)
    got: list[np.ndarray] = []

    def sink(planes: np.ndarray) -> None:
        assert planes.dtype == np.uint8 and planes.flags.c_contiguous
        got.append(planes.copy())  # the buffer is reused for the next band

    resize_bands(image, oh, ow, band, sink)
    assert [b.shape[1] for b in got] == [min(band, oh - r) for r in range(0, oh, band)]
    assert np.array_equal(np.concatenate(got, axis=1), expected)
