"""Images to vLLM-ready `features` for Qwen3-VL, without torch.

What vLLM 0.33 does for an `image_url` part, step by step, and what this module reproduces:

1. Load: Pillow opens the bytes (formats allow-list), applies the EXIF orientation, converts
   to RGB (transparent images over a white background). RGB JPEGs without a transposing
   orientation decode straight to an array through libjpeg-turbo (`turbo_jpeg`), the same pixels.
2. Hash (`MultiModalHasher.hash_kwargs`, blake3): the framed byte stream of
   `image=<original bytes>` (plus the decode settings when the mode was converted) and
   `model_id=<model as given on the command line>`. Engines key their encoder caches on it.
3. Process (HF `Qwen2VLImageProcessor`, torchvision backend, with vLLM's default
   `mm_device_do_normalize`: no rescale/normalize on the CPU): `smart_resize` to multiples of
   patch*merge, antialiased bicubic resize of the uint8 image (`resample.py`, bit-exact),
   patchify into `(grid_h*grid_w, 3*T*P*P)` uint8 rows, `image_grid_thw = [1, gh, gw]`.
4. Prompt: each `<|image_pad|>` the template emitted becomes `t*h*w / merge^2` of them; the
   placeholder range is that run.
5. Encode (`mm_serde.encode_mm_kwargs_item`): msgpack of the item's fields, tensors inline as
   `(dtype, shape, Ext(3, raw bytes))`, base64. `mm_metadata` keeps `image_grid_thw`
   (a `keep_on_cpu` field).

Processed items are cached by hash (bytes-bounded LRU), so a re-sent image costs one hash.
A request with `mm_payload: "none"` only needs the hash and the grid: its images are decoded
(vLLM decodes them too, so a broken image is the same 400) but not resized, patchified or
encoded, and cached as light items that a later tensors request completes.

Processor kwargs: `--mm-processor-kwargs` sets the processor's resize bounds (`size`,
`min_pixels`, `max_pixels`); a request's `mm_processor_kwargs` (with `--trust-request-mm-kwargs`)
override them edge by edge (`request_bounds`). Other keys that
would change the image are refused. The request's kwargs (never the server's) enter the hash as
vLLM's `hash_factors`.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import xxhash
from blake3 import blake3
from PIL import Image, ImageOps

# vLLM's base64 (SIMD): ~50x faster than binascii on the megabytes of pixels per image
from pybase64 import b64encode as _b64encode

from render_service.exceptions import BadRequestError
from render_service.multimodal import b64stream, turbo_jpeg
from render_service.multimodal.resample import resize_bands, resize_planar

SUPPORTED_MODEL_TYPES = ("qwen3_vl",)
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # Qwen3-VL's get_placeholder_str
# vLLM's ALLOWED_IMAGE_FORMATS (those this Pillow build registers).
_VLLM_IMAGE_FORMATS = (
    "AVIF",
    "BLP",
    "BMP",
    "CUR",
    "DCX",
    "DDS",
    "DIB",
    "FITS",
    "FLI",
    "FTEX",
    "GBR",
    "GIF",
    "ICNS",
    "ICO",
    "IM",
    "IMT",
    "IPTC",
    "JPEG",
    "JPEG2000",
    "MCIDAS",
    "MSP",
    "PCD",
    "PCX",
    "PIXAR",
    "PNG",
    "PPM",
    "PSD",
    "QOI",
    "SGI",
    "SPIDER",
    "SUN",
    "TGA",
    "TIFF",
    "WEBP",
    "XBM",
    "XPM",
    "XVTHUMB",
)
Image.init()
ALLOWED_IMAGE_FORMATS = tuple(f for f in _VLLM_IMAGE_FORMATS if f in Image.OPEN)
_RAW_VIEW = 3  # vLLM's CUSTOM_TYPE_RAW_VIEW msgpack extension
_WHITE = (255, 255, 255)


@dataclass(frozen=True)
class VisionConfig:
    """What the processor needs, read from config.json and preprocessor_config.json."""

    model_id: str
    image_token_id: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    placeholder: str = IMAGE_PLACEHOLDER

    @classmethod
    def load(cls, model_dir: Path, model_id: str) -> VisionConfig | None:
        """None for a model this module does not process (text-only or another family)."""
        try:
            config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
            return None
        try:
            pre = json.loads((model_dir / "preprocessor_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pre = {}
        vision = config.get("vision_config") or {}
        size = pre.get("size") or {}
        return cls(
            model_id=model_id,
            image_token_id=int(config.get("image_token_id", 151655)),
            patch_size=int(pre.get("patch_size", vision.get("patch_size", 16))),
            merge_size=int(pre.get("merge_size", vision.get("spatial_merge_size", 2))),
            temporal_patch_size=int(pre.get("temporal_patch_size", vision.get("temporal_patch_size", 2))),
            min_pixels=int(pre.get("min_pixels", size.get("shortest_edge", 65536))),
            max_pixels=int(pre.get("max_pixels", size.get("longest_edge", 16777216))),
        )


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' qwen2_vl `smart_resize` (the image variant Qwen3-VL uses)."""
    if max(height, width) / min(height, width) > 200:
        raise BadRequestError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}",
            param="messages",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# -- loading --------------------------------------------------------------------------------


def _has_transparency(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or "transparency" in getattr(image, "info", {})


def _open(data: bytes, max_pixels: int) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=ALLOWED_IMAGE_FORMATS)
        w, h = image.size
    except (
        OSError,
        Image.UnidentifiedImageError,
        SyntaxError,
        Image.DecompressionBombWarning,
        Image.DecompressionBombError,
    ) as exc:
        raise BadRequestError(f"Failed to load image: {exc}", param="messages") from None
    if max_pixels > 0 and w * h > max_pixels:
        raise BadRequestError(
            f"Image dimensions {w}x{h} ({w * h} pixels) exceed the maximum of {max_pixels} pixels.", param="messages"
        )
    return image


def _needs_conversion(image: Image.Image) -> bool:
    return _has_transparency(image) or image.mode != "RGB"


def decode_rgb(image: Image.Image, data: bytes | None = None) -> np.ndarray:
    """vLLM's ImageMediaIO.load_bytes after `open`: EXIF transpose, load, RGB conversion.
    `data`: the bytes `image` was opened from, for the direct JPEG decode (`turbo_jpeg.decode`)."""
    if data is not None:
        pixels = turbo_jpeg.decode(image, data)
        if pixels is not None:
            return pixels
    try:
        try:
            # In place: vLLM's copy (exif_transpose without in_place) has the same pixels, and
            # without an orientation tag there is nothing to do, so no 4-byte-per-pixel copy.
            ImageOps.exif_transpose(image, in_place=True)
        except Exception:
            pass
        image.load()
        if _has_transparency(image):
            if image.mode != "RGBA":
                image = image.convert("RGBA")
            converted = Image.new("RGB", image.size, _WHITE)
            converted.paste(image, mask=image.split()[3])
            image = converted
        elif image.mode != "RGB":
            image = image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadRequestError(f"Failed to load image: {exc}", param="messages") from None
    return np.asarray(image)


# -- hashing --------------------------------------------------------------------------------


def _framed(chunk: bytes) -> bytes:
    return len(chunk).to_bytes(8, "little") + chunk


def _hash_value(value: Any) -> bytes:
    """`MultiModalHasher.iter_value_to_bytes` for JSON values."""
    if value is None:
        return b"\x00"
    if isinstance(value, (list, tuple)):
        return b"\x01" + len(value).to_bytes(8, "little") + b"".join(_hash_value(v) for v in value)
    if isinstance(value, dict):
        return (
            b"\x02"
            + len(value).to_bytes(8, "little")
            + b"".join(_framed(str(k).encode("utf-8")) + _hash_value(v) for k, v in value.items())
        )
    if isinstance(value, str):
        return b"\x03" + _framed(value.encode("utf-8"))
    # bool is an int there too: np.array(True) is one byte, ints int64, floats float64
    return b"\x03" + _framed(np.array(value).tobytes())


def mm_hash(data: bytes, model_id: str, converted: bool, processor_kwargs: dict[str, Any] | None = None) -> str:
    """`MultiModalHasher.hash_kwargs("blake3", model_id=..., image=MediaWithBytes(...),
    [mm_processor_kwargs=...])`, keys in sorted order."""
    hasher = blake3()
    hasher.update(_framed(b"image") + b"\x03" + _framed(b"image"))
    if converted:
        # {"io_config": {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}, "data": bytes}
        hasher.update(b"\x02" + (2).to_bytes(8, "little"))
        hasher.update(_framed(b"io_config") + b"\x02" + (2).to_bytes(8, "little"))
        hasher.update(_framed(b"image_mode") + b"\x03" + _framed(b"RGB"))
        hasher.update(_framed(b"rgba_background_color") + b"\x01" + (3).to_bytes(8, "little"))
        for channel in _WHITE:
            hasher.update(b"\x03" + _framed(np.array(channel).tobytes()))
        hasher.update(_framed(b"data"))
    hasher.update(b"\x03")
    hasher.update(_framed(data))
    if processor_kwargs:
        hasher.update(_framed(b"mm_processor_kwargs") + _hash_value(processor_kwargs))
    hasher.update(_framed(b"model_id") + b"\x03" + _framed(model_id.encode("utf-8")))
    return hasher.hexdigest()


# -- processor kwargs -----------------------------------------------------------------------

_OTHER_MODALITY_SCOPES = ("videos_kwargs", "audio_kwargs")  # text_kwargs is shared: it stays in the hash
# Qwen2VLImageProcessor's valid kwargs (transformers 5.x ImagesKwargs + its own): the flat keys vLLM
# routes into `images_kwargs`.
_IMAGE_KWARGS = frozenset(
    (
        "do_convert_rgb",
        "do_resize",
        "size",
        "crop_size",
        "resample",
        "do_rescale",
        "rescale_factor",
        "do_normalize",
        "image_mean",
        "image_std",
        "do_pad",
        "pad_size",
        "do_center_crop",
        "data_format",
        "input_data_format",
        "device",
        "return_tensors",
        "disable_grouping",
        "image_seq_length",
        "min_pixels",
        "max_pixels",
        "patch_size",
        "temporal_patch_size",
        "merge_size",
    )
)
# Of those, what this service implements; do_rescale/do_normalize are forced off by vLLM's
# mm_device_do_normalize whatever is asked, and return_tensors is always vLLM's.
_IMAGE_KWARGS_DONE = frozenset(("size", "min_pixels", "max_pixels", "do_rescale", "do_normalize", "return_tensors"))


def _pixels(value: Any, name: str) -> int:
    if type(value) is not int or value <= 0:
        raise BadRequestError(
            f"mm_processor_kwargs: {name} must be a positive integer, got {value!r}", param="mm_processor_kwargs"
        )
    return value


def _apply_level(kwargs: dict[str, Any], bounds: tuple[int, int]) -> tuple[int, int]:
    """One level's `size` edges, then its `min_pixels` / `max_pixels` (Qwen-VL `_get_vision_size`)."""
    unsupported = sorted(k for k in kwargs if k not in _IMAGE_KWARGS_DONE)
    if unsupported:
        raise BadRequestError(
            f"mm_processor_kwargs {', '.join(unsupported)} not supported by this render service for images "
            "(supported: size, min_pixels, max_pixels)",
            param="mm_processor_kwargs",
        )
    low, high = bounds
    size = kwargs.get("size")
    if size is not None:
        if not isinstance(size, dict) or not set(size) <= {"shortest_edge", "longest_edge"}:
            raise BadRequestError(
                "mm_processor_kwargs: size must be a mapping of shortest_edge and/or longest_edge (pixel counts)",
                param="mm_processor_kwargs",
            )
        low = _pixels(size.get("shortest_edge", low), "size.shortest_edge")
        high = _pixels(size.get("longest_edge", high), "size.longest_edge")
    if kwargs.get("min_pixels") is not None:
        low = _pixels(kwargs["min_pixels"], "min_pixels")
    if kwargs.get("max_pixels") is not None:
        high = _pixels(kwargs["max_pixels"], "max_pixels")
    return low, high


def server_bounds(kwargs: dict[str, Any], min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The processor's resize bounds under `--mm-processor-kwargs` (flat `size`, `min_pixels`,
    `max_pixels`: what vLLM builds its processor with and merges under every request's)."""
    extra = sorted(k for k in kwargs if k not in ("size", "min_pixels", "max_pixels"))
    if extra:
        raise BadRequestError(
            f"{', '.join(extra)} not supported (supported: size, min_pixels, max_pixels)", param="mm_processor_kwargs"
        )
    return _apply_level(kwargs, (min_pixels, max_pixels))


def request_bounds(kwargs: dict[str, Any], bounds: tuple[int, int]) -> tuple[int, int]:
    """A request's kwargs over the server's bounds. As recorded from vLLM 0.33 (golden_mm_kwargs/),
    each edge comes from the most specific level that sets it (server < request flat < request
    `images_kwargs`), and within a level `min_pixels`/`max_pixels` beat `size`: a request's `size`
    wins over a server-wide `max_pixels`, a request's scoped `size` over its flat `min_pixels`."""
    scope = kwargs.get("images_kwargs")
    if scope is not None and not isinstance(scope, dict):
        raise BadRequestError("mm_processor_kwargs: images_kwargs must be a mapping", param="mm_processor_kwargs")
    flat = {k: v for k, v in kwargs.items() if k in _IMAGE_KWARGS}  # the flat keys vLLM routes to images
    return _apply_level(scope or {}, _apply_level(flat, bounds))


def hash_factor(request: dict[str, Any]) -> dict[str, Any]:
    """What of the request's kwargs enters an image's hash (vLLM's `get_mm_hashes`): all but the
    other modalities' scopes."""
    return {k: v for k, v in request.items() if k not in _OTHER_MODALITY_SCOPES}


@dataclass(frozen=True)
class ImageOptions:
    """Per-request processing of images: resize bounds and the hash factor."""

    min_pixels: int
    max_pixels: int
    hash_kwargs: dict[str, Any]


# -- processing -----------------------------------------------------------------------------


def patchify(planes: np.ndarray, patch: int, merge: int, temporal: int) -> tuple[np.ndarray, int, int]:
    """(C, H, W) integral values 0..255 (any numeric dtype) -> (gh*gw, C*T*P*P) uint8 rows in the HF
    processor's order, written by one strided cast-copy (plus one uint8 copy per extra frame)."""
    channels, height, width = planes.shape
    gh, gw = height // patch, width // patch
    if planes.dtype == np.uint8 and planes.flags.c_contiguous and width == gw * patch:
        return _patchify_rows(planes, patch, merge, temporal), gh, gw
    blocks = planes.reshape(channels, gh // merge, merge, patch, gw // merge, merge, patch)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, P, P)
    out = np.empty((*blocks.shape[:5], temporal, patch, patch), dtype=np.uint8)
    np.copyto(out[:, :, :, :, :, 0], blocks, casting="unsafe")  # exact: the values are integral 0..255
    for frame in range(1, temporal):  # one frame repeated temporal_patch_size times
        out[:, :, :, :, :, frame] = out[:, :, :, :, :, 0]
    return out.reshape(gh * gw, channels * temporal * patch * patch), gh, gw


def _patch_views(
    planes: np.ndarray, patch: int, merge: int, temporal: int, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source, target, rows): `np.copyto(target, source)` writes the patch rows of contiguous
    uint8 planes into `rows` (gh*gw, C*T*P*P), each patch row (P bytes) moved as one opaque item:
    the same bytes, copied ~6x faster than byte by byte through a 7-dimensional stride. `out`: a
    C-contiguous uint8 array of the rows' size to write into (reused across bands)."""
    channels, height, width = planes.shape
    gh, gw = height // patch, width // patch
    items = planes.view(np.dtype((np.void, patch)))  # (C, H, gw): one item per patch row
    blocks = items.reshape(channels, gh // merge, merge, patch, gw // merge, merge)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3)  # (gh/m, gw/m, m, m, C, P)
    shape = (*blocks.shape[:5], temporal, patch)
    target = np.empty(shape, dtype=items.dtype) if out is None else out.view(items.dtype).reshape(shape)
    rows = target.view(np.uint8).reshape(gh * gw, channels * temporal * patch * patch)
    return blocks[:, :, :, :, :, None], target, rows  # one frame repeated temporal_patch_size times


def _patchify_rows(planes: np.ndarray, patch: int, merge: int, temporal: int) -> np.ndarray:
    """`patchify` of contiguous uint8 planes (`_patch_views`, copied)."""
    source, target, rows = _patch_views(planes, patch, merge, temporal)
    np.copyto(target, source)
    return rows


@dataclass(frozen=True)
class ProcessedImage:
    mm_hash: str
    num_tokens: int
    # base64 msgpack MultiModalKwargsItem, already a JSON string (quotes included): a response
    # copies it into its body instead of re-scanning megabytes of base64 for escapes.
    # None in a light item (processed for `mm_payload: "none"`: hash, grid and metadata only).
    kwargs_data: orjson.Fragment | None
    kwargs_json: bytes | None  # the same bytes, for json_parts
    metadata: str  # base64 msgpack of the keep_on_cpu fields
    nbytes: int

    @property
    def has_tensors(self) -> bool:
        return self.kwargs_json is not None


_encoder = msgspec.msgpack.Encoder()


def _tensor(dtype: str, array: np.ndarray) -> tuple[str, tuple[int, ...], msgspec.msgpack.Ext]:
    # msgspec copies the buffer into its output once; no intermediate bytes object
    return dtype, tuple(array.shape), msgspec.msgpack.Ext(_RAW_VIEW, np.ascontiguousarray(array).data)


# Stands in for the pixel bytes while the rest of an item is encoded (as msgpack's fixext 16), so
# the megabytes of pixels are base64-encoded straight from the patchified array.
_PIXELS_STANDIN = msgspec.msgpack.Ext(_RAW_VIEW, b"\x00render-pixels\x00\xff")
_STANDIN_BYTES = b"\xd8" + bytes([_RAW_VIEW]) + _PIXELS_STANDIN.data


def ext_header(size: int, code: int) -> bytes:
    """msgpack's header of an extension value of `size` bytes (the shortest form, as msgspec writes)."""
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(size)
    if fixed is not None:
        return bytes((fixed, code))
    if size < 1 << 8:
        return bytes((0xC7, size, code))
    if size < 1 << 16:
        return b"\xc8" + size.to_bytes(2, "big") + bytes((code,))
    return b"\xc9" + size.to_bytes(4, "big") + bytes((code,))


def _json_b64_msgpack(item: dict[str, Any], pixels: np.ndarray) -> bytes:
    """`b'"' + b64encode(msgpack(item)) + b'"'` where the item's one `_PIXELS_STANDIN` stands for
    the raw bytes of `pixels`, without building the msgpack document or the unquoted base64: base64
    maps every 3 input bytes to 4 characters on their own, so the document is encoded in three
    pieces cut at multiples of 3 (head and first bytes, the bulk of the pixels straight from their
    array, the last bytes and tail) and the quotes are joined on in the one copy."""
    data = np.ascontiguousarray(pixels).data.cast("B")
    head, tail = _split_item(item, len(data))
    lead = -len(head) % 3
    if len(data) < lead:  # too few pixels to align on: one piece
        return b'"' + _b64encode(head + bytes(data) + tail) + b'"'
    bulk_end = lead + (len(data) - lead) // 3 * 3
    return b"".join(
        (
            b'"',
            _b64encode(head + data[:lead]),
            _b64encode(data[lead:bulk_end]),
            _b64encode(bytes(data[bulk_end:]) + tail),
            b'"',
        )
    )


def _grid(height: int, width: int, config: VisionConfig, options: ImageOptions | None) -> tuple[int, int]:
    """The resized (height, width) of an image under the processor's bounds."""
    min_pixels, max_pixels = (
        (options.min_pixels, options.max_pixels) if options is not None else (config.min_pixels, config.max_pixels)
    )
    return smart_resize(height, width, config.patch_size * config.merge_size, min_pixels, max_pixels)


def _grid_field(gh: int, gw: int) -> dict[str, Any]:
    grid = np.array([1, gh, gw], dtype=np.int64)
    return {"data": _tensor("int64", grid), "field": ("batched", {"keep_on_cpu": True})}


def _item(gh: int, gw: int, row_bytes: int) -> dict[str, Any]:
    """The msgpack item, `_PIXELS_STANDIN` standing for the (gh*gw, row_bytes) uint8 pixels.
    vLLM builds the item from a set of field names, so its key order varies per vLLM process
    (hash seed); the engine decodes a map, so either order is the same item."""
    return {
        "pixel_values": {
            "data": ("uint8", (gh * gw, row_bytes), _PIXELS_STANDIN),
            "field": ("flat", {"keep_on_cpu": False, "slices": [[(0, gh * gw, None)]], "dim": 0}),
        },
        "image_grid_thw": _grid_field(gh, gw),
    }


def _split_item(item: dict[str, Any], size: int) -> tuple[bytes, bytes]:
    """The encoded item's bytes before and after `size` bytes of pixels (ext header included)."""
    encoded = _encoder.encode(item)
    at = encoded.find(_STANDIN_BYTES)
    if at < 0 or encoded.find(_STANDIN_BYTES, at + 1) >= 0:
        raise RuntimeError("the pixel stand-in must occur exactly once in the encoded item")
    return encoded[:at] + ext_header(size, _RAW_VIEW), encoded[at + len(_STANDIN_BYTES) :]


def _streamed_kwargs(image: np.ndarray, new_h: int, new_w: int, config: VisionConfig) -> bytes:
    """`b'"' + b64encode(msgpack(item)) + b'"'` with the resize, patchify and base64 done band by
    band: each band of patch*merge output rows (one row of merge blocks, a contiguous run of the
    patch rows) is cast from the height pass's tile, patchified into a reused buffer and encoded
    into the final bytes object while it is in the CPU cache. The whole-image planes, patch rows,
    base64 pieces and their join (~25 MB of memory traffic per 720p image) are not made."""
    patch, merge, temporal = config.patch_size, config.merge_size, config.temporal_patch_size
    channels = image.shape[2]
    gh, gw = new_h // patch, new_w // patch
    row_bytes = channels * temporal * patch * patch
    head, tail = _split_item(_item(gh, gw, row_bytes), gh * gw * row_bytes)
    writer = b64stream.Base64Writer(len(head) + gh * gw * row_bytes + len(tail), b'"', b'"')
    writer.write(head)
    band = patch * merge
    buffer = np.empty(merge * gw * row_bytes, dtype=np.uint8)

    # The height pass hands over the same band buffer each time: its views are made once.
    views: list[Any] = [None]

    def sink(planes: np.ndarray) -> None:
        if planes is not views[0]:  # (a reference is kept, so identity cannot be a reused id)
            full = planes.shape[1] == band  # only a last, shorter band (never: smart_resize) differs
            source, target, rows = _patch_views(planes, patch, merge, temporal, buffer if full else None)
            views[:] = [planes, source, target, rows.ctypes.data, rows.nbytes, rows]
        _, source, target, address, size, _ = views
        np.copyto(target, source)
        writer.write_raw(address, size)

    resize_bands(image, new_h, new_w, band, sink)
    writer.write(tail)
    return writer.finish()


def process(
    image: np.ndarray, config: VisionConfig, digest: str, options: ImageOptions | None = None
) -> ProcessedImage:
    new_h, new_w = _grid(image.shape[0], image.shape[1], config, options)
    gh, gw = new_h // config.patch_size, new_w // config.patch_size
    grid_field = _grid_field(gh, gw)
    if b64stream.available() and image.dtype == np.uint8:
        kwargs_data = _streamed_kwargs(image, new_h, new_w, config)
    else:
        planes = resize_planar(image, new_h, new_w)
        rows, gh, gw = patchify(planes, config.patch_size, config.merge_size, config.temporal_patch_size)
        kwargs_data = _json_b64_msgpack(_item(gh, gw, rows.shape[1]), rows)
    metadata = _b64encode(_encoder.encode({"image_grid_thw": grid_field})).decode("ascii")
    return ProcessedImage(
        mm_hash=digest,
        num_tokens=gh * gw // (config.merge_size**2),
        kwargs_data=orjson.Fragment(kwargs_data),
        kwargs_json=kwargs_data,
        metadata=metadata,
        nbytes=len(kwargs_data) + len(metadata) + 200,
    )


def process_light(
    image: np.ndarray, config: VisionConfig, digest: str, options: ImageOptions | None = None
) -> ProcessedImage:
    """What `process` gives minus the tensors: the same grid, token count and metadata, no resize."""
    new_h, new_w = _grid(image.shape[0], image.shape[1], config, options)
    factor = config.patch_size
    gh, gw = new_h // factor, new_w // factor
    metadata = _b64encode(_encoder.encode({"image_grid_thw": _grid_field(gh, gw)})).decode("ascii")
    return ProcessedImage(
        mm_hash=digest,
        num_tokens=gh * gw // (config.merge_size**2),
        kwargs_data=None,
        kwargs_json=None,
        metadata=metadata,
        nbytes=len(metadata) + 200,
    )


_SPLIT = orjson.Fragment(b"\x00")  # orjson escapes NUL in strings: a raw one can only be this
_SOURCE_SEED = int.from_bytes(os.urandom(8), "little")


class _Source:
    """A data: URL as a dict key: hashed once with seeded xxh3 (~50 GB/s; str's own hash is SipHash
    at ~4 GB/s over a megabyte of base64), compared in full, so a hit is always the same bytes."""

    __slots__ = ("_hash", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._hash = xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"), _SOURCE_SEED)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Source) and self.text == other.text


class ProcessedCache:
    """In-process LRU of processed images keyed by mm_hash, bounded by bytes; the data: URLs an
    item came from point to it (and count in its bytes), so a re-sent URL skips base64, Pillow's
    header parse and the blake3 hash."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[str, ProcessedImage] = OrderedDict()
        # id(kwargs_data Fragment) -> the cached item (which keeps the Fragment, so the id stays its)
        self.by_fragment: dict[int, ProcessedImage] = {}
        self._sources: dict[_Source, str] = {}  # data: URL -> mm_hash
        self._sources_of: dict[str, list[_Source]] = {}
        self._lock = threading.Lock()

    def peek_source(self, source: _Source, tensors: bool) -> ProcessedImage | None:
        with self._lock:
            digest = self._sources.get(source)
            item = self._items.get(digest) if digest is not None else None
        return None if item is None or (tensors and not item.has_tensors) else item

    def by_source(self, source: _Source, tensors: bool) -> ProcessedImage | None:
        """The item a data: URL was processed into (default options only), counted as a hit."""
        with self._lock:
            digest = self._sources.get(source)
            if digest is None:
                return None
            item = self._items.get(digest)
            if item is None or (tensors and not item.has_tensors):
                return None
            self._items.move_to_end(digest)
            self.hits += 1
            return item

    def add_source(self, source: _Source, item: ProcessedImage) -> None:
        with self._lock:
            if self._items.get(item.mm_hash) is not item or source in self._sources:
                return  # not cached (too big, or a full item already won), or already known
            known = sum(len(other.text) for other in self._sources_of.get(item.mm_hash, ()))
            if item.nbytes + known + len(source.text) > self.max_bytes:
                return  # its URLs would push the item itself out
            self._sources[source] = item.mm_hash
            self._sources_of.setdefault(item.mm_hash, []).append(source)
            self.bytes += len(source.text)
            self._evict()

    def _drop(self, item: ProcessedImage) -> None:
        self.bytes -= item.nbytes
        self.by_fragment.pop(id(item.kwargs_data), None)
        for source in self._sources_of.pop(item.mm_hash, ()):
            del self._sources[source]
            self.bytes -= len(source.text)

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._items:
            _, evicted = self._items.popitem(last=False)
            self._drop(evicted)

    def get(self, key: str, tensors: bool = True) -> ProcessedImage | None:
        """The cached item, if it has what is asked for (a light item does not serve `tensors`)."""
        with self._lock:
            item = self._items.get(key)
            if item is None or (tensors and not item.has_tensors):
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item

    def peek(self, key: str, tensors: bool = True) -> ProcessedImage | None:
        """`get` without counting or reordering: what the Redis tier asks before a request's render
        (whose own `get` then counts the hit or miss once)."""
        with self._lock:
            item = self._items.get(key)
        return None if item is None or (tensors and not item.has_tensors) else item

    def put(self, item: ProcessedImage) -> None:
        if item.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.get(item.mm_hash)
            if old is not None and old.has_tensors and not item.has_tensors:
                return  # a light item never displaces the full one
            if old is not None:  # a light item replaced by its full one: its URLs stay (same hash)
                del self._items[item.mm_hash]
                self.bytes -= old.nbytes
                self.by_fragment.pop(id(old.kwargs_data), None)
            self._items[item.mm_hash] = item
            if item.kwargs_data is not None:
                self.by_fragment[id(item.kwargs_data)] = item
            self.bytes += item.nbytes
            self._evict()

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _Pending:
    """An image opened and hashed, its cache missed: decode and process still to do."""

    image: Image.Image
    data: bytes
    digest: str
    options: ImageOptions
    tensors: bool
    sources: list[_Source] = field(default_factory=list)  # data: URLs to remember it by


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _idle_cores(cores: int) -> int:
    """Cores no runnable thread is waiting for now: /proc/loadavg's count of runnable threads
    (this one included) against the cores this process may use; 0 where it cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as handle:
            running = int(handle.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, cores - running)


_POOL_LOCK = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _POOL_LOCK:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, _usable_cores() - 1), thread_name_prefix="mm-image")
        return _pool


class ImageBatch:
    """The images of one request. Each is looked up (and opened and hashed) on the calling thread
    as it is added, in order, so refusals come as they would one by one; the cache misses are
    decoded and processed when the batch closes, spread over the cores this process may use: the
    calling thread and pool threads for the cores idle at that moment take the next image in turn,
    so a 4-image request on 2 idle cores takes about half the wall time (Pillow's decode, NumPy's
    passes and BLAS release the GIL). With no idle core, the calling thread does them all.

        with vision.batch() as batch:
            for ...: batch.add(...) / batch.add_data_url(...)
        items = batch.results()

    An error while adding (an image refused) first lets the images before it finish, as a
    one-by-one loop would have processed them, and an error of theirs wins, being earlier."""

    def __init__(self, processor: ImageProcessor) -> None:
        self._processor = processor
        self._entries: list[ProcessedImage | _Pending] = []
        self._pending: dict[tuple[str, bool], _Pending] = {}  # one processing per image and kind
        self._results: list[ProcessedImage] | None = None

    def add(self, data: bytes, options: ImageOptions | None, tensors: bool, digest: str | None = None) -> None:
        self._add(self._processor._lookup(data, options, tensors, digest))

    def add_data_url(
        self,
        url: str,
        decode: Callable[[str], bytes],
        options: ImageOptions | None,
        tensors: bool,
        known: tuple[bytes, str | None] | None = None,
    ) -> None:
        self._add(self._processor._lookup_data_url(url, decode, options, tensors, known))

    def _add(self, found: ProcessedImage | _Pending) -> None:
        if isinstance(found, _Pending):
            key = (found.digest, found.tensors)
            if key in self._pending:  # the same image twice in one request: processed once
                self._pending[key].sources.extend(found.sources)
                found = self._pending[key]
            else:
                self._pending[key] = found
        self._entries.append(found)

    def __enter__(self) -> ImageBatch:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        processed: dict[int, ProcessedImage] = {}
        for pending, outcome in zip(self._pending.values(), self._process(list(self._pending.values())), strict=True):
            if isinstance(outcome, BaseException):
                raise outcome  # the earliest failure (the pending images are in request order)
            processed[id(pending)] = outcome
        if error is None:
            self._results = [
                entry if isinstance(entry, ProcessedImage) else processed[id(entry)] for entry in self._entries
            ]

    def results(self) -> list[ProcessedImage]:
        if self._results is None:
            raise RuntimeError("ImageBatch.results() before the batch closed")
        return self._results

    def _process(self, pending: list[_Pending]) -> list[ProcessedImage | BaseException]:
        outcomes: list[ProcessedImage | BaseException | None] = [None] * len(pending)
        turns = itertools.count()  # next() on it is atomic: each image is taken by one thread

        def work() -> None:
            while (index := next(turns)) < len(pending):
                try:
                    outcomes[index] = self._processor._finish(pending[index])
                except Exception as exc:  # kept, and raised in request order
                    outcomes[index] = exc

        # Helpers only for cores that are idle: on busy ones they would only take turns with the
        # other workers' requests (and cost the switches).
        helpers = min(len(pending) - 1, _idle_cores(_usable_cores())) if len(pending) > 1 else 0
        futures = [_helpers().submit(work) for _ in range(helpers)] if helpers > 0 else []
        work()
        for future in futures:
            future.result()
        return [outcome for outcome in outcomes if outcome is not None]


class ImageProcessor:
    """Bytes -> ProcessedImage, through the cache."""

    def __init__(
        self,
        config: VisionConfig,
        cache_bytes: int = 512 * 1024 * 1024,
        max_image_pixels: int = 178_956_970,
        processor_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.cache = ProcessedCache(cache_bytes)
        self.max_image_pixels = max_image_pixels
        # --mm-processor-kwargs: checked at start (Settings.validate), so a bad flag fails there
        low, high = server_bounds(processor_kwargs or {}, config.min_pixels, config.max_pixels)
        self.default_options = ImageOptions(low, high, {})

    def options(self, request_kwargs: dict[str, Any] | None) -> ImageOptions:
        """A request's kwargs (as vLLM routes them to the image processor) over the server's bounds."""
        request_kwargs = request_kwargs or {}
        low, high = request_bounds(request_kwargs, (self.default_options.min_pixels, self.default_options.max_pixels))
        return ImageOptions(low, high, hash_factor(request_kwargs))

    def identify(self, data: bytes, options: ImageOptions | None = None) -> str:
        """The image's mm_hash (opening it far enough to know whether it converts to RGB)."""
        return self._identify(data, options or self.default_options)[0]

    def _identify(self, data: bytes, options: ImageOptions) -> tuple[str, Image.Image]:
        image = _open(data, self.max_image_pixels)
        # The server's kwargs are not in the hash (vLLM's neither): they hold for every request here,
        # and the per-process cache is keyed by the hash.
        return mm_hash(data, self.config.model_id, _needs_conversion(image), options.hash_kwargs), image

    def __call__(
        self, data: bytes, options: ImageOptions | None = None, tensors: bool = True, digest: str | None = None
    ) -> ProcessedImage:
        """`tensors=False` (`mm_payload: "none"`): a light item is enough. `digest`: what `identify`
        already returned for these bytes under these options (the Redis tier's async step), so the
        bytes are not hashed again; the image is then only opened on a cache miss."""
        found = self._lookup(data, options, tensors, digest)
        return found if isinstance(found, ProcessedImage) else self._finish(found)

    def _lookup(
        self, data: bytes, options: ImageOptions | None, tensors: bool, digest: str | None
    ) -> ProcessedImage | _Pending:
        """The cached item, or the opened image still to decode and process."""
        options = options or self.default_options
        image = None
        if digest is None:
            digest, image = self._identify(data, options)
        cached = self.cache.get(digest, tensors)
        if cached is not None:
            return cached
        if image is None:
            image = _open(data, self.max_image_pixels)
        return _Pending(image, data, digest, options, tensors)

    def _finish(self, pending: _Pending) -> ProcessedImage:
        """Decode, process and cache (thread-safe: Pillow's decode and NumPy's work release the GIL)."""
        pixels = decode_rgb(pending.image, pending.data)
        processed = (process if pending.tensors else process_light)(
            pixels, self.config, pending.digest, pending.options
        )
        self.cache.put(processed)
        for source in pending.sources:
            self.cache.add_source(source, processed)
        return processed

    def from_data_url(
        self,
        url: str,
        decode: Callable[[str], bytes],
        options: ImageOptions | None = None,
        tensors: bool = True,
        known: tuple[bytes, str | None] | None = None,
    ) -> ProcessedImage:
        """`self(decode(url), ...)`, remembered by the URL text when no request kwargs apply: the
        next turn re-sending the image costs an xxh3 of its base64 and one compare. `known`: the
        (bytes, mm_hash) the Redis tier's step already has for this URL."""
        found = self._lookup_data_url(url, decode, options, tensors, known)
        return found if isinstance(found, ProcessedImage) else self._finish(found)

    def _lookup_data_url(
        self,
        url: str,
        decode: Callable[[str], bytes],
        options: ImageOptions | None,
        tensors: bool,
        known: tuple[bytes, str | None] | None,
    ) -> ProcessedImage | _Pending:
        if options is not None and options is not self.default_options:
            data, digest = known or (decode(url), None)
            return self._lookup(data, options, tensors, digest)
        source = _Source(url)
        item = self.cache.by_source(source, tensors)
        if item is not None:
            return item
        data, digest = known or (decode(url), None)
        found = self._lookup(data, None, tensors, digest)
        if isinstance(found, ProcessedImage):
            self.cache.add_source(source, found)
        else:
            found.sources.append(source)
        return found

    def batch(self) -> ImageBatch:
        """Collect one request's images, then process the cache misses together (`ImageBatch`)."""
        return ImageBatch(self)

    def knows_data_url(self, url: str, tensors: bool = True) -> bool:
        """Whether `from_data_url` would serve this URL from the memo (not counted as a hit)."""
        return self.cache.peek_source(_Source(url), tensors) is not None

    def json_parts(self, content: dict[str, Any]) -> list[bytes]:
        """`orjson.dumps(content)` as byte strings whose concatenation is that document, each cached
        image's kwargs_data its own, shared element: a response can write them to the socket one
        after another (Content-Length: the sum) instead of copying megabytes per image into a new
        body on every request. Items no longer cached are encoded inline."""
        features = content.get("features")
        if not isinstance(features, dict) or not isinstance(kwargs := features.get("kwargs_data"), dict):
            return [orjson.dumps(content)]
        blobs: list[bytes] = []
        swapped: dict[str, list[Any]] = {}
        with self.cache._lock:
            for modality, items in kwargs.items():
                swapped[modality] = []
                for item in items:
                    cached = self.cache.by_fragment.get(id(item))
                    if cached is not None and cached.kwargs_data is item and cached.kwargs_json is not None:
                        blobs.append(cached.kwargs_json)
                        item = _SPLIT
                    swapped[modality].append(item)
        document = orjson.dumps({**content, "features": {**features, "kwargs_data": swapped}})
        pieces = document.split(b"\x00")
        parts = [pieces[0]]
        for blob, piece in zip(blobs, pieces[1:], strict=True):
            parts += [blob, piece]
        return parts


# -- prompt ---------------------------------------------------------------------------------


def expand_prompt(
    token_ids: list[int], items: list[ProcessedImage], image_token_id: int
) -> tuple[list[int], list[dict[str, int]]]:
    """Replace the i-th `<|image_pad|>` with items[i].num_tokens copies; the placeholder ranges."""
    out: list[int] = []
    placeholders: list[dict[str, int]] = []
    index = 0
    for token in token_ids:
        if token == image_token_id:
            if index >= len(items):
                raise BadRequestError(
                    f"The prompt has more image placeholders than the {len(items)} image(s) given.", param="messages"
                )
            placeholders.append({"offset": len(out), "length": items[index].num_tokens})
            out.extend([image_token_id] * items[index].num_tokens)
            index += 1
        else:
            out.append(token)
    if index != len(items):
        raise BadRequestError(
            f"Expected {len(items)} image placeholder(s) in the rendered prompt, found {index}: the chat "
            "template must emit one per image.",
            param="messages",
        )
    return out, placeholders


def features(items: list[ProcessedImage], placeholders: list[dict[str, int]], mm_payload: str) -> dict[str, Any]:
    """`MultiModalFeatures` as vLLM's render serializes it (field order included)."""
    tensors = mm_payload == "tensors"
    return {
        "mm_hashes": {"image": [item.mm_hash for item in items]},
        "mm_placeholders": {"image": placeholders},
        "kwargs_data": {"image": [item.kwargs_data for item in items]} if tensors else None,
        "mm_metadata": {"image": [item.metadata for item in items]} if tensors else None,
    }
