#!/usr/bin/env python3
"""The HTTP transfer floor of an image render: what any server pays to receive the request and send
vLLM's response bytes, against this service on the same repeated-image requests.

    python3 benchmarks/mm_transfer_floor.py [--model /tmp/render-service-mm-tinyvl] [--n 40]

A repeated image is a cache hit (a hash and a copy), but the response still carries vLLM's
`kwargs_data`: ~7.2 MB of base64 per 720p image. The floor is a bare uvicorn + Starlette app (same
loop and HTTP settings as ours) that reads the request body and answers pre-built bytes of the same
size as our response: no parsing, no render. Server CPU (schedstat, whole process) per request,
sequential, one keep-alive client.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import free_port
from mm_bench import Payloads

FLOOR_APP = '''
import os
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

BODY = b"x" * int(os.environ["FLOOR_BYTES"])


async def render(request):
    await request.body()
    return Response(BODY, media_type="application/json")


app = Starlette(routes=[Route("/v1/chat/completions/render", render, methods=["POST"])])
'''
PATH = "/v1/chat/completions/render"
HEADERS = {"content-type": "application/json"}


def process_cpu_seconds(pid: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total / 1e9


def measure(command: list[str], env: dict[str, str], port: int, body: bytes, n: int) -> tuple[float, int]:
    """(server CPU ms per request, response bytes)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}{PATH}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.post(url, content=body, headers=HEADERS, timeout=60)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"server did not start: {command}") from None
                time.sleep(0.2)
        with httpx.Client(timeout=60) as client:
            for _ in range(5):
                client.post(url, content=body, headers=HEADERS)
            start = process_cpu_seconds(proc.pid)
            size = 0
            for _ in range(n):
                size = len(client.post(url, content=body, headers=HEADERS).content)
            return (process_cpu_seconds(proc.pid) - start) / n * 1000, size
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/tmp/render-service-mm-tinyvl", help="a qwen3-vl example model folder")
    parser.add_argument("--n", type=int, default=40, help="timed requests per server and size")
    args = parser.parse_args()
    if not Path(args.model, "preprocessor_config.json").exists():
        from render_service.example_model import build_example_model

        build_example_model(args.model, "qwen3-vl")
    payloads = Payloads()
    with tempfile.TemporaryDirectory(prefix="transfer-floor-") as tmp:
        Path(tmp, "floor_app.py").write_text(FLOOR_APP)
        for images in (1, 4):
            body = payloads.repeated(images)
            port = free_port()
            ours, size = measure([sys.executable, "-m", "render_service.cli", "serve", args.model,
                                  "--served-model-name", "tinyvl", "--max-model-len", "16384", "--workers", "1",
                                  "--port", str(port), "--log-level", "warning"], dict(os.environ), port, body, args.n)
            port = free_port()
            floor, _ = measure([sys.executable, "-m", "uvicorn", "floor_app:app", "--app-dir", tmp, "--port", str(port),
                                "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"],
                               dict(os.environ, FLOOR_BYTES=str(size)), port, body, args.n)
            print(f"{images} repeated 720p image(s): request {len(body) / 1e6:.2f} MB, response {size / 1e6:.2f} MB; "
                  f"server CPU ms/req: ours {ours:.2f}, transfer floor {floor:.2f} (ours/floor {ours / floor:.2f}x)",
                  flush=True)


if __name__ == "__main__":
    main()
