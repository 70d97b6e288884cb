#!/usr/bin/env python3
"""The image cache's read path in a Redis Cluster: CPU per MGET of large entries through our
per-node fast reader (`imagecache.ClusterReader`: split per slot, one RESP2 `FastReader` per node,
values received straight into their buffers) against redis-py's `RedisCluster.mget_nonatomic`
(split per slot, pipelined per node, redis-py's asyncio parser), side by side in one process.

    python3 -m benchmarks.redis_cluster_bench [--keys 4] [--mb 7.2] [--n 20] [--rounds 5]

A 3-master cluster (redis-server, `redis-cli --cluster create`) on loopback holds `--keys` entries
of `--mb` MB each (the size of a 1280x720 image with tensors), spread over the nodes by their
slots. Each round times `--n` MGETs of all of them with one client, then `--n` with the other
(alternating, so drift on a shared machine hits both); CPU is this process's (both clients run
on its event loop), the figure is the median over rounds. The values are checked equal first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from render_service.multimodal import imagecache
from render_service.redis_target import RedisTarget
from tests.redis_topologies import redis_cluster


async def measure(url: str, keys: int, size: int, n: int, rounds: int) -> dict[str, list[float]]:
    import redis.asyncio as redis

    target = RedisTarget(url=url, cluster=True)
    seed = redis.RedisCluster.from_url(url)
    names = [f"rs:mm:bench:t:{index:064x}" for index in range(keys)]
    for index, name in enumerate(names):
        await seed.set(name, os.urandom(size // 2).hex().encode()[:size] + bytes([index]))
    owners = {(await seed.cluster_keyslot(name)) for name in names}
    print(f"{keys} keys of {size / 1e6:.1f} MB in {len(owners)} slots")

    slots = imagecache.SlotMap(target, 1.0)
    fast = imagecache.ClusterReader(target, slots)
    ours = [bytes(v) for v in await fast.mget(names, 1.0) if v is not None]
    theirs = await seed.mget_nonatomic(names)
    assert ours == theirs and len(ours) == keys

    async def ours_once() -> None:
        await fast.mget(names, 1.0)

    async def theirs_once() -> None:
        await seed.mget_nonatomic(names)

    results: dict[str, list[float]] = {"fast per-node reader": [], "redis-py mget_nonatomic": []}
    for _ in range(rounds):
        for label, once in (("fast per-node reader", ours_once), ("redis-py mget_nonatomic", theirs_once)):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(n):
                await once()
            results[label].append((time.process_time() - cpu) / n * 1000)
            results[label + " (wall)"] = [*results.get(label + " (wall)", []), (time.perf_counter() - wall) / n * 1000]
    fast.close()
    await slots.aclose()
    await seed.aclose()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--mb", type=float, default=7.2)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, redis_cluster(Path(folder)) as cluster:
        results = asyncio.run(measure(cluster.seed_url, args.keys, int(args.mb * 1e6), args.n, args.rounds))
    medians = {label: statistics.median(values) for label, values in results.items()}
    for label, value in medians.items():
        print(f"{label:36s} {value:8.2f} ms per MGET of {args.keys}")
    ratio = medians["redis-py mget_nonatomic"] / medians["fast per-node reader"]
    print(f"CPU: redis-py / fast reader = {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
