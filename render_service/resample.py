"""Antialiased bicubic resize of uint8 images, bit-exact with torch's CPU kernel, in NumPy.

vLLM resizes Qwen-VL images with torchvision (`resize(..., BICUBIC, antialias=True)` on uint8
tensors), which runs ATen's separable uint8 kernel: per axis, PIL-style weights computed in
double, rounded to int16 with a precision chosen from the largest weight, an integer
multiply-accumulate with a rounding bias, an arithmetic shift and a clamp to 0..255; width
first, then height, with a uint8 intermediate. Pillow's own BICUBIC differs by up to a few
levels (22-bit weights, a different cubic polynomial form), so it is not used here.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_A = -0.5  # Keys' cubic with a = -0.5, as PIL and ATen's antialiased kernel use


def _cubic(x: float) -> float:
    # ATen's cubic_convolution1/2, in their exact operation order (doubles round differently
    # in PIL's equivalent polynomial form).
    x = abs(x)
    if x < 1.0:
        return ((_A + 2) * x - (_A + 3)) * x * x + 1
    if x < 2.0:
        return ((_A * x - 5 * _A) * x + 8 * _A) * x - 4 * _A
    return 0.0


@lru_cache(maxsize=256)
def _weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(first input index per output, int16-scaled weights [out, taps], precision bits)."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    taps = math.ceil(support) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    starts = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, taps), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xsize = min(int(center + support + 0.5), in_size) - xmin
        row = [_cubic((j + xmin - center + 0.5) * invscale) for j in range(xsize)]
        total = 0.0
        for w in row:
            total += w
        if total != 0.0:
            row = [w / total for w in row]
        starts[i] = xmin
        weights[i, :xsize] = row
    w_max = float(weights.flat[0])
    for v in weights.flat:
        if w_max < v:
            w_max = float(v)
    precision = 0
    while precision < 22:
        if int(0.5 + w_max * (1 << (precision + 1))) >= (1 << 15):
            break
        precision += 1
    scaled = weights * (1 << precision)
    ints = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    return starts, ints, precision


def _resize_axis(image: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    in_size = image.shape[axis]
    starts, weights, precision = _weights(in_size, out_size)
    acc = np.full(
        (*image.shape[:axis], out_size, *image.shape[axis + 1:]), 1 << (precision - 1),
        dtype=np.int32,
    )
    shape = [1] * image.ndim
    shape[axis] = out_size
    for k in range(weights.shape[1]):
        column = weights[:, k]
        if not column.any():
            continue
        # Taps past an output's window carry weight 0; clamp their index to stay in bounds.
        index = np.minimum(starts + k, in_size - 1)
        acc += np.take(image, index, axis=axis).astype(np.int32) * column.reshape(shape)
    acc >>= precision
    return np.clip(acc, 0, 255).astype(np.uint8)


def resize_bicubic_aa(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an (H, W, C) uint8 array to (height, width, C)."""
    if image.shape[1] != width:
        image = _resize_axis(image, 1, width)
    if image.shape[0] != height:
        image = _resize_axis(image, 0, height)
    return image
