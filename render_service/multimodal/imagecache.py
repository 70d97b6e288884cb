"""The Redis tier of the processed-image cache (`--mm-cache-redis`): behind a load balancer, an
image another replica already processed costs a Redis GET here instead of a decode and resize.

Render runs synchronously on the event loop, so Redis is asked in the async step before it
(`ImageTier.prepare`): every image of the request is decoded from its data: URL (once: the bytes go
to the render in `media.FetchedImages`) and hashed as `ImageProcessor` hashes it (once: the digest
goes along too); the images the local cache lacks are asked for in one MGET, verified and put into
the local cache, where the render then finds them. What the render had to process itself is written
back afterwards (`ImageTier.store`), write-behind: a bounded wait, then the write finishes in the
background and never fails the request.

Keys: `rs:mm:<namespace>:<t|l>:<mm_hash>`. The mm_hash covers the image bytes, the model path and a
request's kwargs, not what this server applies to every request, so the namespace hashes that: the
fingerprint's `multimodal` component (preprocessor_config.json, --mm-processor-kwargs,
--limit-mm-per-prompt), the vision config, the server's resize bounds, the service version (a
processing fix must not meet entries of the old code) and this module's format version. `t` entries
carry the tensors (what a `mm_payload: "tensors"` render needs), `l` entries only the grid and
metadata (llm-d's hashes-only renders): a light entry is small, and a tensors request never asks
for one, so it can never be served one.

Values: `MAC(32) | version | kind | num_tokens (u32) | len(metadata) (u32) | mm_hash (64 hex) |
metadata | kwargs_data` (kwargs_data is the base64 JSON string the response carries: nothing to
re-encode on a hit). The MAC is keyed blake3 (key derived from --snapshot-key, ~4x faster than
HMAC-SHA256 over megabytes) over the Redis key and the rest, so an entry moved to another key, cut
short, written under another key or by an older format is a miss (counted), never wrong tensors.

Redis is reached like the snapshot store's: short timeouts, then a cool-down during which it is not
asked; a dead or slow Redis costs a bounded delay and the images are processed here. A read's
timeout is an idle timeout (megabytes arriving are progress) and a read that times out or finds
every connection busy is load, not failure: only several in a row turn reads off. Reads and writes
cool down separately (a failed write does not stop reads). Reads go
through `FastReader` (a few lines of RESP2 over TCP or TLS, values read straight into their buffers:
redis-py's asyncio parser spent more CPU copying a 720p entry than a local hit costs), writes
through `Writer` (one blocking socket in a thread); unix-socket URLs use redis-py.

Topologies (`render_service.redis_target`): with Sentinel, the fast paths ask the sentinels for the
master's address whenever they open a connection, so after a failover the next connection reaches
the promoted replica (meanwhile reads miss and images are processed here). With a Cluster, the
keys of one MGET usually live in different slots: `ClusterReader` splits it per slot, sends the
parts to their nodes at once (one `FastReader` per node, the slot map from redis-py's cluster
client) and puts the values back in order; a MOVED refreshes the slot map and retries once, an ASK
retries once on the named node after ASKING. `ClusterWriter` routes the SETs the same way.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from blake3 import blake3

from render_service import __version__
from render_service.exceptions import RenderServiceError
from render_service.multimodal import media
from render_service.multimodal.qwen3_vl import ImageProcessor, ProcessedImage
from render_service.redis_target import CLUSTER, SENTINEL, RedisTarget
from render_service.server.metrics import Metrics

logger = logging.getLogger("render_service.multimodal.imagecache")

FORMAT_VERSION = 1
TIMEOUTS_BEFORE_COOLDOWN = 3
# A read's overall bound, in idle timeouts: megabytes at loopback or LAN speed, not a stuck server.
READ_DEADLINE_FACTOR = 20
_MAC_SIZE = 32
_HEADER = struct.Struct("<BcII64s")  # version, kind, num_tokens, len(metadata), mm_hash
_TENSORS, _LIGHT = b"t", b"l"
_KEY_CONTEXT = "render-service processed-image cache (Redis tier) v1"
# With Sentinel, how often the fast paths ask again where the master is (and on every connection).
LOCATE_EVERY = 1.0

Address = tuple[str, int]


class EntryRejected(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _item_nbytes(kwargs_json: bytes | None, metadata: str) -> int:
    return (len(kwargs_json) if kwargs_json is not None else 0) + len(metadata) + 200  # as multimodal.process


def light(item: ProcessedImage) -> ProcessedImage:
    """The light item of a full one (a tensors render also serves later hashes-only renders)."""
    if not item.has_tensors:
        return item
    return ProcessedImage(
        mm_hash=item.mm_hash,
        num_tokens=item.num_tokens,
        kwargs_data=None,
        kwargs_json=None,
        metadata=item.metadata,
        nbytes=_item_nbytes(None, item.metadata),
    )


class EntryCodec:
    """Processed images to authenticated Redis values and back."""

    def __init__(self, secret: bytes) -> None:
        self._key = blake3(secret, derive_key_context=_KEY_CONTEXT).digest()

    def _mac(self, redis_key: bytes, payload: bytes | memoryview, body: bytes) -> bytes:
        hasher = blake3(key=self._key)
        hasher.update(len(redis_key).to_bytes(8, "little") + redis_key)
        hasher.update(payload)
        hasher.update(body)
        return hasher.digest()

    def encode_parts(self, redis_key: str, item: ProcessedImage) -> tuple[bytes, bytes, bytes]:
        """The value as (MAC, header and metadata, kwargs_data): written one after the other, the
        megabytes of kwargs_data are never copied into a new value."""
        metadata = item.metadata.encode("ascii")
        kind = _TENSORS if item.has_tensors else _LIGHT
        payload = (
            _HEADER.pack(FORMAT_VERSION, kind, item.num_tokens, len(metadata), item.mm_hash.encode("ascii")) + metadata
        )
        body = item.kwargs_json or b""
        return self._mac(redis_key.encode(), payload, body), payload, body

    def encode(self, redis_key: str, item: ProcessedImage) -> bytes:
        return b"".join(self.encode_parts(redis_key, item))

    def decode(
        self, redis_key: str, blob: bytes | bytearray | memoryview, mm_hash: str, tensors: bool
    ) -> ProcessedImage:
        """The item, or EntryRejected. `blob` may be a view of the reader's buffer: the tensors are
        copied out once, after the MAC is checked."""
        if not isinstance(blob, (bytes, bytearray, memoryview)) or len(blob) < _MAC_SIZE + _HEADER.size:
            raise EntryRejected("malformed")
        view = memoryview(blob)
        mac = self._mac(redis_key.encode(), view[_MAC_SIZE:], b"")
        if not hmac.compare_digest(mac, view[:_MAC_SIZE]):
            raise EntryRejected("bad_mac")
        version, kind, num_tokens, meta_len, digest = _HEADER.unpack_from(view, _MAC_SIZE)
        if version != FORMAT_VERSION:
            raise EntryRejected("version")
        start = _MAC_SIZE + _HEADER.size
        end = start + meta_len
        # Signed by a replica with our key: checked anyway, cheaply, so a bug cannot become wrong tensors.
        if (
            kind != (_TENSORS if tensors else _LIGHT)
            or digest != mm_hash.encode("ascii")
            or num_tokens <= 0
            or end > len(view)
        ):
            raise EntryRejected("malformed")
        metadata = bytes(view[start:end]).decode("ascii")
        kwargs_json = None
        if tensors:
            if len(view) - end < 2 or view[end] != 0x22 or view[-1] != 0x22:  # a JSON string: '"...base64..."'
                raise EntryRejected("malformed")
            kwargs_json = bytes(view[end:])
        elif len(view) != end:
            raise EntryRejected("malformed")
        return ProcessedImage(
            mm_hash=mm_hash,
            num_tokens=num_tokens,
            kwargs_data=orjson.Fragment(kwargs_json) if kwargs_json is not None else None,
            kwargs_json=kwargs_json,
            metadata=metadata,
            nbytes=_item_nbytes(kwargs_json, metadata),
        )


def namespace(multimodal_component: str, vision: ImageProcessor) -> str:
    """What changes a processed item for a given mm_hash, hashed (see the module docstring)."""
    config = vision.config
    parts = {
        "format": FORMAT_VERSION,
        "service_version": __version__,
        "multimodal": multimodal_component,
        "vision": [
            config.model_id,
            config.image_token_id,
            config.patch_size,
            config.merge_size,
            config.temporal_patch_size,
            config.min_pixels,
            config.max_pixels,
        ],
        "bounds": [vision.default_options.min_pixels, vision.default_options.max_pixels],
    }
    return blake3(orjson.dumps(parts)).hexdigest()[:16]


class Prepared(media.FetchedImages):
    """`FetchedImages` plus what `store` needs after the render: the digests the render processed."""

    def __init__(self, bodies: dict[str, bytes], hash_kwargs: dict[str, Any]) -> None:
        super().__init__(bodies, hash_kwargs)
        self.pending: list[str] = []


class RedisError(Exception):
    """An error reply, a protocol violation or a closed connection (the connection is dropped)."""


class Busy(TimeoutError):
    """Every reader connection stayed busy for the idle timeout: load, not a Redis failure."""


class _Replies(asyncio.BufferedProtocol):
    """One connection's RESP2 replies, one request at a time. A bulk string is read by the kernel
    straight into its own buffer: redis-py's asyncio parser copies a 7 MB value several times over
    (~11 ms of CPU per 720p image, most of what processing it costs), this ~2.5 ms."""

    def __init__(self, max_bulk: int = 512 << 20) -> None:
        self.transport: asyncio.Transport | None = None
        # A value's size comes from the server: a sanity bound before allocating it (far above any
        # entry a replica writes, whatever its --mm-cache-redis-max-entry-bytes).
        self.max_bulk = max_bulk
        self._scratch = bytearray(1 << 16)
        self._scratch_view = memoryview(self._scratch)
        self._pending = bytearray()
        self._target: memoryview | None = None  # the bulk string being filled
        self._filled = 0
        self._waiter: asyncio.Future[Any] | None = None
        self._array: list[Any] | None = None
        self._count = 0
        self._bulk: bytearray | None = None
        self.broken = False
        self.progress_at = 0.0  # monotonic time of the last bytes received
        self.address: Address | None = None  # the server, as FastReader named it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisError(f"connection lost: {exc}"))

    def get_buffer(self, sizehint: int) -> memoryview:
        # Always a memoryview: asyncio's TLS transport fills the buffer in several reads through
        # `buffer[offset:]`, which on a bytearray would be a copy (the bytes after the first TLS
        # record were lost that way).
        return self._target[self._filled :] if self._target is not None else self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        self.progress_at = time.monotonic()
        try:
            if self._target is not None:
                self._filled += nbytes
                if self._filled < len(self._target):
                    return
                self._target = None
                self._bulk_done()
            else:
                self._pending += self._scratch_view[:nbytes]
            self._parse()
        except (RedisError, ValueError) as exc:  # ValueError: a length that is not a number
            self._fail(RedisError(str(exc)))

    def _fail(self, exc: Exception) -> None:
        self.broken = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _finish(self, value: Any) -> None:
        if self._waiter is None or self._waiter.done():
            raise RedisError("a reply nobody asked for")
        self._waiter.set_result(value)

    def _value(self, value: Any) -> None:
        if self._array is None:
            self._finish(value)
            return
        self._array.append(value)
        if len(self._array) == self._count:
            array, self._array = self._array, None
            self._finish(array)

    def _bulk_done(self) -> None:
        bulk, self._bulk = self._bulk, None
        assert bulk is not None
        if bulk[-2:] != b"\r\n":
            raise RedisError("bulk string not terminated")
        self._value(memoryview(bulk)[:-2])

    def _parse(self) -> None:
        pending = self._pending
        while self._target is None and self._waiter is not None and not self._waiter.done():
            end = pending.find(b"\r\n")
            if end < 0:
                return
            kind, line = pending[:1], bytes(pending[1:end])
            del pending[: end + 2]
            if kind == b"+":
                self._value(line.decode("utf-8", "replace"))
            elif kind == b"-":
                raise RedisError(line.decode("utf-8", "replace"))
            elif kind == b":":
                self._value(int(line))
            elif kind == b"$":
                size = int(line)
                if size < 0:
                    self._value(None)
                    continue
                if size > self.max_bulk:
                    raise RedisError(f"value of {size} bytes is over the {self.max_bulk}-byte bound")
                self._bulk = bytearray(size + 2)
                take = min(len(pending), size + 2)
                self._bulk[:take] = pending[:take]
                del pending[:take]
                if take < size + 2:
                    self._target, self._filled = memoryview(self._bulk), take
                    return
                self._bulk_done()
            elif kind == b"*" and self._array is None:
                self._count = int(line)
                if self._count <= 0:
                    self._finish([] if self._count == 0 else None)
                else:
                    self._array = []
            else:
                raise RedisError(f"unexpected reply type {kind!r}")

    async def request(self, *args: bytes, idle_timeout: float | None = None) -> Any:
        """The reply; with `idle_timeout`, TimeoutError once that long passes without a byte of it
        (a large value arriving slowly is progress, not a failure)."""
        if self.broken or self.transport is None or self.transport.is_closing():
            raise RedisError("connection closed")
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self.progress_at = time.monotonic()
        self.transport.write(b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args)]))
        try:
            if idle_timeout is None:
                return await waiter
            while True:
                quiet = time.monotonic() - self.progress_at
                if quiet >= idle_timeout:
                    raise TimeoutError(f"no reply bytes from Redis for {idle_timeout}s")
                done, _ = await asyncio.wait({waiter}, timeout=idle_timeout - quiet)
                if done:
                    return waiter.result()
        except BaseException:
            self.broken = True  # cancelled or failed mid-reply: its bytes may still come
            self.transport.close()
            raise


class FastReader:
    """MGET over a few TCP (or TLS) connections of `_Replies` (unix sockets go through redis-py).
    `locate`, when given, names the server each time a connection is opened (a Sentinel's
    current master) instead of `host`/`port`."""

    def __init__(
        self,
        host: str,
        port: int,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        max_connections: int = 8,
        max_value_bytes: int = 512 << 20,
        ssl_context: ssl.SSLContext | None = None,
        locate: Callable[[], Awaitable[Address]] | None = None,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.max_value_bytes = max_value_bytes
        self.username, self.password = username, password
        self.ssl_context, self.locate = ssl_context, locate
        self._located: Address | None = None
        self._located_at = -LOCATE_EVERY
        # Reads beyond this many wait for a connection (bounded by the caller's idle timeout).
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Replies] = []
        self._open = 0

    async def _where(self) -> Address:
        """The server's address: asked of `locate` at most every LOCATE_EVERY seconds, so a
        promoted replica is found even while the old master still answers (a forced failover
        reconfigures it a few seconds later)."""
        if self.locate is None:
            return self.host, self.port
        if self._located is None or time.monotonic() - self._located_at >= LOCATE_EVERY:
            self._located, self._located_at = await self.locate(), time.monotonic()
        return self._located

    async def _connect(self, where: Address) -> _Replies:
        self._open += 1
        try:
            host, port = where
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: _Replies(self.max_value_bytes),
                host,
                port,
                ssl=self.ssl_context,
                server_hostname=host if self.ssl_context is not None else None,
            )
            conn.address = where
            if self.password is not None:
                auth = [self.username.encode(), self.password.encode()] if self.username else [self.password.encode()]
                await conn.request(b"AUTH", *auth)
            if self.db:
                await conn.request(b"SELECT", str(self.db).encode())
        except BaseException:
            self._open -= 1
            raise
        return conn

    async def mget(
        self, keys: list[str], idle_timeout: float | None = None, asking: bool = False
    ) -> list[memoryview | None]:
        """`idle_timeout` bounds the wait for a free connection (then `Busy`) and each silence of the
        reply (then TimeoutError), not the transfer of a large value. `asking`: send ASKING first
        (a Cluster slot being migrated to this node)."""
        try:
            await asyncio.wait_for(self._slots.acquire(), idle_timeout)
        except TimeoutError:
            raise Busy(f"all {self.max_connections} Redis connections busy for {idle_timeout}s") from None
        try:
            return await self._mget(keys, idle_timeout, asking)
        finally:
            self._slots.release()

    async def _mget(self, keys: list[str], idle_timeout: float | None, asking: bool) -> list[memoryview | None]:
        where = await self._where()
        while self._idle:
            conn = self._idle.pop()
            if not conn.broken and conn.address == where:
                break
            if conn.transport is not None:
                conn.transport.close()
            self._open -= 1
        else:
            conn = await self._connect(where)
        try:
            if asking:
                await conn.request(b"ASKING", idle_timeout=idle_timeout)
            reply = await conn.request(b"MGET", *(key.encode() for key in keys), idle_timeout=idle_timeout)
        except BaseException:
            self._open -= 1
            raise
        self._idle.append(conn)
        if not isinstance(reply, list) or len(reply) != len(keys):
            raise RedisError("unexpected MGET reply")
        return reply

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()


class Writer:
    """SET ... EX over one blocking socket, in one worker thread: the write-behind neither holds the
    event loop nor copies the megabytes (redis-py's asyncio writer joins and re-buffers a 7 MB value:
    ~2.7 ms of CPU per 720p image against ~0.5 ms for the kernel's copy here). The entries are also
    signed in that thread (blake3 releases the GIL)."""

    def __init__(
        self,
        host: str,
        port: int,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
        locate: Callable[[], Address] | None = None,
    ) -> None:
        import socket
        from concurrent.futures import ThreadPoolExecutor

        self._socket_module = socket
        self.address, self.db, self.username, self.password, self.timeout = (
            (host, port),
            db,
            username,
            password,
            timeout,
        )
        # `locate` (run in the writer's thread): a Sentinel's current master, asked per connection
        # and at most every LOCATE_EVERY seconds while a connection is kept.
        self.ssl_context, self.locate = ssl_context, locate
        self._sock_address: Address | None = None
        self._located_at = -LOCATE_EVERY
        self._sock: Any = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="mm-redis-write")

    @staticmethod
    def _command(*args: bytes) -> bytes:
        return b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args)])

    def _replies(self, sock: Any, count: int) -> None:
        """Read `count` one-line replies; any error reply fails the batch."""
        data = b""
        while data.count(b"\r\n") < count:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("Redis closed the connection")
            data += chunk
        errors = [line for line in data.split(b"\r\n")[:count] if not line.startswith(b"+")]
        if errors:
            raise RedisError(errors[0].decode("utf-8", "replace"))

    def _where(self) -> Address:
        if self.locate is None:
            return self.address
        if self._sock is None or time.monotonic() - self._located_at >= LOCATE_EVERY:
            where, self._located_at = self.locate(), time.monotonic()
            if self._sock is not None and where != self._sock_address:  # failed over: drop the old master
                self._sock.close()
                self._sock = None
            return where
        return self._sock_address or self.address

    def _connect(self, where: Address) -> Any:
        host, port = where
        sock = self._socket_module.create_connection((host, port), timeout=self.timeout)
        try:
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=host)
            setup = []
            if self.password is not None:
                setup.append(
                    self._command(b"AUTH", *([self.username.encode()] if self.username else []), self.password.encode())
                )
            if self.db:
                setup.append(self._command(b"SELECT", str(self.db).encode()))
            if setup:
                sock.sendall(b"".join(setup))
                self._replies(sock, len(setup))
        except BaseException:
            sock.close()
            raise
        return sock

    def _set_all(self, codec: EntryCodec, entries: list[tuple[str, ProcessedImage]], ttl: int) -> None:
        """SET them all. A kept socket the server has closed meanwhile (its idle `timeout`, a restart)
        fails at once: then once more on a new one (SET is idempotent)."""
        reused = self._sock is not None
        try:
            self._send_all(codec, entries, ttl)
        except OSError:
            if not reused:
                raise
            self._send_all(codec, entries, ttl)

    def _send_all(self, codec: EntryCodec, entries: list[tuple[str, ProcessedImage]], ttl: int) -> None:
        try:
            where = self._where()
            if self._sock is None:
                self._sock, self._sock_address = self._connect(where), where
            sock = self._sock
            for key, item in entries:
                mac, payload, body = codec.encode_parts(key, item)
                size = len(mac) + len(payload) + len(body)
                sock.sendall(
                    b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s%s" % (len(key), key.encode(), size, mac, payload)
                )
                if body:
                    sock.sendall(body)
                sock.sendall(b"\r\n$2\r\nEX\r\n$%d\r\n%d\r\n" % (len(str(ttl)), ttl))
            self._replies(sock, len(entries))
        except BaseException:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            raise

    async def set_all(self, codec: EntryCodec, entries: list[tuple[str, ProcessedImage]], ttl: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._set_all, codec, entries, ttl)

    def close(self) -> None:
        def shut() -> None:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

        self._executor.submit(shut)
        self._executor.shutdown(wait=True)


class SlotMap:
    """A Cluster's slot -> node map, kept by redis-py's cluster client (CLUSTER SLOTS at first use,
    again after a MOVED)."""

    def __init__(self, target: RedisTarget, timeout: float) -> None:
        self._cluster = target.async_client(timeout)
        self._ready = False

    async def refresh(self) -> None:
        if self._ready:
            await self._cluster.nodes_manager.initialize()
        else:
            await self._cluster.initialize()
            self._ready = True

    async def nodes(self, keys: list[str]) -> dict[Address, dict[int, list[int]]]:
        """node -> slot -> indexes into `keys`."""
        from redis.crc import key_slot

        if not self._ready:
            await self.refresh()
        manager = self._cluster.nodes_manager
        routes: dict[Address, dict[int, list[int]]] = {}
        for index, key in enumerate(keys):
            slot = key_slot(key.encode())
            node = manager.get_node_from_slot(slot)
            routes.setdefault((node.host, int(node.port)), {}).setdefault(slot, []).append(index)
        return routes

    async def aclose(self) -> None:
        try:
            await self._cluster.aclose()
        except Exception:
            pass


def _redirect(exc: BaseException) -> tuple[str, Address] | None:
    """("MOVED" | "ASK", node) from a Cluster redirection error, else None."""
    words = str(exc).lstrip("-").split()  # the writer's errors keep RESP's "-"
    if len(words) == 3 and words[0] in ("MOVED", "ASK"):
        host, _, port = words[2].rpartition(":")
        if host and port.isdigit():
            return words[0], (host, int(port))
    return None


class ClusterReader:
    """MGET over a Cluster: split per slot (a multi-key command must stay in one slot), sent to the
    slots' nodes concurrently, one `FastReader` per node, reassembled in the keys' order."""

    def __init__(self, target: RedisTarget, slots: SlotMap) -> None:
        self._target, self._slots = target, slots
        self._parts = target.url_parts()
        self._ssl = target.ssl_context()
        self._readers: dict[Address, FastReader] = {}

    def _reader(self, node: Address) -> FastReader:
        reader = self._readers.get(node)
        if reader is None:
            reader = self._readers[node] = FastReader(
                node[0],
                node[1],
                username=self._parts["username"],
                password=self._parts["password"],
                ssl_context=self._ssl,
            )
        return reader

    async def mget(self, keys: list[str], idle_timeout: float | None = None) -> list[memoryview | None]:
        values: list[memoryview | None] = [None] * len(keys)
        moved = False

        async def read(node: Address, indexes: list[int]) -> None:
            nonlocal moved
            wanted = [keys[i] for i in indexes]
            try:
                found = await self._reader(node).mget(wanted, idle_timeout)
            except RedisError as exc:
                redirect = _redirect(exc)
                if redirect is None:
                    raise
                kind, target = redirect
                moved = moved or kind == "MOVED"
                found = await self._reader(target).mget(wanted, idle_timeout, asking=kind == "ASK")
            for index, value in zip(indexes, found, strict=True):
                values[index] = value

        routes = await self._slots.nodes(keys)
        try:
            await asyncio.gather(*(read(node, part) for node, slots in routes.items() for part in slots.values()))
        finally:
            if moved:  # the slot map is stale: learn the new one for the next reads
                await self._slots.refresh()
        return values

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()


class ClusterWriter:
    """`Writer.set_all` per node of a Cluster (a SET needs no slot grouping: one key each)."""

    def __init__(self, target: RedisTarget, slots: SlotMap, timeout: float) -> None:
        self._slots, self._timeout = slots, timeout
        self._parts = target.url_parts()
        self._ssl = target.ssl_context()
        self._writers: dict[Address, Writer] = {}

    def _writer(self, node: Address) -> Writer:
        writer = self._writers.get(node)
        if writer is None:
            writer = self._writers[node] = Writer(
                node[0],
                node[1],
                username=self._parts["username"],
                password=self._parts["password"],
                timeout=self._timeout,
                ssl_context=self._ssl,
            )
        return writer

    async def set_all(self, codec: EntryCodec, entries: list[tuple[str, ProcessedImage]], ttl: int) -> None:
        async def write(node: Address, part: list[tuple[str, ProcessedImage]]) -> None:
            try:
                await self._writer(node).set_all(codec, part, ttl)
            except RedisError as exc:  # resharded: once more where the map now says (SET is idempotent)
                if _redirect(exc) is None:
                    raise
                await self._slots.refresh()
                for again, indexes in (await self._slots.nodes([key for key, _ in part])).items():
                    chosen = [part[i] for slot in indexes.values() for i in slot]
                    await self._writer(again).set_all(codec, chosen, ttl)

        routes = await self._slots.nodes([key for key, _ in entries])
        await asyncio.gather(
            *(write(node, [entries[i] for part in slots.values() for i in part]) for node, slots in routes.items())
        )

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


def fast_paths(target: RedisTarget, timeout: float) -> tuple[Any, Any, Any]:
    """(reader, writer, what else to close: an `aclose()`-able or None) of the fast paths for
    `target`; (None, None, None) for a unix socket, which redis-py serves."""
    if target.unix:
        return None, None, None
    parts = target.url_parts()
    context = target.ssl_context()
    if target.mode == CLUSTER:
        slots = SlotMap(target, timeout)
        return ClusterReader(target, slots), ClusterWriter(target, slots, timeout * 4), slots
    common = {
        "db": parts["db"],
        "username": parts["username"],
        "password": parts["password"],
        "ssl_context": context,
    }
    if target.mode == SENTINEL:
        master = target.sentinel_master
        async_sentinel = target.async_sentinel(timeout)
        sync_sentinel = target.sync_sentinel(timeout)

        async def locate() -> Address:
            host, port = await async_sentinel.discover_master(master)
            return host, int(port)

        def locate_sync() -> Address:
            host, port = sync_sentinel.discover_master(master)
            return host, int(port)

        return (
            FastReader("", 0, **common, locate=locate),
            Writer("", 0, **common, timeout=timeout * 4, locate=locate_sync),
            async_sentinel,
        )
    host, port = parts["host"] or "localhost", parts["port"]
    return FastReader(host, port, **common), Writer(host, port, **common, timeout=timeout * 4), None


def _reader(url: str) -> FastReader | None:
    """The standalone reader of a URL (None for a unix socket)."""
    reader, _, _ = fast_paths(RedisTarget(url=url), 0.25)
    return reader


class ImageTier:
    """Redis with short timeouts and a cool-down after failures; never raises to the caller."""

    def __init__(
        self,
        target: RedisTarget | str,
        secret: bytes,
        namespace: str,
        metrics: Metrics,
        *,
        ttl: int = 600,
        max_entry_bytes: int = 32 << 20,
        timeout: float = 0.25,
        cooldown: float = 2.0,
        write_wait: float = 0.005,
        max_pending_bytes: int = 256 << 20,
    ) -> None:
        if isinstance(target, str):
            target = RedisTarget(url=target)
        # The reads carry megabytes (7.2 MB per 720p image with tensors): a longer bound than the
        # snapshot store's 50 ms, still far below processing four such images (~65 ms of CPU).
        # redis-py serves only what the fast paths do not (unix sockets).
        self._reader, self._writer, self._resources = fast_paths(target, timeout)
        self._slots = self._resources if isinstance(self._resources, SlotMap) else None
        self._client = target.async_client(timeout) if self._reader is None else None
        self.codec = EntryCodec(secret)
        self.prefix = f"rs:mm:{namespace}:"
        self.metrics = metrics
        self.ttl = ttl
        self.max_entry_bytes = max_entry_bytes
        self.timeout = timeout
        self.cooldown = cooldown
        self.write_wait = write_wait
        # Writes in flight are bounded so a slow Redis cannot pile up copies of images in memory.
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._down_until = {"get": 0.0, "set": 0.0}  # reads and writes cool down separately
        self._timeouts_in_a_row = 0
        self._pending: set[asyncio.Task[None]] = set()

    def key(self, mm_hash: str, tensors: bool) -> str:
        return f"{self.prefix}{'t' if tensors else 'l'}:{mm_hash}"

    @property
    def available(self) -> bool:
        """Reads are on (writes have their own cool-down: a failed write does not stop reads)."""
        return self._available("get")

    def _available(self, op: str) -> bool:
        return time.monotonic() >= self._down_until[op]

    def _failed(self, op: str, exc: BaseException) -> None:
        """Count it; cool `op` down, except for a read that only timed out or found every connection
        busy: that is load (many megabytes at once), and only TIMEOUTS_BEFORE_COOLDOWN in a row
        turn reads off."""
        self.metrics.mm_redis_errors.labels(op).inc()
        if op == "get" and isinstance(exc, TimeoutError):
            self._timeouts_in_a_row += 1
            if self._timeouts_in_a_row < TIMEOUTS_BEFORE_COOLDOWN:
                return
        if self._available(op):
            logger.warning(
                "redis %s of processed images failed (%s: %s); not used for %.1fs",
                op,
                type(exc).__name__,
                exc,
                self.cooldown,
            )
        self._down_until[op] = time.monotonic() + self.cooldown

    async def prepare(
        self,
        vision: ImageProcessor,
        urls: list[str],
        fetched: dict[str, bytes],
        processor_kwargs: Any,
        tensors: bool,
        limits: media.MediaLimits,
        trust_kwargs: bool,
    ) -> Prepared | dict[str, bytes]:
        """Decode and hash the request's images (`urls`: all of them, data: included, as
        `media.image_urls(..., include_data=True)` gives them), and fill the local cache from Redis
        with those it lacks. Anything the render would refuse is left to the render (same error,
        same order): the request is then prepared without those images, or not at all."""
        if not urls or len(urls) > limits.max_images_per_prompt:
            return fetched
        try:
            if processor_kwargs and (not trust_kwargs or not isinstance(processor_kwargs, dict)):
                return fetched
            options = vision.options(processor_kwargs) if processor_kwargs else vision.default_options
        except RenderServiceError:
            return fetched
        prepared = Prepared(fetched, options.hash_kwargs)
        wanted: dict[str, None] = {}
        memo = options is vision.default_options
        for url in urls:
            if id(url) in prepared.known:
                continue
            if memo and url.startswith("data:") and vision.knows_data_url(url, tensors):
                continue  # the render serves it from the URL memo: nothing to decode, hash or fetch
            try:
                data = media.decode_data_url(url, limits) if url.startswith("data:") else fetched.get(url)
                if data is None:
                    continue
                digest = vision.identify(data, options)
            except Exception:  # the render meets the same image and answers for it (a 400)
                continue
            prepared.known[id(url)] = (url, data, digest)
            if vision.cache.peek(digest, tensors) is None:
                wanted[digest] = None
        if wanted:
            found = await self._fetch(list(wanted), tensors)
            for digest in wanted:
                item = found.get(digest)
                if item is None:
                    prepared.pending.append(digest)
                else:
                    vision.cache.put(item)
        return prepared

    async def _fetch(self, digests: list[str], tensors: bool) -> dict[str, ProcessedImage]:
        metrics = self.metrics
        if not self.available:
            metrics.mm_redis_misses.inc(len(digests))
            return {}
        keys = [self.key(digest, tensors) for digest in digests]
        start = time.perf_counter()
        try:
            if self._reader is not None:  # idle-timed: a slow large transfer is progress
                read = self._reader.mget(keys, self.timeout)
            else:
                assert self._client is not None
                read = self._client.mget(keys)
            blobs = await asyncio.wait_for(read, self.timeout * READ_DEADLINE_FACTOR)
            self._timeouts_in_a_row = 0
        except Exception as exc:  # timeouts, connection and protocol errors
            self._failed("get", exc)
            metrics.mm_redis_misses.inc(len(digests))
            return {}
        finally:
            metrics.redis_latency.labels("mm_get").observe(time.perf_counter() - start)
        found: dict[str, ProcessedImage] = {}
        for key, digest, blob in zip(keys, digests, blobs, strict=True):
            if blob is None:
                metrics.mm_redis_misses.inc()
                continue
            metrics.mm_redis_fetched_bytes.inc(len(blob))
            try:
                found[digest] = self.codec.decode(key, blob, digest, tensors)
            except Exception as exc:  # EntryRejected; anything else is a malformed entry too, never a 500
                reason = exc.reason if isinstance(exc, EntryRejected) else "malformed"
                metrics.mm_redis_rejected.labels(reason).inc()
                metrics.mm_redis_misses.inc()
                logger.warning("rejected processed image %s from redis: %s", key, reason)
                continue
            metrics.mm_redis_hits.inc()
        return found

    async def store(self, vision: ImageProcessor, prepared: Any) -> None:
        """Write what this request's render processed (a full item also as its light one), waiting
        at most `write_wait`; the write then finishes in the background."""
        if not isinstance(prepared, Prepared) or not prepared.pending or not self._available("set"):
            return
        entries: list[tuple[str, ProcessedImage]] = []
        for digest in prepared.pending:
            item = vision.cache.peek(digest, tensors=False)
            if item is None:  # already evicted (or never cached: larger than the local cache)
                continue
            for variant in (item, light(item)) if item.has_tensors else (item,):
                if variant.nbytes > self.max_entry_bytes:
                    self.metrics.mm_redis_oversized.inc()
                    continue
                entries.append((self.key(digest, variant.has_tensors), variant))
        size = sum(item.nbytes for _, item in entries)  # what the entries hold on to until written
        if not entries or self._pending_bytes + size > self.max_pending_bytes:
            return
        self._pending_bytes += size
        task = asyncio.get_running_loop().create_task(self._write(entries, size))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if self.write_wait > 0:
            await asyncio.wait({task}, timeout=self.write_wait)

    async def _write(self, entries: list[tuple[str, ProcessedImage]], size: int) -> None:
        start = time.perf_counter()
        try:
            if self._writer is not None:  # bounded by its socket timeouts
                await self._writer.set_all(self.codec, entries, self.ttl)
            else:
                assert self._client is not None
                async with self._client.pipeline(transaction=False) as pipe:
                    for key, item in entries:
                        pipe.set(key, self.codec.encode(key, item), ex=self.ttl)
                    await asyncio.wait_for(pipe.execute(), self.timeout * 4)
            for _, item in entries:
                self.metrics.mm_redis_stored.labels("tensors" if item.has_tensors else "light").inc()
        except Exception as exc:
            self._failed("set", exc)
        finally:
            self._pending_bytes -= size
            self.metrics.redis_latency.labels("mm_set").observe(time.perf_counter() - start)

    async def flush(self) -> None:
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        if self._reader is not None:
            self._reader.close()
        if self._writer is not None:
            self._writer.close()
        if self._resources is not None:
            try:
                await self._resources.aclose()
            except Exception:
                pass
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception:
                pass
