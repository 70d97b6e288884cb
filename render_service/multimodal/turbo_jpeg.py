"""JPEG bytes straight to an RGB NumPy array through libjpeg-turbo (simplejpeg), where that gives
exactly the pixels Pillow gives.

Pillow decodes a baseline or progressive YCbCr/RGB JPEG with libjpeg-turbo's defaults (accurate
integer IDCT, fancy upsampling) into its own 4-bytes-per-pixel storage, which NumPy then packs
back to 3 bytes per pixel: simplejpeg runs the same library with the same settings and writes the
packed RGB array once (~1 ms less per 720p image). Used only when the outcome cannot differ:

- the file is one Pillow opened as a plain JPEG in mode RGB (not CMYK/YCCK, grayscale or MPO);
- no EXIF/XMP orientation asks for a transpose (vLLM applies it);
- libjpeg reported nothing (`strict`): a warning (truncated or corrupt data, which Pillow either
  refuses or decodes its own way) sends the image down Pillow's path, whose outcome is vLLM's;
- this process's simplejpeg and Pillow agree on a set of probe images (every chroma subsampling,
  progressive, restart markers, odd sizes), checked once; a different libjpeg-turbo build that
  decodes differently turns this path off.

Without simplejpeg installed, every image takes Pillow's path.
"""

from __future__ import annotations

import io
from functools import cache

import numpy as np
from PIL import Image, JpegImagePlugin

try:
    import simplejpeg
except ImportError:  # pragma: no cover - a dependency; Pillow decodes the same pixels, slower
    simplejpeg = None

_ORIENTATION = 0x0112
_TRANSPOSING = frozenset(range(2, 9))  # the EXIF orientations ImageOps.exif_transpose acts on


def _probes() -> list[bytes]:
    """Small JPEGs covering what the decoder's output depends on."""
    rng = np.random.default_rng(20261201)
    out = []
    cases = [
        ((37, 29), {"subsampling": 0}),  # 4:4:4
        ((64, 48), {"subsampling": 1}),  # 4:2:2
        ((61, 43), {"subsampling": 2}),  # 4:2:0
        ((33, 65), {"subsampling": 2, "progressive": True}),
        ((80, 40), {"subsampling": 2, "restart_marker_blocks": 2}),
        ((40, 80), {"subsampling": 2, "optimize": True, "quality": 40}),
    ]
    for (width, height), options in cases:
        # noise over a gradient: every DCT coefficient and the chroma edges matter
        base = np.linspace(0, 255, width * height * 3).reshape(height, width, 3)
        pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buffer, "JPEG", quality=options.pop("quality", 90), **options)
        out.append(buffer.getvalue())
    return out


@cache
def available() -> bool:
    """simplejpeg is installed and decodes the probes exactly as Pillow does."""
    if simplejpeg is None:
        return False
    try:
        for data in _probes():
            expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            if not np.array_equal(simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True), expected):
                return False
    except Exception:  # any trouble with the fast path means: do not use it
        return False
    return True


def decode(image: Image.Image, data: bytes) -> np.ndarray | None:
    """The (H, W, 3) uint8 pixels of `image` (opened by Pillow from `data`), or None where Pillow's
    own decode must run."""
    if type(image) is not JpegImagePlugin.JpegImageFile or image.mode != "RGB" or not available():
        return None
    try:
        if image.getexif().get(_ORIENTATION) in _TRANSPOSING:
            return None
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, strict=True)
    except Exception:  # a warning or an error: Pillow's path decides, as vLLM's
        return None
    if pixels.shape != (image.height, image.width, 3):
        return None
    return pixels
