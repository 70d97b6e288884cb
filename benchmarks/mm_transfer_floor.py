#!/usr/bin/env python3
"""The HTTP transfer floor of an image render: what any server pays to receive the request and send
vLLM's response bytes, against this service on the same repeated-image requests.

    python3 -m benchmarks.mm_transfer_floor [--model DIR] [--n 40]

A repeated image is a cache hit (a hash and a copy), but the response still carries vLLM's
`kwargs_data`: ~7.2 MB of base64 per 720p image. Each floor reads the request body and answers
pre-built bytes of the same size as our response: no parsing, no render.

- uvicorn floor: a bare uvicorn + Starlette app (same loop and HTTP settings as ours), glibc's malloc
  as it comes. Its heap grows and is trimmed back on every request (the body chunks, their copies
  and the join outgrow glibc's dynamic trim threshold), so it pays ~950 minor page faults (fresh
  zeroed pages) per 4-image request: ~2 ms that our warmed-up process does not pay (its cache
  misses free large buffers, which raises glibc's thresholds); see the faults column.
- uvicorn floor, heap kept: the same app with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ set, so
  no page faults: the fair floor for a uvicorn server.
- raw socket: a blocking socket server (recv_into one buffer, sendall): the kernel's share, the
  bound for any server in any framework over loopback TCP.

Server CPU (schedstat, whole process, kernel time in send() included) per request, sequential, one
keep-alive client per server, the servers measured in interleaved rounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks._common import free_port
from benchmarks.mm_bench import Payloads

FLOOR_APP = """
import os
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

BODY = b"x" * int(os.environ["FLOOR_BYTES"])


async def render(request):
    await request.body()
    return Response(BODY, media_type="application/json")


app = Starlette(routes=[Route("/v1/chat/completions/render", render, methods=["POST"])])
"""
RAW_SERVER = """
import os, socket, sys

BODY = b"x" * int(os.environ["FLOOR_BYTES"])
HEAD = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n" % len(BODY)
listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
buffer = bytearray(64 << 20)
view = memoryview(buffer)
while True:  # one connection at a time, keep-alive
    conn, _ = listener.accept()
    have = 0
    while True:
        while (end := buffer.find(b"\\r\\n\\r\\n", 0, have)) < 0:
            got = conn.recv_into(view[have:])
            if not got:
                break
            have += got
        if end < 0:
            break
        length = int(bytes(buffer[:end]).lower().split(b"content-length:")[1].split(b"\\r\\n")[0])
        total = end + 4 + length
        while have < total:
            have += conn.recv_into(view[have:])
        conn.sendall(HEAD)
        conn.sendall(BODY)
        buffer[:have - total] = buffer[total:have]
        have -= total
    conn.close()
"""
PATH = "/v1/chat/completions/render"
HEADERS = {"content-type": "application/json"}
# Keep freed memory in the heap (no trim, no mmap below 32 MB): glibc reads these at start-up.
HEAP_KEPT = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def process_cpu_seconds(pid: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total / 1e9


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


class Server:
    def __init__(self, name: str, command: list[str], env: dict[str, str], port: int, body: bytes) -> None:
        self.name, self.body = name, body
        self.url = f"http://127.0.0.1:{port}{PATH}"
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(timeout=60)
        self.cpu = 0.0
        self.faults = self.requests = 0

    def wait_ready(self) -> int:
        """Response size, after a few warm-up requests."""
        deadline = time.monotonic() + 120
        while True:
            try:
                self.client.post(self.url, content=self.body, headers=HEADERS)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"server did not start: {self.name}") from None
                time.sleep(0.2)
        for _ in range(5):
            size = len(self.client.post(self.url, content=self.body, headers=HEADERS).content)
        return size

    def run(self, n: int) -> None:
        cpu, faults = process_cpu_seconds(self.proc.pid), minor_faults(self.proc.pid)
        for _ in range(n):
            self.client.post(self.url, content=self.body, headers=HEADERS)
        self.cpu += process_cpu_seconds(self.proc.pid) - cpu
        self.faults += minor_faults(self.proc.pid) - faults
        self.requests += n

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a qwen3-vl example model folder (default: built into a temp folder)")
    parser.add_argument("--n", type=int, default=40, help="timed requests per server and size")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds the n requests are split into")
    args = parser.parse_args()
    if not args.model:
        args.model = tempfile.mkdtemp(prefix="transfer-floor-model-")
    if not Path(args.model, "preprocessor_config.json").exists():
        from render_service.model.example import build_example_model

        build_example_model(args.model, "qwen3-vl")
    payloads = Payloads()
    with tempfile.TemporaryDirectory(prefix="transfer-floor-") as tmp:
        Path(tmp, "floor_app.py").write_text(FLOOR_APP)
        Path(tmp, "raw_server.py").write_text(RAW_SERVER)
        for images in (1, 4):
            body = payloads.repeated(images)
            servers: list[Server] = []
            try:
                port = free_port()
                servers.append(
                    Server(
                        "ours",
                        [
                            sys.executable,
                            "-m",
                            "render_service.cli",
                            "serve",
                            args.model,
                            "--served-model-name",
                            "tinyvl",
                            "--max-model-len",
                            "16384",
                            "--workers",
                            "1",
                            "--port",
                            str(port),
                            "--log-level",
                            "warning",
                        ],
                        dict(os.environ),
                        port,
                        body,
                    )
                )
                size = servers[0].wait_ready()
                env = dict(os.environ, FLOOR_BYTES=str(size))
                for name, extra in (("uvicorn floor", {}), ("uvicorn floor, heap kept", HEAP_KEPT)):
                    port = free_port()
                    servers.append(
                        Server(
                            name,
                            [
                                sys.executable,
                                "-m",
                                "uvicorn",
                                "floor_app:app",
                                "--app-dir",
                                tmp,
                                "--port",
                                str(port),
                                "--loop",
                                "uvloop",
                                "--http",
                                "httptools",
                                "--no-access-log",
                                "--log-level",
                                "warning",
                            ],
                            {**env, **extra},
                            port,
                            body,
                        )
                    )
                port = free_port()
                servers.append(
                    Server(
                        "raw socket",
                        [sys.executable, str(Path(tmp, "raw_server.py")), str(port)],
                        {**env, **HEAP_KEPT},
                        port,
                        body,
                    )
                )
                for server in servers[1:]:
                    assert server.wait_ready() == size, server.name
                for _ in range(args.rounds):
                    for server in servers:
                        server.run(max(1, args.n // args.rounds))
            finally:
                for server in servers:
                    server.stop()
            ms = {s.name: s.cpu / s.requests * 1000 for s in servers}
            cells = ", ".join(f"{s.name} {ms[s.name]:.2f} ({s.faults / s.requests:.0f})" for s in servers)
            print(
                f"{images} repeated 720p image(s): request {len(body) / 1e6:.2f} MB, response {size / 1e6:.2f} MB; "
                f"server CPU ms/req (minor page faults/req): {cells}; ours/floor "
                f"{ms['ours'] / ms['uvicorn floor']:.2f}x, ours/floor with heap kept "
                f"{ms['ours'] / ms['uvicorn floor, heap kept']:.2f}x, ours/raw socket {ms['ours'] / ms['raw socket']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
