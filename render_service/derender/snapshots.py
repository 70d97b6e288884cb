"""The snapshot store: parser + detokenizer state after each streamed chunk, in-process then Redis.

A snapshot is an optimisation, never the truth: the client-carried `stream_state` is. A
snapshot is plain data (msgpack, never pickle) signed with HMAC-SHA256, so nothing
executable ever comes out of a cache and a tampered or foreign value is rejected. Keys name
the stream (a random id handed out on the first chunk) and the position the snapshot
continues from, so a retried chunk finds the snapshot it needs again.

Redis is reached with short timeouts; after a failure it is skipped for a cool-down so a
dead or slow Redis adds a bounded delay, and the caller falls back to replay. The same holds for
a Sentinel failover (the master is looked up again on the next connection; until the promoted
replica answers, chunks replay) and for a Cluster resharding (redis-py follows MOVED and ASK).
A stream's keys carry a hash tag, `{stream id}`, so in a Cluster they share one slot: the write of
a snapshot, the appends to its held-text segments and the delete of the snapshot it supersedes go
to one node in one round trip.

Text a parser must hold until it can emit it lives beside the snapshot, in append-only segments
(`segments.py`) that the snapshot names by length and digest: a chunk writes and signs only the
fixed-size state plus the new text. A segment that cannot be found or does not match its digest
makes the snapshot unusable (`render_snapshot_rejected_total{reason="held_text"}`), as a
missing snapshot is.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec

from render_service.derender.segments import (
    Segment,
    SegmentCache,
    SegmentText,
    SegmentWrite,
    SegmentWriter,
    check,
    parse_ref,
)
from render_service.redis_target import SENTINEL, RedisTarget
from render_service.server.metrics import Metrics

logger = logging.getLogger("render_service.derender.snapshots")

FORMAT_VERSION = 1
_MAC_SIZE = 32
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


class SnapshotRejected(Exception):
    """A stored value that must not be used; `reason` labels the metric."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SnapshotCodec:
    """Versioned msgpack, authenticated with HMAC-SHA256 over the version byte and payload."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        # The keyed state, made once: each message's HMAC starts from a copy of it (the one-shot
        # `hmac.digest` sets the key up again on every call, about as costly as hashing a snapshot).
        self._keyed = hmac.new(key, digestmod="sha256")

    def _mac(self, payload: bytes | memoryview) -> bytes:
        mac = self._keyed.copy()
        mac.update(payload)
        return mac.digest()

    def encode(self, snapshot: dict[str, Any]) -> bytes:
        payload = bytes([FORMAT_VERSION]) + _ENCODER.encode(snapshot)
        return self._mac(payload) + payload

    def decode(self, blob: bytes) -> dict[str, Any]:
        if not isinstance(blob, (bytes, bytearray)) or len(blob) <= _MAC_SIZE + 1:
            raise SnapshotRejected("malformed")
        view = memoryview(blob)
        if not hmac.compare_digest(view[:_MAC_SIZE], self._mac(view[_MAC_SIZE:])):
            raise SnapshotRejected("bad_signature")
        if blob[_MAC_SIZE] != FORMAT_VERSION:
            raise SnapshotRejected("version")
        try:
            value = _DECODER.decode(view[_MAC_SIZE + 1 :])
        except msgspec.DecodeError:
            raise SnapshotRejected("malformed") from None
        if not isinstance(value, dict):
            raise SnapshotRejected("malformed")
        return value


def snapshot_key(fingerprint: str, stream_id: str, position: int) -> str:
    return f"rs:snap:{fingerprint[:16]}:{{{stream_id}}}:{position}"


class LocalStore:
    """A bounded in-process store with TTL, bounded both by entries and by bytes, in least
    recently written order (a stream's snapshot is written once and read by its next chunk, so
    the oldest written is the one to drop); the held-text segments beside the snapshots have
    their own byte bound (`segments`). An `OrderedDict` (C) rather than an LRU library: it is
    read, written and pruned on every chunk, where that bookkeeping cost as much as the HMAC."""

    def __init__(
        self,
        max_entries: int = 100_000,
        max_bytes: int = 256 << 20,
        ttl: float = 600.0,
        max_segment_bytes: int = 256 << 20,
    ) -> None:
        # key -> (monotonic expiry, blob); the front is the oldest written, hence the first to expire
        self._blobs: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self.max_bytes = max_bytes
        self._max_entries = max_entries
        self._ttl = ttl
        self.segments = SegmentCache(max_segment_bytes, ttl)

    def get(self, key: str) -> bytes | None:
        item = self._blobs.get(key)
        if item is None:
            return None
        if time.monotonic() >= item[0]:
            self.delete(key)
            return None
        return item[1]

    def put(self, key: str, value: bytes) -> None:
        size = len(value)
        if size > self.max_bytes:
            return
        blobs = self._blobs
        old = blobs.pop(key, None)
        if old is not None:
            self._bytes -= len(old[1])
        now = time.monotonic()
        blobs[key] = (now + self._ttl, value)
        self._bytes += size
        # The oldest written go while over a bound, and those expired (at the front) in any case.
        while blobs:
            first, (expiry, blob) = next(iter(blobs.items()))
            if expiry > now and self._bytes <= self.max_bytes and len(blobs) <= self._max_entries:
                break
            del blobs[first]
            self._bytes -= len(blob)

    def delete(self, key: str) -> None:
        old = self._blobs.pop(key, None)
        if old is not None:
            self._bytes -= len(old[1])

    def keys(self) -> list[str]:
        return list(self._blobs)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._blobs)


class RedisStore:
    """Redis with short timeouts and a cool-down after failures; never raises to the caller."""

    def __init__(
        self,
        target: RedisTarget | str,
        metrics: Metrics,
        *,
        timeout: float = 0.05,
        ttl: int = 600,
        cooldown: float = 2.0,
        required_timeout: float = 0.5,
    ) -> None:
        if isinstance(target, str):
            target = RedisTarget(url=target)
        self._client = target.async_client(required_timeout)
        # Sentinel: redis-py asks for the master when it opens a connection; kept connections are
        # moved to a promoted replica by asking again every `locate_every` seconds in the background
        # (a forced failover leaves the old master answering, as a master, for seconds).
        self._sentinel_pool = self._client.connection_pool if target.mode == SENTINEL else None
        self._locate_every = 1.0
        self._watching: asyncio.Task[None] | None = None
        self._timeout = timeout
        self._required_timeout = required_timeout
        self._ttl = ttl
        self._cooldown = cooldown
        self._down_until = 0.0
        self._metrics = metrics
        self._pending: set[asyncio.Task[bool]] = set()

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, op: str, exc: BaseException) -> None:
        self._metrics.redis_errors.labels(op).inc()
        if self.available:
            logger.warning(
                "redis %s failed (%s: %s); using replay for %.1fs", op, type(exc).__name__, exc, self._cooldown
            )
        self._down_until = time.monotonic() + self._cooldown

    async def connect(self) -> None:
        """Open a first connection before serving: a TLS handshake (or a Sentinel lookup, or a
        Cluster's slot map) can take longer than one operation's budget on a busy machine. With
        Sentinel, also start following the master."""
        if self._sentinel_pool is not None and self._watching is None:
            self._watching = asyncio.get_running_loop().create_task(self._follow_master())
        try:
            await asyncio.wait_for(self._client.ping(), self._required_timeout)
        except Exception as exc:  # counted and logged; the first chunks still try (no cool-down)
            self._metrics.redis_errors.labels("connect").inc()
            logger.warning("redis not reachable at start (%s: %s); chunks replay until it is", type(exc).__name__, exc)

    async def _follow_master(self) -> None:
        while True:
            await asyncio.sleep(self._locate_every)
            await self._locate()

    async def _locate(self) -> None:
        pool = self._sentinel_pool
        assert pool is not None
        before = pool.master_address
        try:  # redis-py drops the idle connections when the master changed
            after = await asyncio.wait_for(pool.get_master_address(), self._required_timeout)
        except Exception as exc:  # no sentinel answers, or no master: the commands fail and cool down
            logger.debug("sentinel lookup failed: %s", exc)
            return
        if before is not None and after != before:
            # ... but not those in use at that moment, which would go back to the old master for
            # good: close them too (their commands fail once, and the store cools down).
            logger.warning("redis master moved from %s to %s (Sentinel failover)", before, after)
            await pool.disconnect(inuse_connections=True)

    async def get(self, key: str, required: bool = False) -> bytes | None:
        """`required`: the caller has no replay to fall back on (compact mode), so Redis is asked
        even during a cool-down, with a longer timeout."""
        if not self.available and not required:
            return None
        start = time.perf_counter()
        try:
            value = await asyncio.wait_for(self._client.get(key), self._required_timeout if required else self._timeout)
        except Exception as exc:  # timeouts, connection errors, protocol errors
            self._failed("get", exc)
            return None
        finally:
            self._metrics.redis_latency.labels("get").observe(time.perf_counter() - start)
        return value if isinstance(value, bytes) else None

    async def get_range(self, key: str, start: int, end: int, required: bool = False) -> bytes | None:
        """Bytes `start`..`end` (inclusive) of a held-text segment (`GETRANGE`), as `get` asks."""
        if not self.available and not required:
            return None
        began = time.perf_counter()
        try:
            value = await asyncio.wait_for(
                self._client.getrange(key, start, end), self._required_timeout if required else self._timeout
            )
        except Exception as exc:
            self._failed("get", exc)
            return None
        finally:
            self._metrics.redis_latency.labels("get").observe(time.perf_counter() - began)
        return value if isinstance(value, bytes) else None

    def put(
        self,
        key: str,
        value: bytes,
        stale_key: str | None = None,
        appends: Sequence[SegmentWrite] = (),
        segment_keys: Sequence[str] = (),
    ) -> asyncio.Task[bool] | None:
        """Schedule a pipelined write (the segments' new bytes first, then the snapshot, and the
        delete of a superseded snapshot); returns at once (the task tells whether it was
        written). `segment_keys`: the segments the snapshot names, whose TTL restarts with it."""
        if not self.available:
            return None
        task = asyncio.get_running_loop().create_task(self._write(key, value, stale_key, appends, segment_keys))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _write(
        self,
        key: str,
        value: bytes,
        stale_key: str | None,
        appends: Sequence[SegmentWrite] = (),
        segment_keys: Sequence[str] = (),
    ) -> bool:
        start = time.perf_counter()
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                # In order on one connection: a reader that finds the snapshot finds its bytes.
                for append in appends:
                    if append.data:
                        pipe.setrange(append.key, append.offset, append.data)
                for segment_key in segment_keys:
                    pipe.expire(segment_key, self._ttl)
                pipe.set(key, value, ex=self._ttl)
                if stale_key is not None:
                    pipe.delete(stale_key)
                await asyncio.wait_for(pipe.execute(), self._timeout * 5)
        except Exception as exc:
            self._failed("set", exc)
            return False
        finally:
            self._metrics.redis_latency.labels("set").observe(time.perf_counter() - start)
        return True

    async def flush(self) -> None:
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.gather(self._watching, return_exceptions=True)
        try:
            await self._client.aclose()
        except Exception:
            pass


class SnapshotStore:
    """In-process first, then Redis (when configured); counts hits, misses and rejections."""

    def __init__(
        self,
        codec: SnapshotCodec,
        metrics: Metrics,
        local: LocalStore | None = None,
        redis: RedisStore | None = None,
        write_wait: float = 0.005,
    ) -> None:
        self.write_wait = write_wait
        self.codec = codec
        self.local = local
        self.redis = redis
        self.metrics = metrics
        self._hits: dict[str, Any] = {}  # the hit counter per tier, bound to its label on first use

    async def get(self, key: str, required: bool = False) -> dict[str, Any] | None:
        """The snapshot, its `held` refs replaced by the verified segments they name (read by
        `parsers.load_parsed_stream`); None when it is missing, rejected or a segment is."""
        for tier, blob in await self._lookup(key, required):
            try:
                snapshot = self.codec.decode(blob)
            except SnapshotRejected as exc:
                self.metrics.snapshot_rejected.labels(exc.reason).inc()
                logger.warning("rejected snapshot %s from %s: %s", key, tier, exc.reason)
                if tier == "local" and self.local is not None:
                    self.local.delete(key)
                continue
            refs = snapshot.get("held")
            if refs:
                held = self.local_held_texts(refs) or await self._held_texts(refs, required)
                if held is None:
                    self.metrics.snapshot_rejected.labels("held_text").inc()
                    logger.warning("snapshot %s from %s: a held-text segment is missing or differs", key, tier)
                    break
                snapshot["held"] = held
            hits = self._hits.get(tier)
            if hits is None:
                hits = self._hits[tier] = self.metrics.snapshot_hits.labels(tier)
            hits.inc()
            if tier == "redis" and self.local is not None:
                self.local.put(key, blob)
            return snapshot
        self.metrics.snapshot_misses.inc()
        return None

    def local_held_texts(self, refs: Any) -> list[SegmentText] | None:
        """Every segment from this process's copies (no coroutine: the common case, every chunk)."""
        if self.local is None or not isinstance(refs, list):
            return None
        cache = self.local.segments
        out = []
        for ref in refs:
            parsed = parse_ref(ref)
            text = cache.text(*parsed) if parsed is not None else None
            if text is None:
                return None
            out.append(text)
        return out

    async def _held_texts(self, refs: Any, required: bool) -> list[SegmentText] | None:
        if not isinstance(refs, list):
            return None
        out = []
        for ref in refs:
            parsed = parse_ref(ref)
            text = await self._held_text(*parsed, required) if parsed is not None else None
            if text is None:
                return None
            out.append(text)
        return out

    async def _held_text(self, key: str, length: int, chars: int, digest: bytes, required: bool) -> SegmentText | None:
        """The segment prefix a ref names: this process's copy when it has those bytes under
        that digest (the common case, O(1)); else extended from Redis by the bytes past the copy,
        or fetched whole once; never a prefix whose digest differs."""
        segment = self.local.segments.get(key) if self.local is not None else None
        if self.local is not None and (text := self.local.segments.text(key, length, chars, digest)) is not None:
            return text
        if self.redis is None:
            return None
        if segment is not None:
            have, base = segment.nearest_mark(length)
            if have:
                text = await self._fetch(segment, key, have, base, length, chars, digest, required)
                if text is not None:
                    return text
        return await self._fetch(Segment(), key, 0, hashlib.sha256(), length, chars, digest, required)

    async def _fetch(
        self,
        segment: Segment,
        key: str,
        start: int,
        base: Any,
        length: int,
        chars: int,
        digest: bytes,
        required: bool,
    ) -> SegmentText | None:
        assert self.redis is not None
        data = b"" if start == length else await self.redis.get_range(key, start, length - 1, required)
        if data is None or len(data) != length - start:
            return None
        state = check(data, base, digest)
        if state is None:
            return None
        if self.local is not None:
            self.local.segments.write(key, segment, start, data, state, digest)
        else:
            segment.write(start, data, state, digest)
        return SegmentText(key, segment, length, chars, state)

    async def _lookup(self, key: str, required: bool = False) -> list[tuple[str, bytes]]:
        found = []
        if self.local is not None and (blob := self.local.get(key)) is not None:
            found.append(("local", blob))
            return found
        if self.redis is not None and (blob := await self.redis.get(key, required)) is not None:
            found.append(("redis", blob))
        return found

    async def put(
        self, key: str, snapshot: dict[str, Any], stale_key: str | None = None, held: SegmentWriter | None = None
    ) -> int:
        """Store locally at once; give the Redis write up to `write_wait` seconds, then let it finish
        in the background. The bounded wait is what lets the next chunk, sent at once to another
        replica, find the snapshot instead of replaying. `held`: the writer the parser state was
        encoded with (`to_obj(held)`); its refs go into the snapshot, its appends beside it."""
        segments = held.segments if held is not None else {}
        if held is not None and held.refs:
            snapshot["held"] = held.refs
        blob = self.codec.encode(snapshot)
        self.metrics.snapshot_bytes.observe(len(blob))
        if self.local is not None:
            self.local.put(key, blob)
            if stale_key is not None:
                self.local.delete(stale_key)
        if self.redis is not None:
            task = None
            if self.redis.available:
                appends: Sequence[SegmentWrite] = ()
                if held is not None and segments:
                    appends = self._redis_appends(held.writes, segments)
                task = self.redis.put(key, blob, stale_key, appends, list(segments))
            if segments:
                self._track_sync(task, list(segments.values()))
            if task is not None and self.write_wait > 0:
                await asyncio.wait({task}, timeout=self.write_wait)
        return len(blob)

    def segment_writer(self, fingerprint: str, stream_id: str, position: int) -> SegmentWriter:
        """The held-text sink for the snapshot of `stream_id` at `position` (pass it to `put`)."""
        cache = self.local.segments if self.local is not None else None
        return SegmentWriter(fingerprint, stream_id, position, cache, remote=self.redis is not None)

    @staticmethod
    def _redis_appends(writes: list[SegmentWrite], segments: dict[str, Segment]) -> list[SegmentWrite]:
        """The snapshot's appends; a segment whose earlier write did not reach Redis is sent
        whole (Redis would otherwise hold a gap, and no other replica could resume the stream)."""
        appends = [
            SegmentWrite(append.key, 0, bytes(segments[append.key].data)) if segments[append.key].unsynced else append
            for append in writes
        ]
        written = {append.key for append in writes}
        for key, segment in segments.items():
            if key not in written and segment.unsynced:
                appends.append(SegmentWrite(key, 0, bytes(segment.data)))
        for segment in segments.values():
            segment.unsynced = False  # until this write is known to have failed
        return appends

    @staticmethod
    def _track_sync(task: asyncio.Task[bool] | None, segments: list[Segment]) -> None:
        """Mark the segments unsynced when their write was skipped (Redis cooling down) or fails."""

        def failed() -> None:
            for segment in segments:
                segment.unsynced = True

        if task is None:
            failed()
        else:
            task.add_done_callback(
                lambda finished: None if not finished.cancelled() and finished.result() else failed()
            )

    async def connect(self) -> None:
        if self.redis is not None:
            await self.redis.connect()

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()
