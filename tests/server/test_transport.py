"""The coalescing transport: one socket write per response, large parts uncopied, nothing lost."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import httpx
import pytest
import uvicorn

from render_service.server.transport import COALESCE_LIMIT, CoalescingHttpToolsProtocol, CoalescingTransport


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return "extra" if name == "peername" else default


def test_writes_in_one_loop_turn_become_one_write() -> None:
    asyncio.run(_test_writes_in_one_loop_turn_become_one_write())


async def _test_writes_in_one_loop_turn_become_one_write() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b'{"a":1}')
    assert inner.writes == []  # held until the end of this turn
    await asyncio.sleep(0)
    assert inner.writes == [b'HTTP/1.1 200 OK\r\n\r\n{"a":1}']
    transport.write(b"next")
    await asyncio.sleep(0)
    assert inner.writes[1:] == [b"next"]
    assert transport.get_extra_info("peername") == "extra"  # everything else is the socket's transport


def test_large_writes_go_out_at_once_after_what_is_held() -> None:
    asyncio.run(_test_large_writes_go_out_at_once_after_what_is_held())


async def _test_large_writes_go_out_at_once_after_what_is_held() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    big = b"x" * (COALESCE_LIMIT + 1)
    transport.write(b"head")
    transport.write(big)
    assert inner.writes == [b"head", big]
    await asyncio.sleep(0)
    assert inner.writes == [b"head", big]


def test_close_flushes_first_and_nothing_is_written_after() -> None:
    asyncio.run(_test_close_flushes_first_and_nothing_is_written_after())


async def _test_close_flushes_first_and_nothing_is_written_after() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"bye")
    transport.close()
    assert inner.writes == [b"bye"] and inner.closed
    transport.write(b"late")
    await asyncio.sleep(0)  # the held write is dropped, not written to a closed transport
    assert inner.writes == [b"bye"]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    parts = [body, b"-" * (COALESCE_LIMIT * 2), body] if scope["path"] == "/parts" else [body]
    headers = [(b"content-length", str(sum(map(len, parts))).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for index, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": index < len(parts) - 1})


@pytest.fixture(scope="module")
def server_url() -> Any:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=CoalescingHttpToolsProtocol, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def test_keep_alive_responses_are_whole_over_a_real_server(server_url: str) -> None:
    with httpx.Client(base_url=server_url) as client:
        for n in range(20):  # one connection, kept alive
            payload = f'{{"n":{n}}}'.encode()
            response = client.post("/echo", content=payload)
            assert response.status_code == 200 and response.content == payload
        parts = client.post("/parts", content=b"abc")
        assert parts.content == b"abc" + b"-" * (COALESCE_LIMIT * 2) + b"abc"
