"""Fault-injection helpers: a switchable TCP proxy in front of redis-server, a fake Redis that speaks
garbage, and the service as a real process whose log the test can read."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers import free_port


class FaultProxy:
    """A loopback TCP proxy to a real redis-server, run by an asyncio loop in a thread.

    Switch its behaviour at any time: `delay` (seconds added before each reply), `blackhole`
    (requests are swallowed, never answered), `garbage` (these bytes answer every request instead
    of Redis), `refuse` (new connections are closed at once).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.delay = 0.0
        self.blackhole = False
        self.garbage: bytes | None = None
        self.refuse = False
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    def reset(self) -> None:
        self.delay, self.blackhole, self.garbage, self.refuse = 0.0, False, None, False

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)

    def drop_connections(self) -> None:
        """Close every open connection (as a Redis restart would)."""

        def close() -> None:
            for writer in list(self._writers):
                writer.close()

        self._loop.call_soon_threadsafe(close)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.close()
            return
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if self.garbage is None:
            try:
                upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
        writers = {writer, *(upstream[1:] if upstream else ())}
        self._writers.update(writers)

        async def client_to_redis() -> None:
            while data := await reader.read(65536):
                if self.garbage is not None:
                    writer.write(self.garbage)
                    await writer.drain()
                elif upstream is None:
                    return  # opened as a fake server: nothing behind it
                elif not self.blackhole:
                    upstream[1].write(data)
                    await upstream[1].drain()

        async def redis_to_client() -> None:
            if upstream is None:
                return
            while data := await upstream[0].read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()

        try:
            await asyncio.gather(client_to_redis(), redis_to_client())
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            for w in writers:
                self._writers.discard(w)
                w.close()


@contextmanager
def fake_redis(reply: bytes) -> Iterator[str]:
    """A server that answers every request with `reply` (it is not Redis at all); yields its URL."""
    with FaultProxy(free_port()) as server:
        server.garbage = reply
        yield server.url


class Service:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def service_process(
    model_dir: Path, log: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> Iterator[Service]:
    """`render-service serve` as a real process logging to `log`; waits for /health."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "render_service.cli",
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    handle = log.open("wb")
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"service exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("service did not become healthy")
            time.sleep(0.2)
        yield Service(url, process, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        handle.close()
