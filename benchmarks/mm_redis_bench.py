#!/usr/bin/env python3
"""The Redis tier of the processed-image cache (`--mm-cache-redis`): server CPU per chat render of a
repeated 1x and 4x 1280x720 JPEG on a replica whose local cache is cold but Redis is warm, side by
side with the same replica processing the images and with a local cache hit.

    python3 -m benchmarks.mm_redis_bench [--n 20] [--rounds 5] [--json out.json]

Each case starts, for each `mm_payload` (tensors, none), two replicas of `render-service serve`
(one worker each, PYTHONPATH = this checkout) on the Qwen3-VL example folder, and one redis-server:

- "redis hit": `--mm-cache-redis`; its local cache (`--mm-cache-bytes`) holds exactly one request's
  images, and requests alternate between two image sets (same pixels, other JPEG bytes: other
  mm_hashes), so every request misses locally and every image comes from Redis (checked in /metrics:
  Redis hits, no local processing);
- "processing": the other replica, flag off, same cache size and alternation: every image is
  decoded and processed;
- "local hit": one image set re-sent, on both replicas (flag on: the digests are computed in the
  async step and handed to the render; flag off: today's path);
- "new": images never seen (unique JPEG bytes per request) on both: what the flag adds to a miss
  (the Redis GET that finds nothing, then signing and writing the processed image).

Before timing, the Redis-hit response must be byte-identical to the processing replica's. CPU is
utime+stime of each server's process tree (/proc) over a round of N sequential requests, median of
alternating rounds; the redis-server's CPU per request is reported too (it serves the megabytes;
it runs with --maxmemory 1gb, allkeys-lru, so the "new" rounds stay bounded).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import Server, format_table, free_port, stop_process_tree, tree_cpu_seconds, wait_healthy
from benchmarks.mm_bench import fill, jpeg_template
from render_service.multimodal import qwen3_vl as multimodal
from tests.parity.mm_corpus import MM_MAX_MODEL_LEN, MM_MODEL_NAME, build_mm_model

ROOT = Path(__file__).resolve().parents[1]
# The model folder the servers load (set in main).
MODEL_DIR = ""
RENDER_PATH = "/v1/chat/completions/render"
HEADERS = {"Content-Type": "application/json", "X-Request-Id": "bench"}


def body(urls: list[str], payload: str) -> bytes:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    request: dict[str, Any] = {
        "model": MM_MODEL_NAME,
        "mm_payload": payload,
        "messages": [{"role": "user", "content": [*content, {"type": "text", "text": "?"}]}],
    }
    return json.dumps(request).encode()


def item_bytes(url: str, payload: str) -> int:
    """The local-cache size of one processed image sent as a data: URL (what --mm-cache-bytes is
    counted in: the item and the URL text its memo keeps)."""
    from functools import partial

    from render_service.multimodal import media

    config = multimodal.VisionConfig.load(Path(MODEL_DIR), MODEL_DIR)
    processor = multimodal.ImageProcessor(config)
    processor.from_data_url(
        url, partial(media.decode_data_url, limits=media.MediaLimits()), tensors=payload == "tensors"
    )
    return processor.cache.bytes


def start_redis(log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            "1gb",
            "--maxmemory-policy",
            "allkeys-lru",
        ],
        stdout=(log_dir / "redis.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    import redis

    while True:
        try:
            if redis.Redis(port=port).ping():
                return process, f"redis://127.0.0.1:{port}/0"
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_ours(name: str, log_dir: Path, *flags: str) -> Server:
    port = free_port()
    log = log_dir / f"{name}.log"
    command = [
        sys.executable,
        "-m",
        "render_service.cli",
        "serve",
        MODEL_DIR,
        "--port",
        str(port),
        "--served-model-name",
        MM_MODEL_NAME,
        "--max-model-len",
        str(MM_MAX_MODEL_LEN),
        "--workers",
        "1",
        "--snapshot-key",
        "bench",
        *flags,
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=str(ROOT),
        )
    server = Server(
        name,
        f"http://127.0.0.1:{port}",
        process.pid,
        owned=True,
        log=log,
        info={"command": f"PYTHONPATH={ROOT} " + " ".join(command)},
    )
    try:
        wait_healthy(server.url, 180, process.pid, log)
    except BaseException:
        server.stop()
        raise
    return server


def counters(server: Server) -> dict[str, float]:
    from tests.helpers import metric

    text = httpx.get(server.url + "/metrics").text
    return {name: metric(text, f"render_mm_cache_{name}_total") for name in ("misses", "redis_hits", "redis_misses")}


def measure(client: httpx.Client, server: Server, bodies: list[bytes], redis_pid: int) -> tuple[float, float]:
    start, start_redis = tree_cpu_seconds(server.pid), tree_cpu_seconds(redis_pid)
    for data in bodies:
        response = client.post(server.url + RENDER_PATH, content=data)
        assert response.status_code == 200, response.text[:300]
    n = len(bodies)
    return ((tree_cpu_seconds(server.pid) - start) / n * 1000, (tree_cpu_seconds(redis_pid) - start_redis) / n * 1000)


def run_case(images: int, payload: str, n: int, rounds: int, tmp: Path, templates: list[str]) -> dict[str, Any]:
    sets = [[fill(t, k * 10 + i) for i, t in enumerate(templates[:images])] for k in (1, 2)]
    per_item = item_bytes(sets[0][0], payload)
    cache = str(images * per_item + per_item // 2)  # one request's images, not two
    redis_process, redis_url = start_redis(tmp)
    servers: list[Server] = []
    try:
        tier = start_ours(
            f"redis-{images}-{payload}", tmp, "--mm-cache-bytes", cache, "--redis-url", redis_url, "--mm-cache-redis"
        )
        servers.append(tier)
        plain = start_ours(f"plain-{images}-{payload}", tmp, "--mm-cache-bytes", cache)
        servers.append(plain)
        alternating = [body(sets[i % 2], payload) for i in range(n)]
        repeated = [body(sets[0], payload)] * n
        counter = iter(range(10**6, 10**7))

        def new_bodies() -> list[bytes]:  # never seen: local miss, Redis miss, processed, stored
            return [body([fill(t, next(counter)) for t in templates[:images]], payload) for _ in range(n)]

        with httpx.Client(timeout=600, headers=HEADERS) as client:
            for data in (body(sets[0], payload), body(sets[1], payload)):  # the first turns: into Redis
                client.post(tier.url + RENDER_PATH, content=data)
            time.sleep(0.5)  # write-behind
            check = [client.post(s.url + RENDER_PATH, content=alternating[0]).content for s in (tier, plain)]
            if check[0] != check[1]:
                raise SystemExit(f"{images}x {payload}: the Redis-hit response differs from the processed one")
            before = counters(tier)
            results: dict[str, list[tuple[float, float]]] = {
                "redis hit": [],
                "processing": [],
                "local hit (flag on)": [],
                "local hit (flag off)": [],
                "new (flag on)": [],
                "new (flag off)": [],
            }
            for _ in range(rounds):
                results["redis hit"].append(measure(client, tier, alternating, redis_process.pid))
                results["processing"].append(measure(client, plain, alternating, redis_process.pid))
                client.post(tier.url + RENDER_PATH, content=repeated[0])
                client.post(plain.url + RENDER_PATH, content=repeated[0])
                results["local hit (flag on)"].append(measure(client, tier, repeated, redis_process.pid))
                results["local hit (flag off)"].append(measure(client, plain, repeated, redis_process.pid))
            moved = {k: v - before[k] for k, v in counters(tier).items()}
            for _ in range(rounds):  # after the counters: these are Redis misses by design
                results["new (flag on)"].append(measure(client, tier, new_bodies(), redis_process.pid))
                results["new (flag off)"].append(measure(client, plain, new_bodies(), redis_process.pid))
            # every alternating request: all images from Redis, none processed locally
            expected_hits = rounds * n * images
            if moved["redis_hits"] != expected_hits or moved["misses"] != 0:
                raise SystemExit(
                    f"{images}x {payload}: expected {expected_hits} Redis hits and no local processing, got {moved}"
                )
        return {
            "medians": {
                k: (statistics.median(c for c, _ in v), statistics.median(r for _, r in v)) for k, v in results.items()
            },
            "cache_bytes": int(cache),
            "item_bytes": per_item,
            "counters": moved,
            "commands": [s.info["command"] for s in servers],
        }
    finally:
        for server in servers:
            stop_process_tree(server.pid)
        redis_process.kill()
        redis_process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is needed")
    tmp = Path(tempfile.mkdtemp(prefix="mm_redis_bench."))
    global MODEL_DIR
    MODEL_DIR = str(build_mm_model(tmp))
    templates = [jpeg_template(seed) for seed in range(101, 105)]
    out: dict[str, Any] = {}
    rows = []
    try:
        for payload in ("tensors", "none"):
            for images in (1, 4):
                name = f"{images}x720p repeated, {payload}"
                print(f"{name} ...", flush=True)
                case = run_case(images, payload, args.n, args.rounds, tmp, templates)
                out[name] = case
                m = case["medians"]
                hit, proc = m["redis hit"][0], m["processing"][0]
                on, off = m["local hit (flag on)"][0], m["local hit (flag off)"][0]
                new_on, new_off = m["new (flag on)"][0], m["new (flag off)"][0]
                rows.append(
                    [
                        name,
                        f"{hit:.1f}",
                        f"{m['redis hit'][1]:.1f}",
                        f"{proc:.1f}",
                        f"{proc / max(hit, 1e-9):.1f}x",
                        f"{on:.1f}",
                        f"{off:.1f}",
                        f"{hit / max(off, 1e-9):.1f}x",
                        f"{new_on:.1f} / {new_off:.1f} (+{m['new (flag on)'][1]:.1f})",
                    ]
                )
        print(f"\nServer CPU ms per request, median of {args.rounds} alternating rounds of {args.n}:")
        print(
            format_table(
                [
                    "scenario",
                    "Redis hit",
                    "+ redis-server",
                    "processing",
                    "processing/Redis hit",
                    "local hit, flag on",
                    "local hit, flag off",
                    "Redis hit/local hit",
                    "new image: flag on / off (+ redis-server)",
                ],
                rows,
            )
        )
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
