"""Calls to an engine's `POST /inference/v1/generate`, with fail-over before the first token.

A request goes to the pool's pick; a connect failure, a timeout, a 5xx or a stream that ends or
errors before its first token sends it to the next engine (each engine is tried once). An engine's
4xx is the answer (the request itself is wrong) and is passed through in vLLM's error shape. Once
a token has reached the client the request is not retried: the stream ends with an error event.

Cancellation relies on vLLM's own: `/inference/v1/generate` is wrapped in `with_cancellation`, so
when the connection to it closes (streaming or not) the engine aborts the request and frees its
slot. Closing our side of the connection is therefore how a client's disconnect is passed on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from render_service.exceptions import OverloadedError, RenderServiceError
from render_service.gateway import connection
from render_service.gateway.connection import Response, TransportError
from render_service.gateway.pool import Engine, EnginePool, NoEngineError

GENERATE_PATH = "/inference/v1/generate"


class EngineFailure(Exception):
    """An attempt that failed in a way another engine may not (`kind` labels the error metric)."""

    def __init__(self, kind: str, message: str, answer: RenderServiceError | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.answer = answer  # the engine's own error, when it sent one


class EngineAnswerError(RenderServiceError):
    """An engine's error answer, passed to the client as the engine sent it (vLLM's shape)."""

    def __init__(self, status_code: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        super().__init__(str(message or body))
        self.status_code = status_code
        self.raw = body if isinstance(error, dict) else None
        if isinstance(error, dict):
            self.error_type = str(error.get("type") or self.error_type)
            self.param = error.get("param")
            self.code = error.get("code", status_code)
        else:
            self.code = status_code

    def body(self) -> dict[str, Any]:
        return self.raw if self.raw is not None else super().body()


def _answer(response: Response, raw: bytes) -> EngineAnswerError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = {"error": {"message": raw.decode(errors="replace")[:500] or f"HTTP {response.status_code}"}}
    return EngineAnswerError(response.status_code, body)


def _transport_kind(exc: TransportError) -> str:
    if isinstance(exc, (connection.ReadTimeout, connection.ConnectTimeout)):
        return "timeout"
    if isinstance(exc, connection.ConnectError):
        return "connect"
    return "dropped"


def _exhausted(last: EngineFailure | None) -> RenderServiceError:
    """What the client gets when no engine could serve it: the last engine's own error if it sent
    one, else a 503 naming the last failure."""
    if last is not None and last.answer is not None:
        return last.answer
    reason = last.message if last is not None else "no engine is available"
    return OverloadedError(f"No engine could serve the request: {reason}", retry_after=1)


async def generate(pool: EnginePool, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming generate: the engine's `GenerateResponse`."""
    tried: set[Engine] = set()
    last: EngineFailure | None = None
    while len(tried) < len(pool.engines):
        try:
            engine = pool.pick(tried, body.get("token_ids"))
        except NoEngineError as exc:
            raise _exhausted(last) if last is not None else OverloadedError(str(exc)) from None
        if tried:
            pool.metrics.retries.inc()
        tried.add(engine)
        pool.acquire(engine)
        response: Response | None = None
        try:
            response = await pool.client.request("POST", engine.url + GENERATE_PATH, orjson.dumps(body))
            raw = await response.read()
            if response.status_code == 200:
                result: dict[str, Any] = orjson.loads(raw)
                pool.succeeded(engine)
                return result
            if response.status_code < 500:
                raise _answer(response, raw)
            last = EngineFailure("status", f"engine answered {response.status_code}", _answer(response, raw))
        except TransportError as exc:
            last = EngineFailure(_transport_kind(exc), f"{type(exc).__name__} from {engine.url}")
        except orjson.JSONDecodeError:
            last = EngineFailure("malformed", f"engine {engine.url} sent a body that is not JSON")
        finally:
            if response is not None:
                await response.aclose()
            pool.release(engine)
        pool.failed(engine, last.kind)
    raise _exhausted(last)


class EngineStream:
    """An open streaming generate whose first chunk has arrived: iterate for the engine's chunks
    (the first one included); `aclose()` closes the connection (the engine aborts if unfinished).

    The SSE body is split and parsed here, straight from the connection's buffer: one coroutine
    per chunk between the client's writer and the socket, not a generator per layer (this runs
    once per generated token)."""

    def __init__(self, pool: EnginePool, engine: Engine, response: Response) -> None:
        self.pool = pool
        self.engine = engine
        self._response = response
        self._lines: deque[bytes] = deque()  # complete lines not parsed yet
        self._pending = b""  # a line's start, its end not received yet
        self._first: dict[str, Any] = {}
        self._first_due = False  # the first chunk is read (`read_first`) and not yet iterated
        self._done = False  # `[DONE]` seen
        self._closed = False

    @property
    def first(self) -> dict[str, Any]:
        return self._first

    @property
    def sent_at(self) -> float:
        """When the generate request was written to the engine's socket (perf_counter)."""
        return self._response.sent_at

    @property
    def first_received_at(self) -> float:
        """When the engine's first chunk arrived (perf_counter)."""
        return self._response.first_body_at

    async def read_first(self) -> Any:
        """The first event (raises what `_next_event` raises); iteration starts with it."""
        first = await self._next_event()
        self._first = first
        self._first_due = True
        return first

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._first_due:
            self._first_due = False
            return self._first
        try:
            event = await self._next_event()
        except TransportError as exc:
            kind = _transport_kind(exc)
            self.pool.failed(self.engine, kind)
            raise EngineFailure(kind, f"the engine's stream broke ({type(exc).__name__})") from None
        if isinstance(event, dict) and "error" in event and "choices" not in event:
            self.pool.failed(self.engine, "stream_error")
            raise EngineFailure("stream_error", _error_message(event), EngineAnswerError(500, event))
        return event

    async def _next_event(self) -> Any:
        """The next `data:` line's JSON; StopAsyncIteration at `[DONE]`; a stream that ends
        without it is broken. Split on bytes and parsed by orjson straight from them."""
        if self._done:
            raise StopAsyncIteration
        lines = self._lines
        response = self._response
        while True:
            while lines:
                line = lines.popleft()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self._done = True
                    # Read the body's end (it follows at once) so that the connection goes back
                    # to the pool: a response closed before its end closes its connection, and
                    # the next request would pay for a new one.
                    while (rest := response.take_body()) != b"":
                        if rest is None:
                            await response.wait()
                    raise StopAsyncIteration
                try:
                    return orjson.loads(payload)
                except orjson.JSONDecodeError:
                    raise connection.RemoteProtocolError(f"malformed event from the engine: {payload[:80]!r}") from None
            received = response.take_body()
            if received is None:
                await response.wait()
            elif received:
                *complete, self._pending = (self._pending + received).split(b"\n")
                lines.extend(complete)
            else:
                raise connection.RemoteProtocolError("the engine's stream ended without [DONE]")

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._response.aclose()
            self.pool.release(self.engine)


def _error_message(event: dict[str, Any]) -> str:
    error = event.get("error")
    return str(error.get("message") if isinstance(error, dict) else error)


async def open_stream(
    pool: EnginePool, body: dict[str, Any], while_waiting: Callable[[], None] | None = None
) -> EngineStream:
    """A streaming generate, failed over until an engine sends its first chunk. `while_waiting`
    runs once, as soon as the first attempt's request is written: what the caller prepares for the
    answer (its converter, the role chunk) then costs no time to first token, as long as the
    engine takes longer than it. An exception from it abandons the request (the connection closes,
    the engine aborts) and is raised here."""
    tried: set[Engine] = set()
    last: EngineFailure | None = None
    content = orjson.dumps(body)
    pending = [while_waiting] if while_waiting is not None else []

    def after_send() -> None:
        if pending:
            pending.pop()()

    while len(tried) < len(pool.engines):
        try:
            engine = pool.pick(tried, body.get("token_ids"))
        except NoEngineError as exc:
            raise _exhausted(last) if last is not None else OverloadedError(str(exc)) from None
        if tried:
            pool.metrics.retries.inc()
        tried.add(engine)
        pool.acquire(engine)
        response: Response | None = None
        try:
            response = await pool.client.request(
                "POST", engine.url + GENERATE_PATH, content, after_send=after_send if pending else None
            )
            if response.status_code != 200:
                raw = await response.read()
                if response.status_code < 500:
                    raise _answer(response, raw)
                last = EngineFailure("status", f"engine answered {response.status_code}", _answer(response, raw))
            else:
                stream = EngineStream(pool, engine, response)
                first = await stream.read_first()
                if isinstance(first, dict) and "error" in first and "choices" not in first:
                    last = EngineFailure("stream_error", _error_message(first), EngineAnswerError(500, first))
                else:
                    pool.succeeded(engine)
                    return stream
        except TransportError as exc:
            last = EngineFailure(_transport_kind(exc), f"{type(exc).__name__} from {engine.url}")
        except StopAsyncIteration:
            last = EngineFailure("dropped", f"engine {engine.url} ended the stream before a token")
        except BaseException:  # a 4xx answer, or the client went away while we waited: nothing to retry
            if response is not None:
                await response.aclose()
            pool.release(engine)
            raise
        if response is not None:
            await response.aclose()
        pool.release(engine)
        pool.failed(engine, last.kind)
    raise _exhausted(last)
