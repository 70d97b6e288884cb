"""The worker pool: N single-threaded worker processes accepting on one port (SO_REUSEPORT).

Why processes behind one port (and not one loop feeding a process pool): every request's
CPU work is 0.05-2 ms, so shipping it to another process would cost about as much as doing
it, and a keep-alive connection stays on the worker that accepted it, which is exactly the
affinity streaming derender wants: an llm-d client that reuses its connection sends every
chunk of a stream to the worker holding the warm parser snapshot. The model is loaded once in
the parent and shared copy-on-write by the forked workers. A worker that dies is replaced;
SIGTERM stops accepting and lets every worker drain before the parent exits 0.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import time
from typing import Any

logger = logging.getLogger("render_service.server.workers")


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def _cgroup_quota() -> float | None:
    try:  # cgroup v2
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int(open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read())
        period_us = int(open("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None


def bind(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A socket on (host, port) with SO_REUSEPORT: each worker listens on its own, and the kernel
    spreads new connections across them (one shared socket lets a few connections bunch up on
    one worker); a keep-alive connection still stays with the worker that accepted it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    return sock


def _run_worker(
    app: Any, sock: socket.socket, log_level: str, index: int, tls: dict[str, Any], refresh: bool = False
) -> None:
    import uvicorn

    from render_service.server.tls import watching_server
    from render_service.server.transport import CoalescingHttpToolsProtocol

    os.environ["RENDER_WORKER_ID"] = str(index)
    # Each worker builds its own SSLContext from the files (after the fork: OpenSSL state is not
    # shared between processes) and uvicorn wraps every connection its listening socket accepts.
    config = uvicorn.Config(
        app,
        log_level=log_level,
        loop="uvloop",
        http=CoalescingHttpToolsProtocol,
        access_log=False,
        timeout_graceful_shutdown=30,
        lifespan="on",
        **tls,
    )
    server = watching_server(config, tls) if tls and refresh else uvicorn.Server(config)
    server.run(sockets=[sock])


def serve(
    app_factory: Any,
    host: str,
    port: int,
    workers: int,
    log_level: str = "info",
    tls: dict[str, Any] | None = None,
    refresh_tls: bool = False,
) -> int:
    """Run `workers` processes (each `app_factory()`), replace any that die, drain on SIGTERM.
    `tls`: uvicorn's ssl_* options (`server.tls.tls_options`), applied by every worker;
    `refresh_tls`: each worker reloads the files when they change."""
    tls = tls or {}
    if workers <= 1:
        _run_worker(app_factory(), bind(host, port), log_level, 0, tls, refresh_tls)
        return 0
    # The parent holds the port (bound, not listening: it never receives connections) so that a
    # port already in use fails here, once, and a replaced worker can always bind again.
    reservation = bind(host, port, listen=False)
    port = reservation.getsockname()[1]
    children: dict[int, int] = {}  # pid -> worker index
    stopping = False

    def spawn(index: int) -> None:
        pid = os.fork()
        if pid == 0:  # child
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            try:
                reservation.close()
                _run_worker(app_factory(), bind(host, port), log_level, index, tls, refresh_tls)
            finally:
                os._exit(0)
        children[pid] = index

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for index in range(workers):
        spawn(index)
    logger.info("%d workers serving on %s://%s:%d", workers, "https" if tls else "http", host, port)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid not in children:
            continue
        index = children.pop(pid)
        if not stopping:
            logger.error("worker %d (pid %d) exited with status %d; replacing it", index, pid, status)
            time.sleep(0.1)
            spawn(index)
    reservation.close()
    return 0


def main_guard() -> None:
    if sys.platform != "linux":
        raise SystemExit("--workers > 1 needs Linux (fork and a shared listening socket)")
