"""uvicorn's httptools protocol, with each response's writes coalesced into one socket write.

uvicorn writes the status line and headers as soon as the app sends `http.response.start`, and the
body when it sends `http.response.body`: two `send` syscalls (and two TCP segments) per response.
On loopback and virtual NICs each write costs about as much CPU as a short render's parsing, so
writes made in one turn of the event loop are held and sent together at the end of that turn
(`call_soon`): a JSON response goes out in one write, with no added wait. Large writes (cached
image data sent in parts) go out as they come, after whatever is held, so they are never copied.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Writes above this size are not held (joining them would copy them).
COALESCE_LIMIT = 64 * 1024


class CoalescingTransport:
    """A transport whose `write`s within one event-loop turn reach the socket as one write;
    everything else is the wrapped transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if len(data) > COALESCE_LIMIT:
            if held is not None:
                self.flush()
            self._transport.write(data)
        elif held is None:
            self._held = [data]
            self._loop.call_soon(self.flush)
        else:
            held.append(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's `httptools` HTTP/1.1 protocol over a `CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn's flow control and address lookups keep the socket's transport (set above).
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
