"""Held-text segments: the text a parser holds (`parsers.held.HeldText`), stored beside its snapshot.

A snapshot is rewritten on every chunk, so it must stay small: a held text longer than
`INLINE_CHARS` moves out of it into an append-only segment (UTF-8), and the snapshot names it by
(key, length in bytes, length in characters, SHA-256 of those bytes). Each chunk then writes
only the bytes appended since the previous snapshot, at the offset where they go (Redis
`SETRANGE`, so a retried chunk writes the same bytes again), and signs only the fixed-size ref.

The digest is over the whole segment, but nothing is ever hashed twice: this process keeps the
SHA-256 state at the lengths its recent snapshots named (`Segment.marks`), so extending a
segment hashes only the new bytes, and checking one it wrote is a dictionary lookup. A replica
that did not write the previous chunk fetches only the bytes past its own copy (`GETRANGE`), or
the whole segment once when it has none. A segment that is missing, short or different from its
digest is refused, exactly as a missing or tampered snapshot is (the stream replays, or compact
mode answers 409).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any, NamedTuple

from render_service.parsers.held import HeldText

INLINE_CHARS = 512  # held text up to this long stays in the snapshot (its cost is bounded)
_MARKS = 4  # hash states kept per segment: the latest snapshots' lengths (a retry needs the previous)
_OVERHEAD = 256 * _MARKS  # bytes a segment costs besides its data (hash states, objects)


class Segment:
    """One held text's bytes in this process, and the hash state at recently named lengths."""

    __slots__ = ("counted", "data", "marks", "stored_at", "unsynced")

    def __init__(self) -> None:
        self.data = bytearray()
        self.marks: dict[int, tuple[bytes, Any]] = {}  # length -> (digest, sha256 state there)
        self.counted = 0  # bytes `SegmentCache` counts for it
        self.stored_at = 0.0  # when it was last written (time.monotonic())
        # A write to Redis was skipped or failed: Redis may lack bytes before the next append,
        # so the next write sends the whole segment.
        self.unsynced = False

    def write(self, offset: int, data: bytes | bytearray, state: Any, digest: bytes) -> None:
        """Put `data` at `offset` (what lay past it belonged to another attempt and goes), and
        mark the new end with `state`, the SHA-256 of everything up to it, and its `digest`."""
        marks = self.marks
        size = len(self.data)
        if offset != size:
            assert offset < size, "a segment is written after the prefix it extends"
            del self.data[offset:]
            for n in [n for n in marks if n > offset]:
                del marks[n]
        self.data += data
        marks[offset + len(data)] = (digest, state)
        if len(marks) > _MARKS:  # one mark is added at a time
            del marks[next(iter(marks))]

    def nearest_mark(self, length: int) -> tuple[int, Any]:
        """The longest marked prefix not past `length` ((0, a fresh state) when none)."""
        best = max((n for n in self.marks if n <= length), default=0)
        return (best, self.marks[best][1]) if best else (0, hashlib.sha256())


class SegmentText:
    """A verified prefix of a segment: the `StoredText` a resumed `HeldText` starts from."""

    __slots__ = ("chars", "key", "length", "segment", "state")

    def __init__(self, key: str, segment: Segment, length: int, chars: int, state: Any) -> None:
        self.key = key
        self.segment = segment
        self.length = length
        self.chars = chars
        self.state = state  # SHA-256 of the prefix (never updated in place: copied to extend)

    def text(self) -> str:
        return self.segment.data[: self.length].decode()

    def tail(self, n: int) -> str:
        # At most 4 bytes a character: decode the last 4n bytes from a character boundary.
        start = max(0, self.length - 4 * n)
        data = self.segment.data
        while start < self.length and data[start] & 0xC0 == 0x80:
            start += 1
        return data[start : self.length].decode()[-n:]


class SegmentWrite(NamedTuple):
    """Bytes a snapshot appends to a segment (what Redis is sent)."""

    key: str
    offset: int
    data: bytes


class SegmentWriter:
    """The `HeldSink` of one snapshot: short held text inline, longer text as a ref to its
    segment (an index into `refs`). What it stores goes at once into this process's copy of the
    segment (in `cache`, when there is one); `writes` are the appends for Redis, `segments` the
    local copies the snapshot names."""

    __slots__ = ("_cache", "_fingerprint", "_position", "_remote", "_stream_id", "refs", "segments", "writes")
    inline_chars = INLINE_CHARS

    def __init__(
        self,
        fingerprint: str,
        stream_id: str,
        position: int,
        cache: SegmentCache | None = None,
        *,
        remote: bool = True,
    ) -> None:
        """`remote`: collect `writes` (there is a Redis to send them to)."""
        self._fingerprint, self._stream_id, self._position = fingerprint, stream_id, position
        self._cache = cache
        self._remote = remote
        self.refs: list[list[Any]] = []  # [key, length, chars, digest], stored in the snapshot
        self.segments: dict[str, Segment] = {}
        self.writes: list[SegmentWrite] = []

    def wire(self, held: HeldText) -> Any:
        stored = held.stored
        if stored is None and len(held) <= INLINE_CHARS:
            return held.text()
        appended = held.appended
        data = appended.encode()
        if stored is None:
            key = f"{segment_prefix(self._fingerprint, self._stream_id, self._position)}.{len(self.refs)}"
            offset, chars, segment = 0, 0, Segment()
            state = hashlib.sha256(data)
        else:
            text: SegmentText = stored  # type: ignore[assignment]  # the snapshot store gives no other
            key, offset, chars, segment = text.key, text.length, text.chars, text.segment
            state = text.state
            if data:
                state = state.copy()
                state.update(data)
        digest = state.digest()
        cache = self._cache
        if data or stored is None:
            if self._remote:
                self.writes.append(SegmentWrite(key, offset, data))
            if cache is not None:
                cache.write(key, segment, offset, data, state, digest)
            else:
                segment.write(offset, data, state, digest)
        elif cache is not None:  # named again: its TTL restarts
            cache.keep(key, segment)
        self.segments[key] = segment
        self.refs.append([key, offset + len(data), chars + len(appended), digest])
        return len(self.refs) - 1


class SegmentCache:
    """This process's segments: a dict in least-recently-written order, bounded by bytes, with
    the snapshots' TTL. Plain dict operations: it is touched on every chunk of a stream that
    holds text, where an LRU library's bookkeeping would cost as much as the rest of the chunk."""

    def __init__(self, max_bytes: int = 256 << 20, ttl: float = 600.0) -> None:
        self.max_bytes = max_bytes
        self._ttl = ttl
        self._segments: dict[str, Segment] = {}
        self._bytes = 0

    def get(self, key: str) -> Segment | None:
        segment = self._segments.get(key)
        if segment is not None and time.monotonic() - segment.stored_at > self._ttl:
            self.delete(key)
            return None
        return segment

    def text(self, key: str, length: int, chars: int, digest: bytes) -> SegmentText | None:
        """The prefix a ref names from this process's copy, when the copy has those bytes under
        that digest (dictionary lookups: it runs on every chunk)."""
        segment = self._segments.get(key)
        if segment is None:
            return None
        mark = segment.marks.get(length)
        if mark is None or mark[0] != digest or time.monotonic() - segment.stored_at > self._ttl:
            return None
        return SegmentText(key, segment, length, chars, mark[1])

    def write(
        self, key: str, segment: Segment, offset: int, data: bytes | bytearray, state: Any, digest: bytes
    ) -> None:
        """`segment.write`, then keep it as the most recently written."""
        segment.write(offset, data, state, digest)
        self.keep(key, segment)

    def keep(self, key: str, segment: Segment) -> None:
        """Hold `segment` under `key` (again), restarting its TTL; the least recently written
        go while the bytes exceed the bound."""
        old = self._segments.pop(key, None)
        if old is not None:
            self._bytes -= old.counted
        segment.counted = len(segment.data) + _OVERHEAD
        segment.stored_at = time.monotonic()
        self._segments[key] = segment
        self._bytes += segment.counted
        while self._bytes > self.max_bytes and self._segments:
            self.delete(next(iter(self._segments)))

    def delete(self, key: str) -> None:
        old = self._segments.pop(key, None)
        if old is not None:
            self._bytes -= old.counted

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._segments)


def segment_prefix(fingerprint: str, stream_id: str, position: int) -> str:
    """Keys of the segments a snapshot starts; the hash tag puts them in the snapshot's Cluster slot."""
    return f"rs:held:{fingerprint[:16]}:{{{stream_id}}}:{position}"


def parse_ref(ref: Any) -> tuple[str, int, int, bytes] | None:
    """A ref as a snapshot stores it, or None for what is not one (the snapshot is signed:
    this guards against a layout from another build, not against forgery)."""
    if type(ref) is not list or len(ref) != 4:
        return None
    key, length, chars, digest = ref
    if type(key) is not str or type(length) is not int or type(chars) is not int or type(digest) is not bytes:
        return None
    return (key, length, chars, digest) if length >= 0 and chars >= 0 else None


def check(data: bytes | bytearray, start_state: Any, digest: bytes) -> Any | None:
    """The hash state after `data` (extending `start_state`) when it ends at `digest`."""
    state = start_state.copy()
    state.update(data)
    return state if hmac.compare_digest(state.digest(), digest) else None
