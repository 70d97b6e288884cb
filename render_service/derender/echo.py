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
- `SentCache`: per stream, a copy of what this process last sent (the echo's bytes and its
  digest) and of the `prompt_token_ids` and `chat_request` bytes a vouched chunk carried. An echo
  equal to the kept bytes (length + memcmp) needs no hashing; resent request fields equal to the
  kept bytes are cut out too and take the kept (already checked) values, so they are neither
  parsed nor digested again. Anything else is read as before: the cache only ever replaces work
  whose result it knows exactly.
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
_PROMPT_PATTERN = b'"prompt_token_ids":'
_REQUEST_PATTERN = b'"chat_request":'
_SID_PATTERN = b'"rs_sid":"'
MAX_SID_CHARS = 64  # as `pipeline` bounds `rs_sid`


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

    def copy(self) -> EchoDigest:
        """An independent digest of the same echo (a kept one is extended only through copies)."""
        twin = EchoDigest.__new__(EchoDigest)
        twin._ids, twin._lens = self._ids.copy(), self._lens.copy()
        twin._ids_open, twin._lens_open = self._ids_open, self._lens_open
        return twin

    def digest(self) -> bytes:
        ids, lens = self._ids.copy(), self._lens.copy()
        ids.update(b"]")
        lens.update(b"]")
        return ids.digest(16) + lens.digest(16)


class EchoedArray:
    """An echoed array kept as the JSON bytes it arrived in, plus the items appended since: the
    `list` operations the stream path uses (`len`, `extend`, `append`), and `wire` for the answer.
    Only ever built for bytes a snapshot vouched for (plain ints, compact JSON)."""

    __slots__ = ("_count", "_json", "_suffix", "_wire")

    def __init__(self, json: bytes, count: int | None = None) -> None:
        self._json = json
        self._count = count
        self._suffix: list[int] = []
        self._wire: bytes | None = None  # `wire_bytes`, once asked

    def __len__(self) -> int:
        if self._count is None:
            self._count = 0 if len(self._json) <= 2 else self._json.count(b",") + 1
        return self._count + len(self._suffix)

    def extend(self, items: list[int]) -> None:
        self._wire = None
        self._suffix.extend(items)

    def append(self, item: int) -> None:
        self._wire = None
        self._suffix.append(item)

    def wire_bytes(self) -> bytes:
        """The array as JSON: the bytes received, the new items spliced in before the bracket."""
        if self._wire is None:
            if not self._suffix:
                self._wire = self._json
            else:
                items = memoryview(orjson.dumps(self._suffix))[1:]
                if len(self._json) <= 2:  # `[]`
                    self._wire = b"[" + items
                else:
                    self._wire = b"".join((memoryview(self._json)[:-1], b",", items))
        return self._wire

    def wire(self) -> orjson.Fragment:
        return orjson.Fragment(self.wire_bytes())


def seal(state: dict[str, Any] | None) -> None:
    """Replace the `EchoedArray`s of an answer's `stream_state` by their JSON."""
    if state is None:
        return
    for key in (IDS_KEY, LENS_KEY):
        value = state.get(key)
        if isinstance(value, EchoedArray):
            state[key] = value.wire()


@dataclass(frozen=True, slots=True)
class KeptRequest:
    """The `prompt_token_ids` and `chat_request` of a chunk a snapshot vouched for, as compact JSON,
    with their values and the request digest (`pipeline._request_digest`) of those values. The
    values are what parsing those bytes gives (`orjson` round-trips compact JSON exactly), so a
    later body carrying the same bytes carries these values. Shared by later chunks: read only
    (a chunk whose request is not vouched for gets fresh copies, `fresh`)."""

    prompt: bytes
    chat: bytes
    prompt_value: Any
    chat_value: Any
    digest: bytes

    def fresh(self) -> tuple[Any, Any]:
        """The values decoded again, for a body that validation may fill in."""
        return orjson.loads(self.prompt), orjson.loads(self.chat)


@dataclass(slots=True)
class Sent:
    """What this process's answer for stream `sid` carried at `position`: the echo's bytes and its
    digest (the one the snapshot at `position` keeps), and the vouched request bytes (if any).
    Never changed once made (not `frozen`: a frozen dataclass's `__init__` costs a `setattr`
    call per field, and one is made per chunk)."""

    sid: str
    position: int
    ids: bytes
    lens: bytes
    digest: EchoDigest  # extended only through `copy()`
    digest_bytes: bytes
    request: KeptRequest | None

    @property
    def size(self) -> int:
        return len(self.ids) + len(self.lens)


class SentCache:
    """Per stream id, the last two `Sent`s (the newest, and the one before for a retried chunk),
    the least recently written streams dropped past `max_bytes` of kept echo. Only an optimisation:
    a stream missing here is read as before (hashed, parsed)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._bytes = 0
        # insertion order = least recently written first (a stream is written on every chunk)
        self._streams: dict[str, tuple[Sent, ...]] = {}

    def candidates(self, sid: str) -> tuple[Sent, ...]:
        return self._streams.get(sid, ())

    def put(self, sent: Sent) -> None:
        before = self._streams.pop(sent.sid, ())
        self._bytes -= _kept_size(before)
        # the newest first; the one this chunk continued from stays for a retry of this chunk
        kept: tuple[Sent, ...] = (sent,)
        for old in before:
            if old.position < sent.position:
                kept = (sent, old)
                break
        size = _kept_size(kept)
        if size > self.max_bytes:
            return
        self._streams[sent.sid] = kept
        self._bytes += size
        while self._bytes > self.max_bytes:
            oldest = next(iter(self._streams))
            self._bytes -= _kept_size(self._streams.pop(oldest))

    def forget(self, sid: str) -> None:
        self._bytes -= _kept_size(self._streams.pop(sid, ()))

    def __len__(self) -> int:
        return len(self._streams)


def _kept_size(kept: tuple[Sent, ...]) -> int:
    size = 256 if kept else 0
    for sent in kept:
        size += len(sent.ids) + len(sent.lens)
    return size


@dataclass(slots=True)
class RawEcho:
    """A request body parsed without its echoed arrays (`split_body`)."""

    body: dict[str, Any]  # the echoed arrays' places hold placeholders until `pipeline.vouch_raw`
    ids: bytes  # stream_state.output_token_ids, as received
    lens: bytes  # stream_state.output_chunk_lens, as received
    # The `Sent` whose echo bytes these are, exactly (None: compare by digest). Its stream id and
    # position are a hint until `pipeline.vouch_raw` finds the body names that stream and position.
    sent: Sent | None = None
    # Set when `prompt_token_ids` and `chat_request` were these kept bytes, cut out unparsed: the
    # body holds the kept values.
    request: KeptRequest | None = None


def split_body(raw: bytes, cache: SentCache | None = None) -> RawEcho | None:
    """`raw` parsed with `stream_state`'s echoed arrays cut out as bytes, or None where that is
    not exact: the keys written otherwise than compactly, a value that is not a flat array, a
    body that does not parse once they are cut out, or placeholders that do not end up as the
    arrays of `stream_state` (e.g. the pattern matched a key elsewhere, or a later duplicate key
    overrides it). None means: parse the body whole.

    Each array is replaced by a placeholder string holding a fresh random nonce, so a body that
    parses with the placeholders exactly at `stream_state.output_token_ids` and
    `.output_chunk_lens` had those spans there; and the spans are used only once their digest
    matches the snapshot's, i.e. once they are exactly a flat array this service wrote.

    With `cache`: the stream the body names (`rs_sid`, read here only as a hint) is looked up, and
    when the echo's bytes start with what this process sent, they are found by length + memcmp
    rather than scanned; when `prompt_token_ids` and `chat_request` are byte for byte the kept
    ones, they are cut out too (placeholders, checked the same way) and take the kept values."""
    candidates = _candidates(raw, cache)
    ids_at = _value_at(raw, _IDS_PATTERN)
    if ids_at is None:
        return None
    sent = None
    for candidate in candidates:
        if raw.startswith(candidate.ids, ids_at):
            sent = candidate
            break
    # A kept array is a flat array (one `]`, its last byte): its span is the scan's span.
    ids_span = (ids_at, ids_at + len(sent.ids)) if sent is not None else _array_end(raw, ids_at)
    if ids_span is None:
        return None
    # The lengths follow the ids in this service's answers; search there first.
    lens_at = _value_at(raw, _LENS_PATTERN, ids_span[1])
    if lens_at is None:
        lens_at = _value_at(raw, _LENS_PATTERN, 0, ids_span[0])
    if lens_at is None:
        return None
    if sent is not None and raw.startswith(sent.lens, lens_at):
        lens_span: tuple[int, int] | None = (lens_at, lens_at + len(sent.lens))
    else:
        sent = None
        lens_span = _array_end(raw, lens_at)
    if lens_span is None:
        return None
    nonce = secrets.token_hex(16)
    ids_mark, lens_mark = "rs-echo-ids-" + nonce, "rs-echo-lens-" + nonce
    cuts = [(ids_span, ids_mark), (lens_span, lens_mark)]
    request = _kept_request(raw, sent or (candidates[0] if candidates else None), (ids_span, lens_span))
    if request is not None:
        cuts += [(request[0], "rs-prompt-" + nonce), (request[1], "rs-request-" + nonce)]
    cuts.sort()
    parts: list[Any] = []
    view = memoryview(raw)
    end = 0
    for (start, stop), mark in cuts:
        if start < end:
            return None
        parts += (view[end:start], b'"' + mark.encode() + b'"')
        end = stop
    parts.append(view[end:])
    try:
        body = orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:
        return None
    state = body.get("stream_state") if isinstance(body, dict) else None
    if not isinstance(state, dict) or state.get(IDS_KEY) != ids_mark or state.get(LENS_KEY) != lens_mark:
        return None
    kept = None
    if request is not None:
        if body.get("prompt_token_ids") != "rs-prompt-" + nonce or body.get("chat_request") != "rs-request-" + nonce:
            return None  # the request keys are not where the cut was (e.g. a duplicate): parse whole
        kept = request[2]
        body["prompt_token_ids"], body["chat_request"] = kept.prompt_value, kept.chat_value
    if sent is not None:
        return RawEcho(body, sent.ids, sent.lens, sent, kept)
    return RawEcho(body, raw[ids_span[0] : ids_span[1]], raw[lens_span[0] : lens_span[1]], None, kept)


def _candidates(raw: bytes, cache: SentCache | None) -> tuple[Sent, ...]:
    """The kept answers of the stream `raw` seems to name (its last `"rs_sid":"..."`; a hint only)."""
    if cache is None:
        return ()
    at = raw.rfind(_SID_PATTERN)
    if at < 0:
        return ()
    start = at + len(_SID_PATTERN)
    end = raw.find(b'"', start, start + MAX_SID_CHARS + 1)
    if end < 0:
        return ()
    try:
        return cache.candidates(raw[start:end].decode("ascii"))
    except UnicodeDecodeError:
        return ()


def _kept_request(
    raw: bytes, sent: Sent | None, echo: tuple[tuple[int, int], tuple[int, int]]
) -> tuple[tuple[int, int], tuple[int, int], KeptRequest] | None:
    """The spans of `prompt_token_ids` and `chat_request` when both are byte for byte the kept
    request's (found outside the echo, which is most of the body, so it is not scanned)."""
    kept = sent.request if sent is not None else None
    if kept is None:
        return None
    first, second = (echo[0], echo[1]) if echo[0] < echo[1] else (echo[1], echo[0])
    spans = []
    for pattern, value in ((_PROMPT_PATTERN, kept.prompt), (_REQUEST_PATTERN, kept.chat)):
        # after the echo (where this service's clients put them), else before it, else between
        at = _value_at(raw, pattern, second[1])
        if at is None:
            at = _value_at(raw, pattern, 0, first[0])
        if at is None:
            at = _value_at(raw, pattern, first[1], second[0])
        if at is None or not raw.startswith(value, at):
            return None
        spans.append((at, at + len(value)))
    return spans[0], spans[1], kept


def _value_at(raw: bytes, pattern: bytes, start: int = 0, stop: int | None = None) -> int | None:
    """Where the value after the first `pattern` in raw[start:stop] begins."""
    at = raw.find(pattern, start, len(raw) if stop is None else stop)
    return None if at < 0 else at + len(pattern)


def _array_end(raw: bytes, start: int) -> tuple[int, int] | None:
    """The [start, end) of the array at `start`: from its `[` to the first `]` (a flat array's
    end; for anything else the span is wrong and the digest says so)."""
    if raw[start : start + 1] != b"[":
        return None
    end = raw.find(b"]", start)
    if end < 0:
        return None
    return start, end + 1
