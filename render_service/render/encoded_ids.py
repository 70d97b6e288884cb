"""A prompt's token ids with their JSON text, built from the previous turn's text.

A render's response is mostly its token ids (turn 40 of an agent: ~24k ids, ~120 KB of JSON), and
turn N+1's ids start with turn N's (the segment cache copies them, see segments.py). So the JSON
of the whole prompt is kept with its record (`PromptRecord.ids_json`, with `json_head`, where its
head ends) and the new prompt's is a view of that text up to there plus the new ids, joined in one
copy: `orjson` writes only the ids the turn added.

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


def as_fragment(content: Any) -> Any:
    """`content` with its `token_ids` written from their kept text (a shallow copy), or as it is."""
    if type(content) is dict:
        ids = content.get("token_ids")
        if type(ids) is EncodedIds and ids.json is not None:
            return {**content, "token_ids": orjson.Fragment(ids.json)}
    return content


class _Previous(Protocol):
    head_ids: int
    ids_json: bytes  # the JSON of all its ids
    json_head: int  # bytes of `ids_json` that write its first `head_ids` ids (no comma, no bracket after)


def with_json(encoded: Encoded, previous: _Previous | None) -> tuple[EncodedIds, int]:
    """The ids of `encoded` with their JSON text, and how many bytes of that text write its head
    (`encoded.head_ids` ids; 0 when it has none), for the next turn. The ids copied from `previous`
    are written from its text: a view of it, then the JSON of the new ids, joined in one copy; an
    unseen prompt's are one dump of the list."""
    ids = encoded.ids
    if type(ids) is not EncodedIds:
        ids = EncodedIds(ids)
    head = encoded.head_ids
    if previous is None or not previous.json_head or not 0 < encoded.reused_ids == previous.head_ids:
        # Nothing to copy (an unseen prompt): the whole list in one dump, and where its head ends
        # from the JSON of the ids after it (`[H,T]` minus `[T]` is `[H`), which are few.
        ids.json = text = orjson.dumps(ids)
        if not head:
            return ids, 0
        if head >= len(ids):
            return ids, len(text) - 1
        return ids, len(text) - len(orjson.dumps(ids[head:]))
    written, base = previous.head_ids, memoryview(previous.ids_json)[: previous.json_head]
    parts: list[Any] = [base]
    length = len(base)
    head_length = 0
    for end in (head, len(ids)):
        if end > written:
            text = orjson.dumps(ids[written:end])
            if written:
                parts.append(b",")
                length += 1
            parts.append(memoryview(text)[1:-1])
            length += len(text) - 2
            written = end
        if end == head and head:
            head_length = length
    parts.append(b"]")
    ids.json = b"".join(parts)
    return ids, head_length
