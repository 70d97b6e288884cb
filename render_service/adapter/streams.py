"""Live parser objects of adapter streams, per worker, in an LRU bounded by entries and bytes.

vLLM's parser objects cannot be serialized, so a stream whose parser comes from vLLM keeps the
object itself between chunks, here, in the worker that served the previous chunk (a keep-alive
client stays on its worker). An entry is found by the stream id the service hands out
(`rs_sid`) and must match the client-carried output exactly (the same token ids): anything
else is a miss, and the caller rebuilds the parser by replaying the carried output once, as
vLLM does on every chunk. Nothing here is pickled or leaves the process.

The byte bound is an estimate (`LiveStream.nbytes`, set by the caller from the output length):
Python object graphs have no cheap exact size, and vLLM's parsers hold text and token lists
that grow with the output, which is what the estimate follows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class LiveStream:
    """One stream's live state after the output tokens `output_ids` (kept to check the client's:
    comparing two lists costs less than hashing one, and cannot collide)."""

    output_ids: list[int]
    processor: Any  # vLLM's ChatStreamProcessor (it owns the parser object)
    detok: Any  # our DetokState: the detokenizer window with special tokens kept
    chat_request: dict[str, Any]  # the request it parses for (a changed request is a miss)
    chars: int  # characters decoded so far (for the byte estimate)
    nbytes: int


class LiveStreamCache:
    """Stream id -> `LiveStream`, least recently used first out, at most `max_entries` entries
    and `max_bytes` estimated bytes. `take` removes the entry: a chunk owns its stream's parser
    while it runs (two concurrent chunks of one stream cannot share it) and `put` returns it."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("the live stream cache bounds must be non-negative")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, LiveStream] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # derender may run in a thread pool
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def take(self, sid: str, output_ids: list[int]) -> LiveStream | None:
        """The stream's live state if it is exactly after `output_ids`; a stale entry (another
        history: the client went back, or another worker moved on) is dropped."""
        with self._lock:
            entry = self._entries.pop(sid, None)
            if entry is None:
                return None
            self._bytes -= entry.nbytes
            if len(entry.output_ids) != len(output_ids) or entry.output_ids != output_ids:
                return None
            return entry

    def put(self, sid: str, entry: LiveStream) -> None:
        """Keep `entry` as the most recent; evict the least recent entries over the bounds. An
        entry larger than the whole byte bound is not kept."""
        with self._lock:
            old = self._entries.pop(sid, None)
            if old is not None:
                self._bytes -= old.nbytes
            if entry.nbytes > self.max_bytes or self.max_entries == 0:
                self.evictions += 1
                return
            self._entries[sid] = entry
            self._bytes += entry.nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.evictions += 1

    def discard(self, sid: str) -> None:
        with self._lock:
            old = self._entries.pop(sid, None)
            if old is not None:
                self._bytes -= old.nbytes


def estimate_bytes(tokens: int, chars: int) -> int:
    """What a vLLM parser stream holds after `tokens` output tokens decoding to `chars` characters:
    the previous/current text copies and token id lists of its stream state (CPython: ~1-4 bytes
    per character per copy, ~36 bytes per list slot plus int object), plus fixed overhead."""
    return 16384 + 4 * chars + 72 * tokens
