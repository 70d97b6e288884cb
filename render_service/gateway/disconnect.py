"""A client's disconnect, passed on to the engine request it was waiting for.

The work runs in the request's own task, so the engine request is written in the same event-loop
step that rendered it, and each engine chunk reaches the client's socket without a hop to another
task; a side task waits for the ASGI `http.disconnect` and cancels the request's task, whose
engine connection then closes (the engine aborts the request).
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


class SSEResponse(StreamingResponse):
    """A stream written from the request's own task that notices the client leaving even while no
    chunk is due (an engine still in prefill or stalled); the body generator is closed however the
    stream ends, so its engine connection is."""

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body: Any = self.body_iterator
        try:
            async with cancel_on_disconnect(receive):
                with contextlib.suppress(OSError):  # the client left mid-write
                    await self.stream_response(send)
        except ClientDisconnected:
            pass
        finally:
            if hasattr(body, "aclose"):
                await body.aclose()
