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
a snapshot and the delete of the one it supersedes go to one node in one round trip.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Any

import msgspec
from cachetools import TTLCache

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

    def encode(self, snapshot: dict[str, Any]) -> bytes:
        payload = bytes([FORMAT_VERSION]) + _ENCODER.encode(snapshot)
        return hmac.new(self._key, payload, hashlib.sha256).digest() + payload

    def decode(self, blob: bytes) -> dict[str, Any]:
        if not isinstance(blob, (bytes, bytearray)) or len(blob) <= _MAC_SIZE + 1:
            raise SnapshotRejected("malformed")
        mac, payload = blob[:_MAC_SIZE], blob[_MAC_SIZE:]
        if not hmac.compare_digest(mac, hmac.new(self._key, payload, hashlib.sha256).digest()):
            raise SnapshotRejected("bad_signature")
        if payload[0] != FORMAT_VERSION:
            raise SnapshotRejected("version")
        try:
            value = _DECODER.decode(payload[1:])
        except msgspec.DecodeError:
            raise SnapshotRejected("malformed") from None
        if not isinstance(value, dict):
            raise SnapshotRejected("malformed")
        return value


def snapshot_key(fingerprint: str, stream_id: str, position: int) -> str:
    return f"rs:snap:{fingerprint[:16]}:{{{stream_id}}}:{position}"


class LocalStore:
    """A bounded in-process LRU with TTL, bounded both by entries and by bytes."""

    def __init__(self, max_entries: int = 100_000, max_bytes: int = 256 << 20, ttl: float = 600.0) -> None:
        self._by_bytes: TTLCache[str, bytes] = TTLCache(maxsize=max_bytes, ttl=ttl, getsizeof=len)
        self._max_entries = max_entries

    def get(self, key: str) -> bytes | None:
        return self._by_bytes.get(key)

    def put(self, key: str, value: bytes) -> None:
        if len(value) > self._by_bytes.maxsize:
            return
        if len(self._by_bytes) >= self._max_entries and key not in self._by_bytes:
            self._by_bytes.popitem()  # least recently used
        self._by_bytes[key] = value

    def delete(self, key: str) -> None:
        self._by_bytes.pop(key, None)

    def __len__(self) -> int:
        return len(self._by_bytes)


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
        self._pending: set[asyncio.Task[None]] = set()

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

    def put(self, key: str, value: bytes, stale_key: str | None = None) -> asyncio.Task[None] | None:
        """Schedule a pipelined write (and the delete of a superseded snapshot); returns at once."""
        if not self.available:
            return None
        task = asyncio.get_running_loop().create_task(self._write(key, value, stale_key))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _write(self, key: str, value: bytes, stale_key: str | None) -> None:
        start = time.perf_counter()
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.set(key, value, ex=self._ttl)
                if stale_key is not None:
                    pipe.delete(stale_key)
                await asyncio.wait_for(pipe.execute(), self._timeout * 5)
        except Exception as exc:
            self._failed("set", exc)
        finally:
            self._metrics.redis_latency.labels("set").observe(time.perf_counter() - start)

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

    async def get(self, key: str, required: bool = False) -> dict[str, Any] | None:
        for tier, blob in await self._lookup(key, required):
            try:
                snapshot = self.codec.decode(blob)
            except SnapshotRejected as exc:
                self.metrics.snapshot_rejected.labels(exc.reason).inc()
                logger.warning("rejected snapshot %s from %s: %s", key, tier, exc.reason)
                if tier == "local" and self.local is not None:
                    self.local.delete(key)
                continue
            self.metrics.snapshot_hits.labels(tier).inc()
            if tier == "redis" and self.local is not None:
                self.local.put(key, blob)
            return snapshot
        self.metrics.snapshot_misses.inc()
        return None

    async def _lookup(self, key: str, required: bool = False) -> list[tuple[str, bytes]]:
        found = []
        if self.local is not None and (blob := self.local.get(key)) is not None:
            found.append(("local", blob))
            return found
        if self.redis is not None and (blob := await self.redis.get(key, required)) is not None:
            found.append(("redis", blob))
        return found

    async def put(self, key: str, snapshot: dict[str, Any], stale_key: str | None = None) -> int:
        """Store locally at once; give the Redis write up to `write_wait` seconds, then let it finish
        in the background. The bounded wait is what lets the next chunk, sent at once to another
        replica, find the snapshot instead of replaying."""
        blob = self.codec.encode(snapshot)
        self.metrics.snapshot_bytes.observe(len(blob))
        if self.local is not None:
            self.local.put(key, blob)
            if stale_key is not None:
                self.local.delete(stale_key)
        if self.redis is not None:
            task = self.redis.put(key, blob, stale_key)
            if task is not None and self.write_wait > 0:
                await asyncio.wait({task}, timeout=self.write_wait)
        return len(blob)

    async def connect(self) -> None:
        if self.redis is not None:
            await self.redis.connect()

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()
