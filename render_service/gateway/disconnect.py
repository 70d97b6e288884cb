"""A client's disconnect, passed on to the engine request it was waiting for.

The work runs in the request's own task, so the engine request is written in the same event-loop
step that rendered it, and each engine chunk reaches the client's socket without a hop to another
task; a side task waits for the ASGI `http.disconnect` and cancels the request's task, whose
engine connection then closes (the engine aborts the request).

A streamed request has one `DisconnectWatch` for its whole life, the wait for the engine's first
chunk and the stream after it: its side task is started once the generate request is written (or
before the prefill hop with P/D), so creating it costs nothing before the engine has the request,
and the first chunk does not wait for a second one (a task costs tens of microseconds to create
and cancel, more on a loaded machine).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClientDisconnected(Exception):
    pass


class _Watch:
    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.inside = True  # the task is still in the guarded block
        self.fired = False
        self.watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        # This runs only while the guarded task is suspended: at an await inside the block (the
        # cancellation lands there) or already past it (nothing to cancel).
        if self.inside:
            self.fired = True
            self.task.cancel()


@contextlib.asynccontextmanager
async def cancel_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Run the block in this task; a client disconnect cancels it and raises `ClientDisconnected`."""
    watch = _Watch(receive)
    try:
        yield
    except asyncio.CancelledError:
        if not watch.fired:
            raise
        watch.task.uncancel()
        raise ClientDisconnected from None
    finally:
        watch.inside = False
        watch.watcher.cancel()


class DisconnectWatch:
    """One streamed request's disconnect: `with watch:` blocks run in the request's task, and a
    disconnect while one of them waits cancels it and raises `ClientDisconnected` from it (at once
    when the client has already left). `start()` begins watching; `close()` ends it."""

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.inside = False  # the task is in a guarded block
        self.fired = False  # a cancellation of ours is on its way to the block
        self.disconnected = False
        self._watcher: asyncio.Future[None] | None = None
        self._closed = False

    def start(self) -> None:
        if self._watcher is None and not self._closed:
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        # This runs only while the guarded task is suspended: at an await inside a block (the
        # cancellation lands there) or outside one (the next block raises on entry).
        if self.inside:
            self.fired = True
            self.task.cancel()

    def __enter__(self) -> DisconnectWatch:
        if self.disconnected:
            raise ClientDisconnected
        self.inside = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.inside = False
        if self.fired and kind is not None and issubclass(kind, asyncio.CancelledError):
            self.fired = False
            self.task.uncancel()
            raise ClientDisconnected from None

    def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()


_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")  # as `init_headers` writes it


class SSEResponse(StreamingResponse):
    """A stream written from the request's own task that notices the client leaving even while no
    chunk is due (an engine still in prefill or stalled), through the request's `DisconnectWatch`;
    the body generator is closed however the stream ends, so its engine connection is."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], watch: DisconnectWatch) -> None:
        # StreamingResponse's own fields, set directly: its `init_headers` would derive the same
        # single header on the first token's path.
        self.body_iterator = content
        self.status_code = 200
        self.background = None
        self.raw_headers = [_CONTENT_TYPE]
        self.watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body: Any = self.body_iterator
        watch = self.watch
        try:
            watch.start()  # a no-op: the wait for the first chunk started it
            with watch, contextlib.suppress(OSError):  # OSError: the client left mid-write
                await self.stream_response(send)
        except ClientDisconnected:
            pass
        finally:
            watch.close()
            if hasattr(body, "aclose"):
                await body.aclose()
