"""Antialiased bicubic resize of uint8 images, bit-exact with torch's CPU kernel, in NumPy.

vLLM resizes Qwen-VL images with torchvision (`resize(..., BICUBIC, antialias=True)` on uint8
tensors), which runs ATen's separable uint8 kernel: per axis, PIL-style weights computed in
double, rounded to int16 with a precision chosen from the largest weight, an integer
multiply-accumulate with a rounding bias, an arithmetic shift and a clamp to 0..255; width
first, then height, with a uint8 intermediate. Pillow's own BICUBIC differs by up to a few
levels (22-bit weights, a different cubic polynomial form), so it is not used here.

Fast path (`resize_planar`): each axis pass is a banded matrix product done by BLAS on floats,
one small dense block of the band per group of output rows. It is exact, not approximate: the
int16 weights are pre-scaled by 2^-precision (a power of two, so exact), every product and every
partial sum is a multiple of 2^-precision no larger than sum(|w|) * 255 + bias, and the float
type is chosen per resize so that bound fits its mantissa (float32 below 2^24, else float64).
Exact partial sums make the result independent of BLAS's summation order; adding the rounding
bias (0.5 after scaling), clamping to 0..255 and truncating is then ATen's `(acc + bias) >> p`
followed by its clamp. `resize_bicubic_aa_reference` is the direct integer transcription the
fast path is tested against.

The height pass (the only one for most photos, whose width is already a multiple of the patch
grid) runs on the decoded interleaved rows as they are and in tiles of output rows, so the float
copies stay in the cache and the result is de-interleaved into planes by its final uint8 cast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache, lru_cache

import numpy as np

_A = -0.5  # Keys' cubic with a = -0.5, as PIL and ATen's antialiased kernel use
# Outputs per band block: small enough to skip most zeros, big enough for BLAS (measured best for
# 720p-4k: 8 for the height pass, whose products are wide; 32 for the width pass, whose are tall).
_BLOCK = {1: 8, 2: 32}
# Output rows per tile of the height pass: its float rows (~15 KB each at 1280 RGB pixels) stay
# in the L2 cache between the cast, the products, the bias, the clamp and the final cast.
_TILE_ROWS = 32
_F32_EXACT = 1 << 24  # integers up to this (and their power-of-two scalings) are exact in float32


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


# -- reference: ATen's integer arithmetic, tap by tap ---------------------------------------


def _resize_axis_reference(image: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    in_size = image.shape[axis]
    starts, weights, precision = _weights(in_size, out_size)
    acc = np.full(
        (*image.shape[:axis], out_size, *image.shape[axis + 1 :]),
        1 << (precision - 1),
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


def resize_bicubic_aa_reference(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an (H, W, C) uint8 array to (height, width, C): the slow, obviously-ATen version."""
    if image.shape[1] != width:
        image = _resize_axis_reference(image, 1, width)
    if image.shape[0] != height:
        image = _resize_axis_reference(image, 0, height)
    return image


# -- fast path: banded BLAS products on floats -----------------------------------------------


@lru_cache(maxsize=256)
def _bound(in_size: int, out_size: int) -> int:
    """The largest |partial sum| (in units of 2^-precision) a pass can reach, bias included."""
    _, weights, precision = _weights(in_size, out_size)
    return 255 * int(np.abs(weights).sum(axis=1).max()) + (1 << (precision - 1))


@lru_cache(maxsize=256)
def _bands(
    in_size: int, out_size: int, dtype: type, block_size: int
) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """Dense blocks of the band of weights scaled by 2^-precision: ((out0, out1, in0, in1, block), ...)."""
    starts, weights, precision = _weights(in_size, out_size)
    nonzero = weights != 0
    # Window length per output: up to its last nonzero tap (the zero tail may run past the edge).
    lengths = np.where(nonzero.any(axis=1), weights.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 0)
    ends = np.minimum(starts + lengths, in_size)
    scaled = weights.astype(np.float64) * 2.0**-precision
    blocks: list[tuple[int, int, int, int, np.ndarray]] = []
    for out0 in range(0, out_size, block_size):
        out1 = min(out0 + block_size, out_size)
        in0 = int(starts[out0:out1].min())
        in1 = max(int(ends[out0:out1].max()), in0 + 1)
        block = np.zeros((out1 - out0, in1 - in0), dtype=np.float64)
        for i in range(out0, out1):
            n = int(ends[i] - starts[i])
            block[i - out0, starts[i] - in0 : starts[i] - in0 + n] = scaled[i, :n]
        blocks.append((out0, out1, in0, in1, block.astype(dtype)))
    return tuple(blocks)


def _pass(src: np.ndarray, axis: int, out_size: int, dtype: type, last: bool = False) -> np.ndarray:
    """The width pass of a (C, H, W) float array, rounded and clamped as ATen's uint8 pass (values
    stay integral floats in 0..255; with `last`, a uint8 array, the truncation done by the cast)."""
    assert axis == 2
    blocks = _bands(src.shape[2], out_size, dtype, _BLOCK[2])
    dst: np.ndarray = np.empty((*src.shape[:2], out_size), dtype=dtype)
    # columns @ block^T, channels and rows flattened
    flat_src = src.reshape(-1, src.shape[2])
    flat_dst = dst.reshape(-1, out_size)
    for out0, out1, in0, in1, block in blocks:
        np.matmul(flat_src[:, in0:in1], block.T, out=flat_dst[:, out0:out1])
    dst += 0.5  # the rounding bias, 1 << (precision - 1), after scaling by 2^-precision
    np.clip(dst, 0, 255, out=dst)
    if last:  # float -> uint8 truncates, and the values are in 0..255.5: the shift, in the cast
        return dst.astype(np.uint8)
    np.trunc(dst, out=dst)  # the arithmetic shift (a floor: negatives were clamped to 0 already)
    return dst


def _height_pass(
    src: np.ndarray,
    out_size: int,
    dtype: type,
    write: Callable[[int, int, np.ndarray], None],
    tile_rows: int = _TILE_ROWS,
) -> None:
    """The height pass of a (B, H, N) stack (B=1, N=W*C for interleaved pixels; B=C, N=W for
    planes), any numeric dtype holding integral 0..255, in tiles of output rows: each tile's input
    rows are cast to `dtype`, multiplied by the band blocks, biased and clamped while they are in
    the cache, then handed to `write(row0, row1, tile)` (a (B, rows, N) float array whose
    truncation to uint8 is ATen's shift). Whole-image float passes moved ~4x more memory.
    Tiles start at multiples of `tile_rows` (the band blocks are sized to divide it)."""
    batch, in_size, width = src.shape
    tiles, rows_in = _tiles(in_size, out_size, dtype, tile_rows)
    convert = src.dtype != dtype
    floats: np.ndarray | None = np.empty((batch, rows_in, width), dtype=dtype) if convert else None
    tile_out: np.ndarray = np.empty((batch, tile_rows, width), dtype=dtype)
    matmul, copyto, clip = np.matmul, np.copyto, np.clip
    for row0, row1, first, end, products in tiles:
        if floats is not None:
            rows = floats[:, : end - first]
            copyto(rows, src[:, first:end], casting="unsafe")
        else:
            rows = src[:, first:end]
        out = tile_out[:, : row1 - row0]
        for block, in0, in1, out0, out1 in products:
            matmul(block, rows[:, in0:in1], out=out[:, out0:out1])
        out += 0.5  # the rounding bias, 1 << (precision - 1), after scaling by 2^-precision
        clip(out, 0, 255, out=out)
        write(row0, row1, out)


@lru_cache(maxsize=256)
def _tiles(
    in_size: int, out_size: int, dtype: type, tile_rows: int
) -> tuple[tuple[tuple[int, int, int, int, tuple[tuple[np.ndarray, int, int, int, int], ...]], ...], int]:
    """The height pass's plan, worked out once per size: per tile (row0, row1, first input row,
    end input row, its band blocks with their input and output offsets within the tile), and the
    most input rows a tile needs. The blocks are sized to divide `tile_rows`."""
    block_size = max(d for d in range(1, _BLOCK[1] + 1) if tile_rows % d == 0)
    blocks = _bands(in_size, out_size, dtype, block_size)
    per_tile = tile_rows // block_size
    plan = []
    for i in range(0, len(blocks), per_tile):
        group = blocks[i : i + per_tile]
        row0, row1 = group[0][0], group[-1][1]
        first, end = min(b[2] for b in group), max(b[3] for b in group)
        products = tuple((b[4], b[2] - first, b[3] - first, b[0] - row0, b[1] - row0) for b in group)
        plan.append((row0, row1, first, end, products))
    return tuple(plan), max(end - first for _, _, first, end, _ in plan)


@cache
def _single_threaded_blas() -> None:
    """Keep BLAS on the calling thread. The service runs one worker process per core, so BLAS
    threads would only compete with the other workers, and OpenBLAS's idle threads spin (measured:
    2-5x the CPU time for the same products). Needs threadpoolctl; without it BLAS keeps its
    default (the results are the same, only the CPU cost differs)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


def pass_dtype(in_height: int, in_width: int, height: int, width: int) -> type:
    """float32 where every partial sum of both passes is exact in its mantissa, else float64."""
    bound = max(
        _bound(in_width, width) if in_width != width else 0,
        _bound(in_height, height) if in_height != height else 0,
    )
    return np.float32 if bound < _F32_EXACT else np.float64


def _height_stack(image: np.ndarray, height: int, width: int) -> tuple[np.ndarray | None, np.ndarray | None, type]:
    """(planes, None, dtype) when no height pass is needed (uint8 planes, the resize done), else
    (None, stack, dtype): the (B, H, N) input of the height pass (the width pass done)."""
    in_height, in_width, channels = image.shape
    need_w, need_h = in_width != width, in_height != height
    if not (need_w or need_h):
        return np.ascontiguousarray(image.transpose(2, 0, 1)), None, np.float32
    dtype = pass_dtype(in_height, in_width, height, width)
    _single_threaded_blas()
    if need_w:  # width first, as ATen (its uint8 intermediate is our clamped, truncated floats)
        planes: np.ndarray = np.array(image.transpose(2, 0, 1), dtype=dtype, order="C")
        planes = _pass(planes, 2, width, dtype, last=not need_h)
        if not need_h:
            return planes, None, dtype
        return None, planes, dtype  # (C, H, width): one band product per channel
    # height only (most photos: their width is already a multiple of the patch grid)
    return None, image.reshape(1, in_height, in_width * channels), dtype  # interleaved rows, no copy


def _tile_planes(tile: np.ndarray, rows: int, width: int, channels: int) -> np.ndarray:
    """A height-pass tile as a (C, rows, W) view: planes as they are, interleaved rows split."""
    if tile.shape[0] == channels and tile.shape[2] == width:
        return tile
    return tile[0].reshape(rows, width, channels).transpose(2, 0, 1)


def resize_planar(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """(H, W, C) uint8 -> C-contiguous (C, height, width) uint8 planes, bit-exact with ATen's uint8
    AA bicubic (what patchify copies fastest)."""
    channels = image.shape[2]
    planes, stack, dtype = _height_stack(image, height, width)
    if planes is not None:
        return planes
    assert stack is not None
    out = np.empty((channels, height, width), dtype=np.uint8)

    def write(row0: int, row1: int, tile: np.ndarray) -> None:
        # float -> uint8 truncates, and the values are in 0..255.5: ATen's shift, in the cast
        # (interleaved rows are de-interleaved by the cast's copy)
        np.copyto(out[:, row0:row1], _tile_planes(tile, row1 - row0, width, channels), casting="unsafe")

    _height_pass(stack, height, dtype, write)
    return out


def resize_bands(image: np.ndarray, height: int, width: int, band: int, sink: Callable[[np.ndarray], None]) -> None:
    """`resize_planar`, handed over in bands: `sink(planes)` gets C-contiguous (C, band, width)
    uint8 planes of output rows 0..band, band..2*band, ... in order (the last band may be shorter). With a height pass each band is cast from its tile while the
    tile is in the CPU cache, and one band-sized buffer is reused: `sink` must be done with it when
    it returns. Bit-exact with `resize_planar` (the same products, staged differently)."""
    channels = image.shape[2]
    planes, stack, dtype = _height_stack(image, height, width)
    if planes is not None:
        for row0 in range(0, height, band):
            sink(np.ascontiguousarray(planes[:, row0 : row0 + band]))
        return
    assert stack is not None
    buffer = np.empty((channels, band, width), dtype=np.uint8)

    def write(row0: int, row1: int, tile: np.ndarray) -> None:
        target = buffer if row1 - row0 == band else np.empty((channels, row1 - row0, width), dtype=np.uint8)
        np.copyto(target, _tile_planes(tile, row1 - row0, width, channels), casting="unsafe")
        sink(target)

    _height_pass(stack, height, dtype, write, tile_rows=band)


def resize_bicubic_aa(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an (H, W, C) uint8 array to (height, width, C)."""
    if image.shape[0] == height and image.shape[1] == width:
        return image
    return np.ascontiguousarray(resize_planar(image, height, width).transpose(1, 2, 0))
