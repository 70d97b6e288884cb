"""A prompt's token ids with their JSON text, built from the previous turn's text.

A render's response is mostly its token ids (turn 40 of an agent: ~24k ids, ~120 KB of JSON), and
turn N+1's ids start with turn N's (the segment cache copies them, see segments.py). So the JSON
of those shared ids is kept with the previous prompt's record (`PromptRecord.head_json`) and the
new prompt's is that text plus the new ids: `orjson` writes only the ids the turn added.

`EncodedIds` is a list (every reader sees the ids) that carries the text; `encode_json` writes the
text in its place (`as_fragment`). Any change to the list drops the text, so it can never
disagree with the ids it is written for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, SupportsIndex

import orjson

from render_service.render.segments import Encoded


class EncodedIds(list[int]):
    """Token ids and their JSON text (`[1,2,3]`, as `orjson.dumps` writes the list), or None."""

    __slots__ = ("json",)

    def __init__(self, ids: Iterable[int] = (), json: bytes | None = None) -> None:
        super().__init__(ids)
        self.json = json

    # Every mutation drops the text (the ids are then written as a list again).
    def __setitem__(self, index: Any, value: Any) -> None:
        self.json = None
        super().__setitem__(index, value)

    def __delitem__(self, index: Any) -> None:
        self.json = None
        super().__delitem__(index)

    def __iadd__(self, other: Iterable[int]) -> EncodedIds:  # type: ignore[override,misc]
        self.json = None
        return super().__iadd__(other)

    def __imul__(self, count: SupportsIndex) -> EncodedIds:
        self.json = None
        return super().__imul__(count)

    def append(self, value: int) -> None:
        self.json = None
        super().append(value)

    def extend(self, values: Iterable[int]) -> None:
        self.json = None
        super().extend(values)

    def insert(self, index: SupportsIndex, value: int) -> None:
        self.json = None
        super().insert(index, value)

    def pop(self, index: SupportsIndex = -1) -> int:
        self.json = None
        return super().pop(index)

    def remove(self, value: int) -> None:
        self.json = None
        super().remove(value)

    def clear(self) -> None:
        self.json = None
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self.json = None
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self.json = None
        super().reverse()


def extend_json(head_json: bytes, ids: list[int], start: int, end: int | None = None) -> bytes:
    """`head_json` (the JSON of the first `start` ids without its closing bracket) followed by
    `ids[start:end]` and no closing bracket either."""
    added = ids[start:end]
    if not added:
        return head_json
    text = orjson.dumps(added)
    return head_json + b"," + text[1:-1] if start else text[:-1]


def as_fragment(content: Any) -> Any:
    """`content` with its `token_ids` written from their kept text (a shallow copy), or as it is."""
    if type(content) is dict:
        ids = content.get("token_ids")
        if type(ids) is EncodedIds and ids.json is not None:
            return {**content, "token_ids": orjson.Fragment(ids.json)}
    return content


class _Previous(Protocol):
    head_ids: int
    head_json: bytes


def with_json(encoded: Encoded, previous: _Previous | None) -> tuple[EncodedIds, bytes]:
    """The ids of `encoded` with their JSON text, and the JSON of its head (`encoded.head_ids` ids,
    no closing bracket) for the next turn. The ids copied from `previous` are written from its text."""
    ids = encoded.ids
    if type(ids) is not EncodedIds:
        ids = EncodedIds(ids)
    start, base = 0, b""
    if previous is not None and previous.head_json and 0 < encoded.reused_ids == previous.head_ids:
        start, base = previous.head_ids, previous.head_json
    head_json = extend_json(base, ids, start, encoded.head_ids) if encoded.head_ids else b""
    ids.json = _closed(head_json, ids, encoded.head_ids)
    return ids, head_json


def _closed(head_json: bytes, ids: list[int], start: int) -> bytes:
    """`extend_json(head_json, ids, start) + b"]"` with one copy of `head_json`, not two."""
    added = ids[start:]
    if not added:
        return head_json + b"]" if start else b"[]"
    text = orjson.dumps(added)
    return b"".join((head_json, b",", memoryview(text)[1:])) if start else text
