"""The deployment the chaos suite attacks, as real processes on loopback: `render-service serve`
replicas, a real `redis-server` they share, and HAProxy in front (round-robin per request, no
stickiness), with the handles the fault script needs (SIGKILL, restart, SIGSTOP, a new build)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.helpers import free_port

SNAPSHOT_KEY = "chaos-snapshot-key"
HEALTH_TIMEOUT = 180.0


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = HEALTH_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not become healthy")
        time.sleep(0.2)


@dataclass
class Replica:
    """One `render-service serve` process on a fixed port (a restart comes back on the same port)."""

    name: str
    model_dir: Path
    flags: list[str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0  # how many times it was (re)started
    pids: list[int] = field(default_factory=list)  # every process it has been, oldest first

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    ready: bool = False  # healthy since its last start (the sampler measures only then)

    def start(self, wait: bool = True) -> None:
        self.ready = False
        self.generation += 1
        log = self.log_dir / f"{self.name}.{self.generation}.log"
        command = [sys.executable, "-m", "render_service.cli", "serve", str(self.model_dir)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1", *self.flags]
        with log.open("wb") as handle:
            self.process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        self.pids.append(self.process.pid)
        if wait:
            self.wait_healthy()

    def wait_healthy(self) -> None:
        assert self.process is not None
        _wait_healthy(self.url, self.process, self.log_dir / f"{self.name}.{self.generation}.log")
        self.ready = True

    def kill(self) -> None:
        """SIGKILL: no drain, in-flight requests die with their connections."""
        self.ready = False
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM: the graceful drain a rolling update uses."""
        self.ready = False
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None


class RedisProcess:
    """A real redis-server on a fixed port: restartable (empty again, as a restart without
    persistence is), freezable (SIGSTOP/SIGCONT), and fillable to its maxmemory."""

    def __init__(self, log_dir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (CI installs it from Debian)")
        self.binary = binary
        self.port = free_port()
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a frozen process must wake up to die cleanly
            self.process.kill()
            self.process.wait(10)

    def restart(self, down_for: float = 0.5) -> None:
        self.kill()
        time.sleep(down_for)
        self.start()

    def freeze(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def fill(self, maxmemory: str = "4mb") -> int:
        """Cap memory with noeviction and write filler until Redis refuses writes (OOM); returns the
        number of filler keys."""
        client = self.client()
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", maxmemory)
        filler = b"x" * 65536
        keys = 0
        try:
            while keys < 100_000:
                client.set(f"chaos-filler:{keys}", filler)
                keys += 1
        except Exception as exc:  # redis-py's OutOfMemoryError: "command not allowed when used memory > 'maxmemory'"
            if "maxmemory" not in str(exc) and "OOM" not in str(exc):
                raise
        return keys

    def unfill(self) -> None:
        client = self.client()
        for key in client.scan_iter("chaos-filler:*", count=1000):
            client.delete(key)
        client.config_set("maxmemory", "0")


class HAProxy:
    """HAProxy in front of replica pools: one frontend per pool, round-robin per request (HTTP mode,
    keep-alive on both sides, no stickiness), active health checks on /health, and a retry on
    another server when a connection fails or a server dies before answering (a SIGKILLed replica).
    Retries are safe here: a derender chunk carries its whole state and a render is a pure function."""

    def __init__(self, pools: dict[str, list[Replica]], log_dir: Path) -> None:
        self.binary = shutil.which("haproxy")
        if self.binary is None:
            raise RuntimeError("haproxy is not installed (CI installs it from Debian: apt-get install haproxy)")
        self.pools = pools
        self.ports = {name: free_port() for name in pools}
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self._config = Path(tempfile.mkdtemp(prefix="haproxy-", dir=log_dir)) / "haproxy.cfg"

    def url(self, pool: str) -> str:
        return f"http://127.0.0.1:{self.ports[pool]}"

    def config_text(self) -> str:
        lines = [
            "global",
            "    maxconn 4096",
            "    tune.bufsize 262144",  # whole derender chunks stay buffered, so they can be retried
            "defaults",
            "    mode http",
            "    timeout connect 1s",
            "    timeout client 60s",
            "    timeout server 30s",
            "    timeout http-keep-alive 60s",
            "    option http-keep-alive",
            "    retries 3",
            "    option redispatch 1",
            "    retry-on conn-failure empty-response junk-response response-timeout",
            "    timeout check 3s",
            # A dead replica leaves after two failed checks (its in-flight requests are retried
            # elsewhere at once); a slow /health on a busy machine does not take a live one out.
            "    default-server inter 500ms fall 2 rise 1 maxconn 512",
        ]
        for name, replicas in self.pools.items():
            lines += [
                f"frontend fe_{name}",
                f"    bind 127.0.0.1:{self.ports[name]}",
                f"    default_backend be_{name}",
                f"backend be_{name}",
                "    balance roundrobin",
                "    option httpchk GET /health",
            ]
            lines += [f"    server {r.name} 127.0.0.1:{r.port} check" for r in replicas]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        self._config.write_text(self.config_text())
        log = (self.log_dir / "haproxy.log").open("wb")
        assert self.binary is not None
        self.process = subprocess.Popen([self.binary, "-db", "-f", str(self._config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        for name in self.pools:
            while True:
                try:
                    if httpx.get(f"{self.url(name)}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("haproxy did not start")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def process_rss_and_fds(pid: int) -> tuple[int, int] | None:
    """(RSS bytes, open file descriptors) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None
    return rss, fds
