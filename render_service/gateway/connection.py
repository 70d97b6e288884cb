"""HTTP/1.1 to the engines: keep-alive connections on asyncio protocols, parsed by httptools.

The gateway makes one request per client request and reads one small SSE event per generated
token, so the client's own cost is on the critical path twice: before the engine sees the request
(TTFT) and between each engine chunk and the client's (inter-token latency). A general client
(httpx over anyio and httpcore) spent 1.5 ms before a request left, measured side by side with a
bare socket, and a layered read per chunk. Here a request is one `write` of prebuilt bytes on a
pooled connection (TCP_NODELAY, as asyncio sets it), and each body piece goes from the protocol's
`data_received` through httptools (C, uvicorn's parser) straight to the reader.

A response whose body was not read to its end (the client left, an error) closes its connection,
which is how an engine learns to abort; one read to the end goes back to the pool. A pooled
connection that the engine closed while idle (its keep-alive timeout) fails before any answer:
the request is sent again once on a new connection, so an idle close never counts against the
engine.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

MAX_IDLE_PER_ORIGIN = 64  # pooled connections kept per engine
READ_PAUSE_BYTES = 1 << 20  # unread body bytes above which the socket stops being read


class TransportError(Exception):
    """A request that failed on the way (no usable answer)."""


class ConnectError(TransportError):
    pass


class ConnectTimeout(ConnectError):
    pass


class ReadTimeout(TransportError):
    """The engine was silent (no answer, or no body bytes) for longer than the timeout."""


class RemoteProtocolError(TransportError):
    """The engine closed the connection early or sent something that is not HTTP/1.1."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class _Connection(asyncio.Protocol):
    """One connection and the response being read on it (one at a time: no pipelining)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False  # has carried a request before (an idle close may have raced it)
        self._timer: asyncio.TimerHandle | None = None  # the read timeout (see `wait`)
        self._deadline = 0.0  # loop time by which the current wait must see something
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.error: TransportError | None = None
        self.received_any = False
        self.sent_at = 0.0  # perf_counter when the request was written
        self.first_body_at = 0.0  # perf_counter when its first body bytes arrived
        self._reusable = False
        self._framed = False  # content-length or chunked (else the body ends when the connection does)
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RemoteProtocolError(f"malformed HTTP from the engine: {exc}"))
            return
        if self._buffered > READ_PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.headers_done and not self.complete and not self._framed:
            self.complete = True  # a body delimited by the connection's end
        elif not self.complete and self.error is None:
            self.error = RemoteProtocolError("the engine closed the connection before the answer ended")
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True
        self.headers.append((lower, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            self.headers = []
            return
        self.headers_done = True
        self._reusable = self._parser.should_keep_alive()  # asked now: llhttp forgets it once the message ends
        if self.status in (204, 304):
            self._framed = True

    def on_body(self, body: bytes) -> None:
        if not self.first_body_at:
            self.first_body_at = time.perf_counter()
        self._chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self.headers_done:
            self.complete = True

    # -- the reader's side -------------------------------------------------------------------

    def _fail(self, error: TransportError) -> None:
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until something new arrives (bytes, the end, an error), at most `timeout` seconds.

        A stream waits once per engine chunk, so the timeout is one timer per connection that is
        moved on only when it fires (to the current wait's deadline), not a timer per wait."""
        loop = self.loop
        waiter = self._waiter = loop.create_future()
        deadline = self._deadline = loop.time() + timeout
        timer = self._timer
        if timer is None or timer.when() > deadline:  # none armed, or armed for a longer timeout
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._check_deadline)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits now: the next wait arms the timer again
        if self.loop.time() >= self._deadline:
            waiter.set_exception(ReadTimeout("the engine was silent for longer than the timeout"))
        else:  # this wait began after the timer was set: on to its own deadline
            self._timer = self.loop.call_at(self._deadline, self._check_deadline)

    def take(self) -> bytes:
        """The body bytes received and not yet read."""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    @property
    def has_body(self) -> bool:
        return bool(self._chunks)

    @property
    def keep_alive(self) -> bool:
        return not self.closed and self.complete and self._reusable

    def send(self, data: bytes) -> None:
        self._reset()
        assert self.transport is not None
        # Stamped as the bytes are handed to the kernel: the write wakes the engine, and on a busy
        # machine the scheduler may run it (and others) before this process gets its core back, a
        # wait that delays nothing the engine does.
        self.sent_at = time.perf_counter()
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class Response:
    """An engine's answer, its status and headers read; the body is read with `read()` or
    `aiter_bytes()`. `aclose()` returns the connection to the pool when the body was read to its
    end, else closes it."""

    def __init__(self, pool: ConnectionPool, origin: Origin, connection: _Connection, timeout: float) -> None:
        self._pool = pool
        self._origin = origin
        self._connection = connection
        self._timeout = timeout
        self.status_code = connection.status
        self.headers = connection.headers
        self._released = False

    @property
    def sent_at(self) -> float:
        """When the request was written to the socket (perf_counter)."""
        return self._connection.sent_at

    @property
    def first_body_at(self) -> float:
        """When the first body bytes arrived (perf_counter; 0 before)."""
        return self._connection.first_body_at

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        while True:
            received = self.take_body()
            if received is None:
                await self.wait()
            elif received:
                yield received
            else:
                return

    def take_body(self) -> bytes | None:
        """The body bytes received and not yet read; b"" once the body has ended; None when none
        are here yet (then `await wait()`). Raises the error that broke the connection. For a
        reader that parses as it goes (the engine's token stream) without a generator per layer."""
        connection = self._connection
        if connection.has_body:
            return connection.take()
        if connection.complete:
            return b""
        if connection.error is not None:
            raise connection.error
        return None

    def wait(self) -> Awaitable[None]:
        """Until more of the answer arrives (or its end, or an error), at most the timeout."""
        return self._connection.wait(self._timeout)

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_bytes()])

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        connection = self._connection
        if connection.keep_alive and not connection.has_body:
            self._pool._release(self._origin, connection)
        else:
            connection.close()


class ConnectionPool:
    """Keep-alive HTTP/1.1 connections to each engine origin, shared by one worker's requests."""

    def __init__(self, *, timeout: float, connect_timeout: float, headers: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._extra_headers = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self._idle: dict[Origin, list[_Connection]] = {}
        self._origins: dict[str, tuple[Origin, str]] = {}
        self._heads: dict[tuple[str, str, str], tuple[Origin, bytes]] = {}
        self._ssl: ssl.SSLContext | None = None

    def _origin(self, url: str) -> tuple[Origin, str]:
        """(the origin, the request target) of `url`, memoised: engines are a handful of URLs."""
        known = self._origins.get(url)
        if known is None:
            parts = urlsplit(url)
            origin = Origin.of(url)
            target = parts.path or "/"
            if parts.query:
                target += "?" + parts.query
            known = self._origins[url] = (origin, target)
        return known

    def _head(self, method: str, url: str, content_type: str) -> tuple[Origin, bytes]:
        """(the origin, the request's head up to its Content-Length value), memoised: the head
        depends on the engine URL and method only, so a request adds its length and body."""
        key = (method, url, content_type)
        known = self._heads.get(key)
        if known is None:
            origin, target = self._origin(url)
            head = f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._extra_headers}"
            head += f"Content-Type: {content_type}\r\nContent-Length: "
            known = self._heads[key] = (origin, head.encode("latin-1"))
        return known

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        *,
        content_type: str = "application/json",
        timeout: float | None = None,
        after_send: Callable[[], None] | None = None,
    ) -> Response:
        """Send a request and wait for the answer's status and headers (the body is read from the
        `Response`). `after_send` runs once, right after the request is written and before its
        answer is awaited: work the caller needs only once the engine answers overlaps the engine's
        own (an exception from it abandons the request). Raises `TransportError` subclasses."""
        timeout = self.timeout if timeout is None else timeout
        if body or method == "POST":
            origin, head = self._head(method, url, content_type)
            data = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        else:
            origin, target = self._origin(url)
            text = f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._extra_headers}\r\n"
            data = text.encode("latin-1")
        connection = await self._acquire(origin, timeout)
        try:
            await self._send(connection, data, timeout, after_send)
        except TransportError as exc:
            if not connection.reused or connection.received_any or isinstance(exc, ReadTimeout):
                raise
            # The engine closed this idle connection as we reused it: once more, on a new one
            # (`after_send` ran with the first write: not again).
            connection = await self._acquire(origin, timeout, fresh=True)
            await self._send(connection, data, timeout, None)
        except BaseException:
            connection.close()
            raise
        return Response(self, origin, connection, timeout)

    async def _send(
        self, connection: _Connection, data: bytes, timeout: float, after_send: Callable[[], None] | None
    ) -> None:
        connection.send(data)
        try:
            if after_send is not None:
                after_send()
            while not connection.headers_done:
                if connection.error is not None:
                    raise connection.error
                if connection.closed:
                    raise RemoteProtocolError("the engine closed the connection without answering")
                await connection.wait(timeout)
        except BaseException:
            connection.close()
            raise

    async def _acquire(self, origin: Origin, timeout: float, fresh: bool = False) -> _Connection:
        idle = self._idle.get(origin)
        while idle and not fresh:
            connection = idle.pop()
            if not connection.closed:
                connection.reused = True
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop),
                    origin.host,
                    origin.port,
                    ssl=self._ssl_context() if origin.scheme == "https" else None,
                ),
                min(timeout, self.connect_timeout),
            )
        except TimeoutError:  # asyncio.wait_for's
            raise ConnectTimeout(f"connecting to {origin.host}:{origin.port} timed out") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {exc.strerror or exc}") from None
        return connection

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _release(self, origin: Origin, connection: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) < MAX_IDLE_PER_ORIGIN:
            idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
