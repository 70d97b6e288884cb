"""Multimodal render corpus: chat requests with images, built deterministically.

The images are generated here (seeded noise over gradients) and encoded once at record time;
the golden files keep the exact request bodies (data: URLs included), so a different Pillow
or libjpeg at test time cannot change the bytes that are hashed.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# vLLM hashes images together with the model path exactly as given on its command line, so the
# oracle and the service under test load the folder by this same relative path, each from a
# working folder that holds it (`mm_model_folder`): the goldens name no machine's paths.
MM_MODEL_DIR = "tinyvl-mm"
MM_MODEL_NAME = "tinyvl"
MM_MAX_MODEL_LEN = 16384
# Above this many base64 characters a golden keeps the kwargs' sha256 instead of the data.
INLINE_KWARGS_LIMIT = 200_000


def build_mm_model(root: Path) -> Path:
    """The Qwen3-VL example model folder, built as root/MM_MODEL_DIR."""
    from render_service.model.example import build_example_model

    return build_example_model(root / MM_MODEL_DIR, "qwen3-vl")


@contextlib.contextmanager
def mm_model_folder() -> Iterator[Path]:
    """Build the Qwen3-VL example model as MM_MODEL_DIR in a temporary folder and work from there
    (the process's working folder is restored on exit)."""
    previous = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="render-service-mm-") as workdir:
        build_mm_model(Path(workdir))
        os.chdir(workdir)
        try:
            yield Path(workdir)
        finally:
            os.chdir(previous)


def make_image(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [
            (x * 255 // max(width - 1, 1)),
            (y * 255 // max(height - 1, 1)),
            ((x + y) * 127 // max(width + height - 2, 1)),
        ],
        axis=-1,
    )
    noise = rng.integers(-40, 41, (height, width, 3))
    rgb = np.clip(base + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb, "RGB")
    if mode == "RGBA":
        alpha = np.clip(x * 255 // max(width - 1, 1), 0, 255).astype(np.uint8)
        image = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    elif mode != "RGB":
        image = image.convert(mode)
    return image


def data_url(image: Image.Image, fmt: str = "PNG", **save: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save)
    mime = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MM_MODEL_NAME, "messages": messages, **extra}


CHAT_PATH = "/v1/chat/completions/render"
RESPONSES_PATH = "/v1/responses/render"
MESSAGES_PATH = "/v1/messages/render"
# A case is a chat request body, or (path, body) for another render endpoint.
Case = dict[str, Any] | tuple[str, dict[str, Any]]


def endpoint(case: Case) -> tuple[str, dict[str, Any]]:
    return case if isinstance(case, tuple) else (CHAT_PATH, case)


def _responses(content: list[dict[str, Any]], **extra: Any) -> tuple[str, dict[str, Any]]:
    return RESPONSES_PATH, {
        "model": MM_MODEL_NAME,
        "request_id": "resp_fixed",
        "input": [{"role": "user", "content": content}],
        **extra,
    }


def _input_image(url: str) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url}


def _input_text(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def _messages(content: list[dict[str, Any]], **extra: Any) -> tuple[str, dict[str, Any]]:
    return MESSAGES_PATH, {
        "model": MM_MODEL_NAME,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def _image_block(url: str) -> dict[str, Any]:
    media_type, _, data = url.removeprefix("data:").partition(";base64,")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def cases() -> dict[str, Case]:
    """name -> request (a chat body, or (path, body))."""
    png_small = data_url(make_image(100, 70, 0))
    jpeg_720p = data_url(make_image(1280, 720, 1), "JPEG", quality=85)
    jpeg_720p_b = data_url(make_image(1280, 720, 2), "JPEG", quality=85)
    webp = data_url(make_image(640, 480, 3), "WEBP", quality=80)
    rgba = data_url(make_image(300, 200, 4, "RGBA"))
    gray = data_url(make_image(64, 64, 5, "L"))
    tall = data_url(make_image(24, 1000, 6))
    wide = data_url(make_image(1000, 20, 7))
    tiny = data_url(make_image(8, 8, 8))
    odd = data_url(make_image(333, 517, 9), "JPEG", quality=90)
    big = data_url(make_image(2000, 1500, 10), "JPEG", quality=70)
    too_thin = data_url(make_image(1000, 4, 11))
    return {
        "png_small": _chat([{"role": "user", "content": [_image(png_small), _text("What is this?")]}]),
        "jpeg_720p": _chat([{"role": "user", "content": [_text("Describe:"), _image(jpeg_720p)]}]),
        "webp": _chat([{"role": "user", "content": [_image(webp), _text("Colors?")]}]),
        "rgba_png": _chat([{"role": "user", "content": [_image(rgba), _text("Transparent?")]}]),
        "grayscale_png": _chat([{"role": "user", "content": [_image(gray)]}]),
        "tall": _chat([{"role": "user", "content": [_image(tall), _text("Tall.")]}]),
        "wide": _chat([{"role": "user", "content": [_text("Wide:"), _image(wide)]}]),
        "tiny": _chat([{"role": "user", "content": [_image(tiny), _text("Tiny.")]}]),
        "odd_size_jpeg": _chat([{"role": "user", "content": [_image(odd), _text("Odd size.")]}]),
        "downscaled_2000x1500": _chat([{"role": "user", "content": [_image(big), _text("Big.")]}]),
        "two_images_interleaved": _chat(
            [
                {
                    "role": "user",
                    "content": [_text("First:"), _image(png_small), _text("Second:"), _image(webp), _text("Compare.")],
                }
            ]
        ),
        "four_720p": _chat(
            [
                {
                    "role": "user",
                    "content": [
                        _image(jpeg_720p),
                        _image(jpeg_720p_b),
                        _image(jpeg_720p),
                        _image(jpeg_720p_b),
                        _text("Four frames."),
                    ],
                }
            ]
        ),
        "multi_turn_repeated": _chat(
            [
                {"role": "system", "content": "You look at pictures."},
                {"role": "user", "content": [_image(png_small), _text("What is this?")]},
                {"role": "assistant", "content": "A noisy gradient."},
                {"role": "user", "content": [_image(png_small), _image(rgba), _text("And these two?")]},
            ]
        ),
        "tools_and_image": _chat(
            [{"role": "user", "content": [_image(webp), _text("Weather where this was taken?")]}],
            tools=[WEATHER_TOOL],
            tool_choice="none",
        ),
        "tool_result_then_image": _chat(
            [
                {"role": "user", "content": [_text("Weather in Paris?")]},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "user", "content": [_image(tiny), _text("Like this?")]},
            ],
            tools=[WEATHER_TOOL],
            tool_choice="none",
        ),
        "mm_payload_none": _chat(
            [{"role": "user", "content": [_image(png_small), _text("Hashes only.")]}], mm_payload="none"
        ),
        "responses_input_image": _responses([_input_image(png_small), _input_text("What is this?")]),
        "responses_two_images_hashes_only": _responses(
            [_input_text("Compare"), _input_image(webp), _input_image(jpeg_720p)], mm_payload="none"
        ),
        "responses_kwargs_untrusted": _responses(
            [_input_image(png_small), _input_text("Small?")], mm_processor_kwargs={"max_pixels": 70000}
        ),
        "messages_image_block": _messages([_image_block(png_small), {"type": "text", "text": "What is this?"}]),
        "messages_two_image_blocks_hashes_only": _messages(
            [_image_block(rgba), {"type": "text", "text": "and"}, _image_block(odd)], mm_payload="none"
        ),
        "image_url_as_string_type_missing": _chat(
            [{"role": "user", "content": [{"image_url": {"url": png_small}}, _text("No type field.")]}]
        ),
        "error_image_embeds_not_enabled": _chat(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_embeds", "image_embeds": base64.b64encode(b"not a tensor").decode()},
                        _text("Embeds."),
                    ],
                }
            ]
        ),
        "error_aspect_ratio": _chat([{"role": "user", "content": [_image(too_thin), _text("Too thin.")]}]),
        "error_bad_base64": _chat(
            [{"role": "user", "content": [_image("data:image/png;base64,!!!notbase64!!!"), _text("Broken.")]}]
        ),
        "error_not_an_image": _chat(
            [
                {
                    "role": "user",
                    "content": [
                        _image("data:image/png;base64," + base64.b64encode(b"hello world").decode()),
                        _text("Text."),
                    ],
                }
            ]
        ),
    }


# The second oracle configuration (goldens in golden_mm_kwargs/): per-request kwargs trusted and
# server-wide image kwargs (a 512x512 pixel ceiling, a 64x64 floor through `size`).
KWARGS_SERVER = {"max_pixels": 262144, "size": {"shortest_edge": 4096}}
KWARGS_FLAGS = ["--trust-request-mm-kwargs", "--mm-processor-kwargs", json.dumps(KWARGS_SERVER)]
# The third (goldens in golden_mm_trust/): per-request kwargs trusted, the folder's own bounds.
TRUST_FLAGS = ["--trust-request-mm-kwargs"]


def kwargs_cases() -> dict[str, dict[str, Any]]:
    """Requests for the KWARGS_FLAGS oracle: the server's kwargs alone, and merged with a request's."""
    png_small = data_url(make_image(100, 70, 0))
    jpeg_720p = data_url(make_image(1280, 720, 1), "JPEG", quality=85)
    rgba = data_url(make_image(300, 200, 4, "RGBA"))
    tiny = data_url(make_image(8, 8, 8))

    def ask(url: str, kwargs: dict[str, Any] | None, text: str = "Look.", **extra: Any) -> dict[str, Any]:
        body = _chat([{"role": "user", "content": [_image(url), _text(text)]}], **extra)
        if kwargs is not None:
            body["mm_processor_kwargs"] = kwargs
        return body

    return {
        "server_only_720p": ask(jpeg_720p, None),  # server max_pixels: smaller grid, hash unchanged
        "server_only_tiny": ask(tiny, None),  # server size.shortest_edge: a 64x64 floor
        "empty_request_kwargs": ask(jpeg_720p, {}),
        "request_max_pixels_720p": ask(jpeg_720p, {"max_pixels": 1048576}),
        "request_min_pixels_small": ask(png_small, {"min_pixels": 200000}),
        "request_size_edges": ask(jpeg_720p, {"size": {"shortest_edge": 1024, "longest_edge": 50000}}),
        "request_size_and_max_pixels": ask(jpeg_720p, {"size": {"longest_edge": 50000}, "max_pixels": 70000}),
        "images_kwargs_over_flat": ask(jpeg_720p, {"max_pixels": 70000, "images_kwargs": {"max_pixels": 150000}}),
        "images_kwargs_size_rgba": ask(rgba, {"images_kwargs": {"size": {"longest_edge": 20000}}}),
        "video_scope_not_hashed": ask(jpeg_720p, {"videos_kwargs": {"num_frames": 4}}),
        "text_scope_and_floats": ask(
            png_small,
            {"text_kwargs": {"padding": False}, "fps": 2.5, "x": None, "max_pixels": 100000, "y": [1, "a", True]},
        ),
        "do_normalize_forced_off": ask(png_small, {"do_normalize": True, "do_rescale": True}),
        "two_images_request_kwargs": _chat(
            [{"role": "user", "content": [_image(png_small), _text("and"), _image(jpeg_720p), _text("Compare.")]}],
            mm_processor_kwargs={"min_pixels": 20000, "max_pixels": 120000},
        ),
        "request_kwargs_hashes_only": ask(jpeg_720p, {"max_pixels": 90000}, mm_payload="none"),
        "request_size_shortest_only": ask(png_small, {"size": {"shortest_edge": 100000}}),
        "flat_min_into_scoped_size": ask(
            png_small, {"min_pixels": 30000, "images_kwargs": {"size": {"shortest_edge": 10000, "longest_edge": 40000}}}
        ),
        "flat_min_beside_unrelated_scope": ask(
            png_small, {"min_pixels": 30000, "images_kwargs": {"do_rescale": False}}
        ),
        "flat_max_beside_empty_scope": ask(jpeg_720p, {"max_pixels": 70000, "images_kwargs": {}}),
        "error_kwargs_not_a_dict": ask(png_small, None, mm_processor_kwargs="max_pixels=1"),
        "error_zero_edge": ask(png_small, {"size": {"shortest_edge": 0}}),
        "error_string_pixels": ask(png_small, {"max_pixels": "big"}),
    }


def trust_cases() -> dict[str, Case]:
    """Requests for the TRUST_FLAGS oracle: a request's kwargs over the preprocessor config's bounds."""
    png_small = data_url(make_image(100, 70, 0))
    jpeg_720p = data_url(make_image(1280, 720, 1), "JPEG", quality=85)
    big = data_url(make_image(2000, 1500, 10), "JPEG", quality=70)

    def ask(url: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        return _chat([{"role": "user", "content": [_image(url), _text("Look.")]}], mm_processor_kwargs=kwargs)

    return {
        "size_longest_only": ask(big, {"size": {"longest_edge": 300000}}),
        "size_shortest_only": ask(png_small, {"size": {"shortest_edge": 150000}}),
        "scoped_max_pixels": ask(jpeg_720p, {"images_kwargs": {"max_pixels": 400000}}),
        "flat_max_over_size": ask(
            jpeg_720p, {"size": {"shortest_edge": 1024, "longest_edge": 500000}, "max_pixels": 200000}
        ),
        "same_image_without_kwargs": _chat([{"role": "user", "content": [_image(jpeg_720p), _text("Look.")]}]),
        "error_unsupported_key": ask(png_small, {"do_resize": False}),
        "responses_scoped_max_pixels": _responses(
            [_input_image(jpeg_720p), _input_text("Look.")],
            mm_processor_kwargs={"images_kwargs": {"max_pixels": 400000}},
        ),
        "responses_flat_min_pixels_hashes_only": _responses(
            [_input_image(png_small), _input_text("Look.")],
            mm_processor_kwargs={"min_pixels": 200000},
            mm_payload="none",
        ),
    }


def summarize_item(item: str) -> dict[str, Any]:
    """A kwargs item, order-free: per field its wire field spec, dtype, shape and data sha256.

    vLLM builds an item from a set of field names, so the msgpack key order (and thus the
    base64 string) changes between vLLM processes; the decoded item does not.
    """
    import hashlib

    import msgpack

    fields = msgpack.unpackb(base64.b64decode(item), strict_map_key=False)
    out = {}
    for name in sorted(fields):
        dtype, shape, ext = fields[name]["data"]
        out[name] = {
            "field": fields[name]["field"],
            "dtype": dtype,
            "shape": shape,
            "sha256": hashlib.sha256(ext.data).hexdigest(),
        }
    return out


def shrink(response: Any) -> Any:
    """A golden's response: kwargs_data and mm_metadata items summarized (summarize_item); the
    base64 of small kwargs items is kept too, for a max-abs-diff report on a mismatch."""
    if not isinstance(response, dict) or not isinstance(response.get("features"), dict):
        return response
    features = dict(response["features"])
    for key in ("kwargs_data", "mm_metadata"):
        data = features.get(key)
        if isinstance(data, dict):
            features[key] = {
                modality: [None if item is None else summarize_item(item) for item in items]
                for modality, items in data.items()
            }
    raw = response["features"].get("kwargs_data")
    if isinstance(raw, dict):
        features["kwargs_data_small"] = {
            modality: [item if item is not None and len(item) <= INLINE_KWARGS_LIMIT else None for item in items]
            for modality, items in raw.items()
        }
    return {**response, "features": features}
