"""The content-part matrix: every part type vLLM 0.33's chat schema admits (and a few it does not),
each with one field missing or null, on every route that renders chat content (chat render,
/tokenize, Messages render, Responses render), plus parts with empty or wrongly typed text.

Shared by the recorder (record_content_parts.py, against vLLM's render tier) and the test.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

CHAT = "/v1/chat/completions/render"
TOKENIZE = "/tokenize"
MESSAGES = "/v1/messages/render"
RESPONSES = "/v1/responses/render"

# A complete value for every field a part type uses.
_FULL: dict[str, Any] = {
    "text": "x",
    "refusal": "x",
    "thinking": "x",
    "image_url": {"url": "data:image/png;base64,AAAA", "detail": "auto"},
    "file_id": "f",
    "image_embeds": "x",
    "audio_embeds": "x",
    "video_embeds": "x",
    "data": "x",
    "image_pil": "x",
    "audio_url": {"url": "http://a"},
    "input_audio": {"data": "AAAA", "format": "wav"},
    "video_url": {"url": "http://v"},
    "file": {"file_data": "x", "file_id": "f", "filename": "n"},
    "name": "get_weather",
}
# Part type -> the fields it carries ("a.b": a nested field); "type" itself is varied too.
PART_TYPES: dict[str, list[str]] = {
    "text": ["text"],
    "input_text": ["text"],
    "output_text": ["text"],
    "refusal": ["refusal"],
    "thinking": ["thinking"],
    "image_url": ["image_url", "image_url.url"],
    "input_image": ["image_url"],
    "image_embeds": ["image_embeds"],
    "audio_embeds": ["audio_embeds"],
    "video_embeds": ["video_embeds"],
    "prompt_embeds": ["data"],
    "image_pil": ["image_pil"],
    "audio_url": ["audio_url", "audio_url.url"],
    "input_audio": ["input_audio", "input_audio.data"],
    "video_url": ["video_url", "video_url.url"],
    "file": ["file"],
    "tool_reference": ["name"],
    "input_file": ["file_id"],
}
MODES = ("missing", "null")


def part_variant(part_type: str, field: str, mode: str) -> dict[str, Any]:
    """A complete part of `part_type` with `field` removed ("missing") or set to null ("null")."""
    part: dict[str, Any] = {"type": part_type}
    for name in PART_TYPES[part_type]:
        top = name.split(".")[0]
        part[top] = copy.deepcopy(_FULL[top])
    top, _, sub = field.partition(".")
    target = part[top] if sub else part
    key = sub or top
    if mode == "missing":
        target.pop(key)
    else:
        target[key] = None
    return part


def part_variants() -> Iterator[tuple[str, dict[str, Any]]]:
    for part_type, fields in PART_TYPES.items():
        for field in fields:
            for mode in MODES:
                yield f"{part_type}.{field}.{mode}", part_variant(part_type, field, mode)
    yield "untyped.type.missing", {"image_url": copy.deepcopy(_FULL["image_url"])}
    yield "untyped.type.null", {"type": None, "text": "x"}


# Anthropic Messages blocks with a missing or null field.
MESSAGES_BLOCKS: dict[str, dict[str, Any]] = {
    "text.text.null": {"type": "text", "text": None},
    "text.text.missing": {"type": "text"},
    "image.source.null": {"type": "image", "source": None},
    "image.source.missing": {"type": "image"},
    "tool_reference.name.missing": {"type": "tool_reference"},
    "thinking.thinking.null": {"type": "thinking", "thinking": None},
    "tool_use.input.null": {"type": "tool_use", "id": "t", "name": "f", "input": None},
    "tool_result.text.null": {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": None}]},
    "tool_result.text.missing": {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]},
    "tool_result.reference.missing": {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [{"type": "tool_reference"}],
    },
}
# Text values that a "string"-format join cannot take, or drops.
ODD_TEXT_PARTS: dict[str, dict[str, Any]] = {
    "text.text.empty": {"type": "text", "text": ""},
    "text.text.int": {"type": "text", "text": 5},
    "tool_reference.name.int": {"type": "tool_reference", "name": 5},
    "thinking.thinking.int": {"type": "thinking", "thinking": 5},
}


def cases() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(case name, path, JSON body) for the whole matrix."""
    for name, part in part_variants():
        for role in ("system", "user", "tool"):
            messages: list[dict[str, Any]] = [{"role": role, "content": [part]}]
            if role != "user":
                messages.append({"role": "user", "content": "hi"})
            yield f"chat.{role}.{name}", CHAT, {"model": "m", "messages": messages}
            yield f"tokenize.{role}.{name}", TOKENIZE, {"model": "m", "messages": messages}
        yield (
            f"responses.user.{name}",
            RESPONSES,
            {"model": "m", "input": [{"type": "message", "role": "user", "content": [part]}]},
        )
    for name, block in MESSAGES_BLOCKS.items():
        for role in ("user", "assistant"):
            body = {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": role, "content": [block]}, {"role": "user", "content": "q"}],
            }
            yield f"messages.{role}.{name}", MESSAGES, body
    for name, part in ODD_TEXT_PARTS.items():
        body = {"model": "m", "messages": [{"role": "user", "content": [part, {"type": "text", "text": "a"}]}]}
        yield f"chat.user.{name}", CHAT, body
