"""The gateway's HTTP/1.1 connection pool against a raw asyncio server that answers exactly the
bytes each test gives it (keep-alive, chunked and length-framed bodies, idle closes, silence)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from render_service.gateway import connection
from render_service.gateway.connection import ConnectionPool
from tests.gateway.conftest import unused_url

Answer = Callable[[bytes], bytes | None]  # request head -> raw answer (None: say nothing)


class RawServer:
    """Answers each request with `answer(head)`; counts connections; closes after an answer when
    `close_after` says so (an engine's keep-alive timeout firing right after a response)."""

    def __init__(self, answer: Answer, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.closed_by_client = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                raw = self.answer(head)
                if raw is None:
                    await reader.read()  # silent until the client leaves
                    self.closed_by_client += 1
                    return
                writer.write(raw)
                await writer.drain()
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client += 1
        finally:
            writer.close()


def run(answer: Answer, test: Callable[[str, RawServer], Awaitable[Any]], close_after: bool = False) -> RawServer:
    server = RawServer(answer, close_after)

    async def main() -> None:
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        async with listener:
            await test(f"http://127.0.0.1:{port}", server)
            await asyncio.sleep(0.05)  # let the server see closes

    asyncio.run(main())
    return server


def chunked(*pieces: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + body
        + b"0\r\n\r\n"
    )


def sized(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def test_bodies_read_to_their_end_reuse_one_connection() -> None:
    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        for _ in range(3):
            response = await pool.request("POST", url + "/inference/v1/generate", b'{"a": 1}')
            assert response.status_code == 200
            assert await response.read() == b"data: 1\n\ndata: [DONE]\n\n"
            await response.aclose()
        await pool.aclose()

    server = run(lambda head: chunked(b"data: 1\n\n", b"data: [DONE]\n\n"), test)
    assert server.connections == 1
    assert len(server.requests) == 3
    first = server.requests[0]
    assert first.startswith(b"POST /inference/v1/generate HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: 8\r\n" in first and first.endswith(b'\r\n\r\n{"a": 1}')


def test_an_unfinished_body_closes_its_connection() -> None:
    """How a client's disconnect reaches the engine: the connection closes, it is not pooled."""

    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        for _ in range(2):
            response = await pool.request("POST", url + "/x", b"{}")
            pieces = response.aiter_bytes()
            await pieces.__anext__()
            await response.aclose()
        await pool.aclose()

    # Only the head and a first piece: the body never ends.
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    server = run(lambda _: head, test)
    assert server.connections == 2


def test_a_pooled_connection_the_engine_closed_is_replaced() -> None:
    """An engine closing an idle connection (its keep-alive timeout) as it is reused: the request
    goes again on a new connection, and succeeds."""

    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        for _ in range(3):
            response = await pool.request("GET", url + "/health")
            assert await response.read() == b"ok"
            await response.aclose()
        await pool.aclose()

    server = run(lambda _: sized(b"ok"), test, close_after=True)
    assert server.connections == 3


def test_a_reused_connection_closed_under_a_request_in_flight() -> None:
    """The close arrives after the request was written on a reused connection (the race itself)."""

    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        response = await pool.request("GET", url + "/a")
        await response.read()
        await response.aclose()
        (idle,) = pool._idle[connection.Origin.of(url)]
        idle.closed = False  # it looks alive: the engine's close has not been seen yet
        response = await pool.request("GET", url + "/b")
        assert await response.read() == b"ok"
        await response.aclose()
        await pool.aclose()

    server = run(lambda _: sized(b"ok"), test, close_after=True)
    assert server.connections == 2


def test_connection_close_answers_are_not_pooled() -> None:
    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        for _ in range(2):
            response = await pool.request("GET", url + "/health")
            assert (response.status_code, await response.read()) == (503, b"down")
            await response.aclose()
        await pool.aclose()

    server = run(lambda _: sized(b"down", 503, b"connection: close\r\n"), test, close_after=True)
    assert server.connections == 2


def test_silence_is_a_read_timeout_and_a_refused_port_a_connect_error() -> None:
    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=0.2, connect_timeout=5)
        with pytest.raises(connection.ReadTimeout):
            await pool.request("POST", url + "/x", b"{}")
        with pytest.raises(connection.ConnectError):
            await pool.request("POST", unused_url() + "/x", b"{}")
        await pool.aclose()

    server = run(lambda _: None, test)
    assert server.closed_by_client == 1


def test_the_read_timeout_follows_each_wait_on_a_reused_connection() -> None:
    """One timer per connection: a request with a short timeout on a connection a long-timeout
    request left armed still times out on time, and a stream whose chunks keep coming (each within
    the timeout, all of them together longer) never does."""

    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=30, connect_timeout=5)
        response = await pool.request("POST", url + "/long", b"{}")  # arms a 30 s timer
        assert await response.read() == b"ok"
        await response.aclose()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(connection.ReadTimeout):
            await pool.request("POST", url + "/short", b"{}", timeout=0.2)
        assert loop.time() - started < 2
        await pool.aclose()

    server = run(lambda head: sized(b"ok") if b"/long" in head else None, test)
    assert server.connections == 1


def test_a_steady_stream_slower_in_total_than_the_timeout() -> None:
    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(8):  # 8 x 0.05 s: twice the timeout in all, a quarter of it between pieces
                await asyncio.sleep(0.05)
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            writer.close()

        listener = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        async with listener:
            pool = ConnectionPool(timeout=0.2, connect_timeout=5)
            response = await pool.request("POST", f"http://127.0.0.1:{port}/x", b"{}")
            assert await response.read() == b"x" * 8
            await response.aclose()
            await pool.aclose()

    asyncio.run(main())


def test_after_send_runs_once_the_request_is_written() -> None:
    """The hook runs after the write and before the answer; one that raises abandons the request
    (its connection closes, as a client's disconnect does)."""

    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        seen: list[int] = []
        response = await pool.request("POST", url + "/x", b"{}", after_send=lambda: seen.append(len(server.requests)))
        assert seen == [0]  # written, not yet read by the server: the hook ran before any answer
        assert await response.read() == b"ok"
        await response.aclose()

        def fail() -> None:
            raise ValueError("the converter failed")

        with pytest.raises(ValueError):
            await pool.request("POST", url + "/x", b"{}", after_send=fail)
        await pool.aclose()

    server = run(lambda _: sized(b"ok"), test)
    assert server.connections == 1 and server.closed_by_client == 1


def test_a_body_cut_short_and_garbage_are_protocol_errors() -> None:
    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        response = await pool.request("GET", url + "/short")
        with pytest.raises(connection.RemoteProtocolError):
            await response.read()
        await response.aclose()
        with pytest.raises(connection.RemoteProtocolError):
            await pool.request("GET", url + "/garbage")
        await pool.aclose()

    def answer(head: bytes) -> bytes:
        if b"/short" in head:
            return b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"
        return b"NOT HTTP AT ALL\r\n\r\n"

    run(answer, test, close_after=True)


def test_a_body_ended_by_the_connection_closing() -> None:
    async def test(url: str, server: RawServer) -> None:
        pool = ConnectionPool(timeout=5, connect_timeout=5)
        response = await pool.request("GET", url + "/old")
        assert await response.read() == b"until the end"
        await response.aclose()
        await pool.aclose()

    run(lambda _: b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end", test, close_after=True)
