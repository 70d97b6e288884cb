"""The `full`-mode echo: `stream_state.output_token_ids` and `output_chunk_lens`, the whole output
so far, which a vLLM-style client sends back with every chunk exactly as the last answer carried it.

They are the only part of a full-mode chunk that grows with the stream, so they are handled as
bytes wherever that is exact:

- `EchoDigest`: the digest a snapshot keeps of the echo its answer carried (blake3 over the JSON,
  extended by each delta without rehashing the history).
- `split_body`: the request body parsed without the echoed arrays, which stay raw JSON. When
  their bytes digest to the snapshot's, they are byte for byte what this service sent, so they
  are neither decoded nor checked again (`pipeline.vouch_raw`); any other body (a client that
  re-serialises with spaces, reorders or changes a value) is parsed whole, as before.
- `EchoedArray`: such an array in the parsed body; the answer's echo is its bytes with the new
  ids appended (`seal`), not a re-encoded list.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson
from blake3 import blake3

IDS_KEY = "output_token_ids"
LENS_KEY = "output_chunk_lens"
# The echoed keys as this service (and any compact JSON encoder) writes them. The pattern cannot
# start inside a JSON string (the quote after the name would have to be escaped); where it does
# match is checked after parsing (`split_body`).
_IDS_PATTERN = b'"output_token_ids":'
_LENS_PATTERN = b'"output_chunk_lens":'


class EchoDigest:
    """The digest of an echo: `output_token_ids` and `output_chunk_lens` as JSON, the form this
    service sends them in (so a changed type is a changed echo, as a changed value is).

    A snapshot stores the digest of the echo its answer carried. An echo with that digest is
    byte for byte what this service produced from checked ids, so the next chunk checks and
    bounds only its own new ids, not the whole history again. One blake3 pass (C) costs far less
    than walking the lists, and a delta extends the digest without rehashing the history.
    """

    __slots__ = ("_ids", "_ids_open", "_lens", "_lens_open")

    def __init__(self, ids_json: bytes, lens_json: bytes) -> None:
        # All but the closing bracket is hashed, so that a delta can be appended.
        self._ids = blake3(memoryview(ids_json)[:-1])
        self._lens = blake3(memoryview(lens_json)[:-1])
        self._ids_open = len(ids_json) > 2  # an item is already written: the next needs a comma
        self._lens_open = len(lens_json) > 2

    @classmethod
    def of(cls, ids: Any, lens: Any) -> EchoDigest | None:
        """None for what cannot be such an echo (it is then checked in full, and refused)."""
        if not (isinstance(ids, list) and isinstance(lens, list)):
            return None
        try:
            return cls(orjson.dumps(ids), orjson.dumps(lens))
        except (orjson.JSONEncodeError, TypeError):  # e.g. an integer past 64 bits
            return None

    def extend(self, delta_ids: list[int]) -> None:
        """The echo after a chunk of `delta_ids` (checked plain ints) is appended."""
        if not delta_ids:
            return
        self._ids.update(b"," * self._ids_open + memoryview(orjson.dumps(delta_ids))[1:-1])
        self._lens.update(b"," * self._lens_open + b"%d" % len(delta_ids))
        self._ids_open = self._lens_open = True

    def digest(self) -> bytes:
        ids, lens = self._ids.copy(), self._lens.copy()
        ids.update(b"]")
        lens.update(b"]")
        return ids.digest(16) + lens.digest(16)


class EchoedArray:
    """An echoed array kept as the JSON bytes it arrived in, plus the items appended since: the
    `list` operations the stream path uses (`len`, `extend`, `append`), and `wire` for the answer.
    Only ever built for bytes a snapshot vouched for (plain ints, compact JSON)."""

    __slots__ = ("_count", "_json", "_suffix")

    def __init__(self, json: bytes, count: int | None = None) -> None:
        self._json = json
        self._count = count
        self._suffix: list[int] = []

    def __len__(self) -> int:
        if self._count is None:
            self._count = 0 if len(self._json) <= 2 else self._json.count(b",") + 1
        return self._count + len(self._suffix)

    def extend(self, items: list[int]) -> None:
        self._suffix.extend(items)

    def append(self, item: int) -> None:
        self._suffix.append(item)

    def wire(self) -> orjson.Fragment:
        """The array as JSON: the bytes received, the new items spliced in before the bracket."""
        if not self._suffix:
            return orjson.Fragment(self._json)
        items = memoryview(orjson.dumps(self._suffix))[1:]
        if len(self._json) <= 2:  # `[]`
            return orjson.Fragment(b"[" + items)
        return orjson.Fragment(b"".join((memoryview(self._json)[:-1], b",", items)))


def seal(state: dict[str, Any] | None) -> None:
    """Replace the `EchoedArray`s of an answer's `stream_state` by their JSON."""
    if state is None:
        return
    for key in (IDS_KEY, LENS_KEY):
        value = state.get(key)
        if isinstance(value, EchoedArray):
            state[key] = value.wire()


@dataclass(slots=True)
class RawEcho:
    """A request body parsed without its echoed arrays (`split_body`)."""

    body: dict[str, Any]  # the echoed arrays' places hold placeholders until `pipeline.vouch_raw`
    ids: bytes  # stream_state.output_token_ids, as received
    lens: bytes  # stream_state.output_chunk_lens, as received


def split_body(raw: bytes) -> RawEcho | None:
    """`raw` parsed with `stream_state`'s echoed arrays cut out as bytes, or None where that is
    not exact: the keys written otherwise than compactly, a value that is not a flat array, a
    body that does not parse once they are cut out, or placeholders that do not end up as the
    arrays of `stream_state` (e.g. the pattern matched a key elsewhere, or a later duplicate key
    overrides it). None means: parse the body whole.

    Each array is replaced by a placeholder string holding a fresh random nonce, so a body that
    parses with the placeholders exactly at `stream_state.output_token_ids` and
    `.output_chunk_lens` had those spans there; and the spans are used only once their digest
    matches the snapshot's, i.e. once they are exactly a flat array this service wrote."""
    ids_span = _array_span(raw, _IDS_PATTERN)
    lens_span = _array_span(raw, _LENS_PATTERN)
    if ids_span is None or lens_span is None:
        return None
    nonce = secrets.token_hex(16)
    ids_mark, lens_mark = "rs-echo-ids-" + nonce, "rs-echo-lens-" + nonce
    first, first_mark, second, second_mark = ids_span, ids_mark, lens_span, lens_mark
    if lens_span[0] < ids_span[0]:
        first, first_mark, second, second_mark = lens_span, lens_mark, ids_span, ids_mark
    if first[1] > second[0]:
        return None
    view = memoryview(raw)
    cut = b"".join(
        (
            view[: first[0]],
            b'"' + first_mark.encode() + b'"',
            view[first[1] : second[0]],
            b'"' + second_mark.encode() + b'"',
            view[second[1] :],
        )
    )
    try:
        body = orjson.loads(cut)
    except orjson.JSONDecodeError:
        return None
    state = body.get("stream_state") if isinstance(body, dict) else None
    if not isinstance(state, dict) or state.get(IDS_KEY) != ids_mark or state.get(LENS_KEY) != lens_mark:
        return None
    return RawEcho(body, raw[ids_span[0] : ids_span[1]], raw[lens_span[0] : lens_span[1]])


def _array_span(raw: bytes, pattern: bytes) -> tuple[int, int] | None:
    """The [start, end) of the array that follows the first `pattern`: from its `[` to the first
    `]` (a flat array's end; for anything else the span is wrong and the digest says so)."""
    at = raw.find(pattern)
    if at < 0:
        return None
    start = at + len(pattern)
    if raw[start : start + 1] != b"[":
        return None
    end = raw.find(b"]", start)
    if end < 0:
        return None
    return start, end + 1
